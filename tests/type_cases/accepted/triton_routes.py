"""A scheme's NVFP4 choices with the Hopper fallback named on purpose: W4A4 routes and the W4A16 route share a type."""

import torch

from moe_core import NVFP4, NVFP4_W4A16, FormatRoute, MoeRunnerConfig, Nvfp4MoeWeights, select_backend
from moe_core.backends.reference import REFERENCE_NVFP4
from moe_core.backends.triton import TRITON_NVFP4_W4A16


def choose(config: MoeRunnerConfig, weights: Nvfp4MoeWeights, device: torch.device) -> str:
    routes: list[FormatRoute[Nvfp4MoeWeights]] = [REFERENCE_NVFP4.route(NVFP4), TRITON_NVFP4_W4A16.route(NVFP4_W4A16)]
    return select_backend(routes, device).chosen.name
