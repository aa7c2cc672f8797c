"""A backend key where a scheme takes a route: it would skip the format's conversion (and any degradation)."""

from moe_core import MoeRunnerConfig
from moe_core.backends.reference import REFERENCE_NVFP4
from moe_core.schemes.compressed_tensors_w4a4_nvfp4 import CompressedTensorsW4A4Nvfp4MoE


def forced(config: MoeRunnerConfig) -> CompressedTensorsW4A4Nvfp4MoE:
    return CompressedTensorsW4A4Nvfp4MoE(config, backend=REFERENCE_NVFP4)  # expect: [arg-type] Argument "backend" to "CompressedTensorsW4A4Nvfp4MoE" has incompatible type "BackendKey[Nvfp4MoeWeights]"
