"""Forcing a backend whose quant info the scheme cannot build: the dense reference under an NVFP4 scheme."""

from moe_core import DENSE, MoeRunnerConfig
from moe_core.backends.reference import REFERENCE_DENSE
from moe_core.schemes.compressed_tensors_w4a4_nvfp4 import CompressedTensorsW4A4Nvfp4MoE


def layer(config: MoeRunnerConfig) -> CompressedTensorsW4A4Nvfp4MoE:
    return CompressedTensorsW4A4Nvfp4MoE(config, backend=REFERENCE_DENSE.route(DENSE))  # expect: [arg-type] Argument 1 to "route" of "BackendKey" has incompatible type "WeightFormat[DenseMoeWeights]"; expected "WeightFormat[Nvfp4MoeWeights]"
