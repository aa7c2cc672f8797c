"""NVFP4 global scales built from a raw tensor by the field's name: the field is not an ``__init__`` argument."""

import torch

from moe_core import DequantizeGlobalScale, ExpertDequantizeGlobalScales, ExpertQuantizeGlobalScales, QuantizeGlobalScale


def build(t: torch.Tensor) -> None:
    QuantizeGlobalScale(value=t)  # expect: [call-arg] Unexpected keyword argument "value" for "QuantizeGlobalScale"
    DequantizeGlobalScale(value=t)  # expect: [call-arg] Unexpected keyword argument "value" for "DequantizeGlobalScale"
    ExpertQuantizeGlobalScales(value=t)  # expect: [call-arg] Unexpected keyword argument "value" for "ExpertQuantizeGlobalScales"
    ExpertDequantizeGlobalScales(value=t)  # expect: [call-arg] Unexpected keyword argument "value" for "ExpertDequantizeGlobalScales"
