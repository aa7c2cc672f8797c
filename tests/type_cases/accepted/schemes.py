"""A scheme author's and an engine's view of the schemes: typed choices, typed weights."""

import torch
from typing_extensions import assert_type

from moe_core import DENSE, NVFP4, DenseMoeWeights, MoeRunnerConfig, Nvfp4MoeWeights
from moe_core.backends.reference import REFERENCE_DENSE, REFERENCE_NVFP4
from moe_core.backends.triton import TRITON_NVFP4_W4A16
from moe_core.checkpoint import MoeCheckpoint
from moe_core.formats import NVFP4_TO_W4A16
from moe_core.registry import DegradedRoute
from moe_core.scheme import MoeScheme
from moe_core.schemes.compressed_tensors_w4a4_nvfp4 import CompressedTensorsW4A4Nvfp4MoE
from moe_core.schemes.modelopt_nvfp4 import ModelOptNvfp4MoE
from moe_core.schemes.unquantized import UnquantizedMoE


def forced(config: MoeRunnerConfig) -> None:
    # any backend's route from the scheme's format, a named degradation's route, or a name checked at run time
    ct = CompressedTensorsW4A4Nvfp4MoE(config, backend=REFERENCE_NVFP4.route(NVFP4))
    w4a16 = DegradedRoute(NVFP4, NVFP4_TO_W4A16, TRITON_NVFP4_W4A16.route(NVFP4_TO_W4A16.target))
    modelopt = ModelOptNvfp4MoE(config, backend=w4a16, strict=False)
    dense = UnquantizedMoE(config, dtype=torch.float16, backend=REFERENCE_DENSE.route(DENSE))
    by_name = UnquantizedMoE(config, backend="triton-dense")
    assert_type(ct.weights, Nvfp4MoeWeights | None)
    assert_type(modelopt.weights, Nvfp4MoeWeights | None)
    assert_type(dense.weights, DenseMoeWeights | None)
    assert_type(by_name.weights, DenseMoeWeights | None)


def loaded(directory: str) -> MoeScheme:
    checkpoint = MoeCheckpoint(directory)
    layer = checkpoint.load_into(0, CompressedTensorsW4A4Nvfp4MoE(checkpoint.runner_config()))
    assert_type(layer, CompressedTensorsW4A4Nvfp4MoE)
    return checkpoint.load_layer(1, backend="triton-nvfp4-w4a16", strict=False)
