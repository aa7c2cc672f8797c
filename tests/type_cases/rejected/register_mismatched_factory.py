"""A key declared for one quant info, registered with a runner of another."""

from moe_core.backends.reference import ORACLE, REFERENCE_NVFP4, reference_supports
from moe_core import BackendKey, DenseMoeWeights, register_backend

KEY: BackendKey[DenseMoeWeights] = register_backend(
    "mismatched",
    description="runner takes NVFP4, key claims dense",
    factory=REFERENCE_NVFP4.factory,  # expect: [arg-type] Argument "factory" to "register_backend" has incompatible type "Callable[[MoeRunnerConfig], Runner[Nvfp4MoeWeights]]"; expected "Callable[[MoeRunnerConfig], Runner[DenseMoeWeights]]"
    supports=reference_supports,
    priority=ORACLE,
)
