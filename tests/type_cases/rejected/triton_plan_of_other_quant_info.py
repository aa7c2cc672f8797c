"""The Triton runner built on the dense plan, handed FP8 weights: the plan fixes the runner's quant info type."""

import torch

from moe_core import MoeRunnerConfig, StandardDispatchOutput
from moe_core.backends.triton.plans import DensePlan
from moe_core.backends.triton.quant_info import TritonFp8Weights
from moe_core.backends.triton.runner import TritonRunner


def forward(config: MoeRunnerConfig, dispatch: StandardDispatchOutput, weights: TritonFp8Weights) -> torch.Tensor:
    runner = TritonRunner(config, DensePlan())
    return runner.run(dispatch, weights)  # expect: [arg-type] Argument 2 to "run" of "TritonRunner" has incompatible type "TritonFp8Weights"; expected "TritonDenseWeights"
