"""Another backend's quant info handed to a runner."""

import torch

from moe_core.backends.reference import REFERENCE_NVFP4
from moe_core import DenseMoeWeights, DispatchOutput, MoeRunnerConfig, create_runner


def forward(config: MoeRunnerConfig, dispatch: DispatchOutput, dense: DenseMoeWeights) -> torch.Tensor:
    runner = create_runner(REFERENCE_NVFP4, config)
    return runner.run(dispatch, dense)  # expect: [arg-type] Argument 2 to "run" of "Runner" has incompatible type "DenseMoeWeights"; expected "Nvfp4MoeWeights"
