"""A backend whose NVFP4 hook builds quant info its runner does not take."""

from moe_core.backends.reference import ReferenceDenseRunner, reference_availability
from moe_core import BackendKey, DenseMoeWeights, Nvfp4MoeWeights, register_backend


def as_is(weights: Nvfp4MoeWeights) -> Nvfp4MoeWeights:
    return weights


KEY: BackendKey[DenseMoeWeights] = register_backend(
    "mismatched-nvfp4-hook",
    description="hook builds NVFP4 weights, runner takes dense",
    factory=ReferenceDenseRunner,
    availability=reference_availability,
    from_nvfp4=as_is,  # expect: [arg-type] Argument "from_nvfp4" to "register_backend" has incompatible type "Callable[[Nvfp4MoeWeights], Nvfp4MoeWeights]"; expected "Callable[[Nvfp4MoeWeights], DenseMoeWeights] | None"
)
