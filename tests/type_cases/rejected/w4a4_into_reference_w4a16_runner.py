"""W4A4 weights handed to the W4A16 reference: a different computation (activations not quantized), so a different
type; only the named degradation step turns one into the other."""

import torch

from moe_core import MoeRunnerConfig, Nvfp4MoeWeights, StandardDispatchOutput, create_runner
from moe_core.backends.reference import REFERENCE_NVFP4_W4A16


def forward(config: MoeRunnerConfig, dispatch: StandardDispatchOutput, weights: Nvfp4MoeWeights) -> torch.Tensor:
    runner = create_runner(REFERENCE_NVFP4_W4A16, config)
    return runner.run(dispatch, weights)  # expect: [arg-type] Argument 2 to "run" of "Runner" has incompatible type "Nvfp4MoeWeights"; expected "Nvfp4W4A16MoeWeights"
