"""``create_runner`` infers the runner's quant info type from the key."""

import torch
from typing_extensions import assert_type

from moe_core.backends.reference import REFERENCE_DENSE, REFERENCE_NVFP4
from moe_core import (
    BoundRunner,
    DenseMoeWeights,
    DispatchOutput,
    MoeRunnerConfig,
    Nvfp4MoeWeights,
    Runner,
    create_runner,
)


def forward(config: MoeRunnerConfig, dispatch: DispatchOutput, weights: Nvfp4MoeWeights) -> torch.Tensor:
    runner = create_runner(REFERENCE_NVFP4, config)
    assert_type(runner, Runner[Nvfp4MoeWeights])
    dense_runner = create_runner(REFERENCE_DENSE, config)
    assert_type(dense_runner, Runner[DenseMoeWeights])
    bound = REFERENCE_NVFP4.bind_nvfp4(config, weights)
    assert_type(bound, BoundRunner[Nvfp4MoeWeights] | None)
    return runner.run(dispatch, weights) + dense_runner.run(dispatch, weights.dequantize())
