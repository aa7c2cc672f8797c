"""The W4A4 canonical weights handed to the Triton W4A16 runner: a different computation, so a different type."""

import torch

from moe_core import MoeRunnerConfig, Nvfp4MoeWeights, StandardDispatchOutput, create_runner
from moe_core.backends.triton import TRITON_NVFP4_W4A16


def forward(config: MoeRunnerConfig, dispatch: StandardDispatchOutput, weights: Nvfp4MoeWeights) -> torch.Tensor:
    runner = create_runner(TRITON_NVFP4_W4A16, config)
    return runner.run(dispatch, weights)  # expect: [arg-type] Argument 2 to "run" of "Runner" has incompatible type "Nvfp4MoeWeights"; expected "TritonNvfp4W4A16Weights"
