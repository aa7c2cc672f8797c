"""A scheme author's and an engine's view of the schemes: typed choices, typed weights."""

import torch
from typing_extensions import assert_type

from moe_core import NVFP4, DenseMoeWeights, MoeRunnerConfig, Nvfp4MoeWeights
from moe_core.backends.reference import REFERENCE_DENSE, REFERENCE_NVFP4
from moe_core.checkpoint import MoeCheckpoint
from moe_core.scheme import MoeScheme
from moe_core.schemes.compressed_tensors_w4a4_nvfp4 import CompressedTensorsW4A4Nvfp4MoE
from moe_core.schemes.modelopt_nvfp4 import ModelOptNvfp4MoE
from moe_core.schemes.unquantized import UnquantizedMoE


def forced(config: MoeRunnerConfig) -> None:
    # a key whose quant info is the canonical NVFP4 weights, or any backend's route from them
    ct = CompressedTensorsW4A4Nvfp4MoE(config, backend=REFERENCE_NVFP4)
    modelopt = ModelOptNvfp4MoE(config, backend=REFERENCE_NVFP4.route(NVFP4))
    dense = UnquantizedMoE(config, dtype=torch.float16, backend=REFERENCE_DENSE)
    assert_type(ct.weights, Nvfp4MoeWeights | None)
    assert_type(modelopt.weights, Nvfp4MoeWeights | None)
    assert_type(dense.weights, DenseMoeWeights | None)


def loaded(directory: str) -> MoeScheme:
    checkpoint = MoeCheckpoint(directory)
    layer = checkpoint.load_into(0, CompressedTensorsW4A4Nvfp4MoE(checkpoint.runner_config()))
    assert_type(layer, CompressedTensorsW4A4Nvfp4MoE)
    return checkpoint.load_layer(1)
