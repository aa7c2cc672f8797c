"""FP8 scales built positionally from a raw tensor: no positional spelling reaches a scale's tensor."""

import torch

from moe_core import ExpertFp8Scales, Fp8BlockScales, Fp8ChannelScales, Fp8TensorScale


def build(t: torch.Tensor) -> None:
    Fp8TensorScale(t)  # expect: [call-arg] Too many arguments for "Fp8TensorScale"
    ExpertFp8Scales(t)  # expect: [call-arg] Too many arguments for "ExpertFp8Scales"
    Fp8ChannelScales(t)  # expect: [call-arg] Too many arguments for "Fp8ChannelScales"
    Fp8BlockScales(t)  # expect: [call-arg] Too many arguments for "Fp8BlockScales"
