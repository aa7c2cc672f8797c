"""A backend whose NVFP4 conversion builds quant info its runner does not take."""

from moe_core import NVFP4, BackendKey, Conversion, DenseMoeWeights, Nvfp4MoeWeights, register_backend
from moe_core.backends.reference import ORACLE, REFERENCE_DENSE, reference_supports


def as_is(weights: Nvfp4MoeWeights) -> Nvfp4MoeWeights:
    return weights


KEY: BackendKey[DenseMoeWeights] = register_backend(
    "mismatched-nvfp4-conversion",
    description="conversion builds NVFP4 weights, runner takes dense",
    factory=REFERENCE_DENSE.factory,
    supports=reference_supports,
    priority=ORACLE,
    conversions=[Conversion(NVFP4, as_is)],  # expect: [arg-type] Argument 2 to "Conversion" has incompatible type "Callable[[Nvfp4MoeWeights], Nvfp4MoeWeights]"; expected "Callable[[Nvfp4MoeWeights], DenseMoeWeights]"
)
