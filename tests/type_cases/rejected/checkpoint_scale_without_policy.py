"""Checkpoint scales entering without naming what happens to several values."""

import torch

from moe_core import QuantizeGlobalScale


def input_scale(input_global_scale: torch.Tensor) -> QuantizeGlobalScale:
    return QuantizeGlobalScale.from_checkpoint(input_global_scale, num_experts=8)  # expect: [call-arg] Missing named argument "policy" for "from_checkpoint" of "QuantizeGlobalScale"
