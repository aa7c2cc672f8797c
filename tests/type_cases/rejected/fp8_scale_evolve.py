"""FP8 scales given another raw tensor by ``attrs.evolve``, by the field's name or its private alias."""

import attrs
import torch

from moe_core import ExpertFp8Scales, Fp8BlockScales, Fp8ChannelScales, Fp8TensorScale


def rebuild(
    t: torch.Tensor,
    fp8_tensor_scale: Fp8TensorScale,
    expert_fp8_scales: ExpertFp8Scales,
    fp8_channel_scales: Fp8ChannelScales,
    fp8_block_scales: Fp8BlockScales,
) -> None:
    attrs.evolve(fp8_tensor_scale, value=t)  # expect: [call-arg] Unexpected keyword argument "value" for "evolve" of "Fp8TensorScale"
    attrs.evolve(fp8_tensor_scale, _value=t)  # expect: [call-arg] Unexpected keyword argument "_value" for "evolve" of "Fp8TensorScale"
    attrs.evolve(expert_fp8_scales, value=t)  # expect: [call-arg] Unexpected keyword argument "value" for "evolve" of "ExpertFp8Scales"
    attrs.evolve(expert_fp8_scales, _value=t)  # expect: [call-arg] Unexpected keyword argument "_value" for "evolve" of "ExpertFp8Scales"
    attrs.evolve(fp8_channel_scales, value=t)  # expect: [call-arg] Unexpected keyword argument "value" for "evolve" of "Fp8ChannelScales"
    attrs.evolve(fp8_channel_scales, _value=t)  # expect: [call-arg] Unexpected keyword argument "_value" for "evolve" of "Fp8ChannelScales"
    attrs.evolve(fp8_block_scales, value=t)  # expect: [call-arg] Unexpected keyword argument "value" for "evolve" of "Fp8BlockScales"
    attrs.evolve(fp8_block_scales, _value=t)  # expect: [call-arg] Unexpected keyword argument "_value" for "evolve" of "Fp8BlockScales"
