"""The SGLang bug spelled with the scale class: expert 0's input scale wrapped as the scalar for all."""

import torch

from moe_core import QuantizeGlobalScale


def input_scale(per_expert: torch.Tensor) -> QuantizeGlobalScale:
    return QuantizeGlobalScale(per_expert[:1])  # expect: [call-arg] Too many arguments for "QuantizeGlobalScale"
