"""E8M0 scales built from a raw tensor, and NVFP4 W4A16 weights handed to the MXFP4 oracle: both W4A16 with FP4
codes, other scales, other types."""

import torch

from moe_core import E8M0Scales, MoeRunnerConfig, Nvfp4W4A16MoeWeights, StandardDispatchOutput, create_runner
from moe_core.backends.reference import REFERENCE_MXFP4


def build(t: torch.Tensor) -> None:
    E8M0Scales(t)  # expect: [call-arg] Too many arguments for "E8M0Scales"
    E8M0Scales(codes=t)  # expect: [call-arg] Unexpected keyword argument "codes" for "E8M0Scales"


def forward(config: MoeRunnerConfig, dispatch: StandardDispatchOutput, weights: Nvfp4W4A16MoeWeights) -> torch.Tensor:
    return create_runner(REFERENCE_MXFP4, config).run(dispatch, weights)  # expect: [arg-type] Argument 2 to "run" of "Runner" has incompatible type "Nvfp4W4A16MoeWeights"; expected "Mxfp4MoeWeights"
