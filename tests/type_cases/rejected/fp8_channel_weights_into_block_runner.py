"""Per-channel FP8 quant info handed to the block-scaled FP8 runner: same codes dtype, other scales, other type."""

import torch

from moe_core import MoeRunnerConfig, StandardDispatchOutput, create_runner
from moe_core.backends.triton import TRITON_FP8_BLOCK
from moe_core.backends.triton.quant_info import TritonFp8Weights


def forward(config: MoeRunnerConfig, dispatch: StandardDispatchOutput, weights: TritonFp8Weights) -> torch.Tensor:
    return create_runner(TRITON_FP8_BLOCK, config).run(dispatch, weights)  # expect: [arg-type] Argument 2 to "run" of "Runner" has incompatible type "TritonFp8Weights"; expected "TritonFp8BlockWeights"
