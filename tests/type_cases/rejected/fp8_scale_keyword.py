"""FP8 scales built from a raw tensor by the field's name: the field is not an ``__init__`` argument."""

import torch

from moe_core import ExpertFp8Scales, Fp8BlockScales, Fp8ChannelScales, Fp8TensorScale


def build(t: torch.Tensor) -> None:
    Fp8TensorScale(value=t)  # expect: [call-arg] Unexpected keyword argument "value" for "Fp8TensorScale"
    ExpertFp8Scales(value=t)  # expect: [call-arg] Unexpected keyword argument "value" for "ExpertFp8Scales"
    Fp8ChannelScales(value=t)  # expect: [call-arg] Unexpected keyword argument "value" for "Fp8ChannelScales"
    Fp8BlockScales(value=t)  # expect: [call-arg] Unexpected keyword argument "value" for "Fp8BlockScales"
