"""Raw hidden states where a dispatch output (tokens and routing) belongs."""

import torch

from moe_core.backends.reference import REFERENCE_NVFP4
from moe_core import MoeRunnerConfig, Nvfp4MoeWeights, create_runner


def forward(config: MoeRunnerConfig, hidden: torch.Tensor, weights: Nvfp4MoeWeights) -> torch.Tensor:
    return create_runner(REFERENCE_NVFP4, config).run(hidden, weights)  # expect: [arg-type] Argument 1 to "run" of "Runner" has incompatible type "Tensor"; expected "DispatchOutput"
