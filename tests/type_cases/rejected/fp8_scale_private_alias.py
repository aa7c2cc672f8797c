"""FP8 scales built through attrs' private alias (``_value=``), which once passed mypy and every run-time check."""

import torch

from moe_core import ExpertFp8Scales, Fp8BlockScales, Fp8ChannelScales, Fp8TensorScale


def build(t: torch.Tensor) -> None:
    Fp8TensorScale(_value=t)  # expect: [call-arg] Unexpected keyword argument "_value" for "Fp8TensorScale"
    ExpertFp8Scales(_value=t)  # expect: [call-arg] Unexpected keyword argument "_value" for "ExpertFp8Scales"
    Fp8ChannelScales(_value=t)  # expect: [call-arg] Unexpected keyword argument "_value" for "Fp8ChannelScales"
    Fp8BlockScales(_value=t)  # expect: [call-arg] Unexpected keyword argument "_value" for "Fp8BlockScales"
