"""A key declared for one quant info, registered with a runner of another."""

from moe_core.backends.reference import ORACLE, ReferenceNvfp4Runner, reference_supports
from moe_core import BackendKey, DenseMoeWeights, register_backend

KEY: BackendKey[DenseMoeWeights] = register_backend(
    "mismatched",
    description="runner takes NVFP4, key claims dense",
    factory=ReferenceNvfp4Runner,  # expect: [arg-type] Argument "factory" to "register_backend" has incompatible type "type[ReferenceNvfp4Runner]"; expected "Callable[[MoeRunnerConfig], Runner[DenseMoeWeights]]"
    supports=reference_supports,
    priority=ORACLE,
)
