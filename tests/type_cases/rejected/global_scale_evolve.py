"""NVFP4 global scales given another raw tensor by ``attrs.evolve``, by the field's name or its private alias."""

import attrs
import torch

from moe_core import DequantizeGlobalScale, ExpertDequantizeGlobalScales, ExpertQuantizeGlobalScales, QuantizeGlobalScale


def rebuild(
    t: torch.Tensor,
    quantize_global_scale: QuantizeGlobalScale,
    dequantize_global_scale: DequantizeGlobalScale,
    expert_quantize_global_scales: ExpertQuantizeGlobalScales,
    expert_dequantize_global_scales: ExpertDequantizeGlobalScales,
) -> None:
    attrs.evolve(quantize_global_scale, value=t)  # expect: [call-arg] Unexpected keyword argument "value" for "evolve" of "QuantizeGlobalScale"
    attrs.evolve(quantize_global_scale, _value=t)  # expect: [call-arg] Unexpected keyword argument "_value" for "evolve" of "QuantizeGlobalScale"
    attrs.evolve(dequantize_global_scale, value=t)  # expect: [call-arg] Unexpected keyword argument "value" for "evolve" of "DequantizeGlobalScale"
    attrs.evolve(dequantize_global_scale, _value=t)  # expect: [call-arg] Unexpected keyword argument "_value" for "evolve" of "DequantizeGlobalScale"
    attrs.evolve(expert_quantize_global_scales, value=t)  # expect: [call-arg] Unexpected keyword argument "value" for "evolve" of "ExpertQuantizeGlobalScales"
    attrs.evolve(expert_quantize_global_scales, _value=t)  # expect: [call-arg] Unexpected keyword argument "_value" for "evolve" of "ExpertQuantizeGlobalScales"
    attrs.evolve(expert_dequantize_global_scales, value=t)  # expect: [call-arg] Unexpected keyword argument "value" for "evolve" of "ExpertDequantizeGlobalScales"
    attrs.evolve(expert_dequantize_global_scales, _value=t)  # expect: [call-arg] Unexpected keyword argument "_value" for "evolve" of "ExpertDequantizeGlobalScales"
