"""Calling a runner by parameter names, which a backend is free to rename."""

import torch

from moe_core import DispatchOutput, MoeRunnerConfig, Nvfp4MoeWeights, create_runner
from moe_core.backends.reference import REFERENCE_NVFP4


def forward(config: MoeRunnerConfig, dispatch: DispatchOutput, weights: Nvfp4MoeWeights) -> torch.Tensor:
    return create_runner(REFERENCE_NVFP4, config).run(dispatch, quant_info=weights)  # expect: [call-arg] Unexpected keyword argument "quant_info" for "run" of "Runner"
