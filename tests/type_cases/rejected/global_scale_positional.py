"""NVFP4 global scales built positionally from a raw tensor: no positional spelling reaches a scale's tensor."""

import torch

from moe_core import DequantizeGlobalScale, ExpertDequantizeGlobalScales, ExpertQuantizeGlobalScales, QuantizeGlobalScale


def build(t: torch.Tensor) -> None:
    QuantizeGlobalScale(t)  # expect: [call-arg] Too many arguments for "QuantizeGlobalScale"
    DequantizeGlobalScale(t)  # expect: [call-arg] Too many arguments for "DequantizeGlobalScale"
    ExpertQuantizeGlobalScales(t)  # expect: [call-arg] Too many arguments for "ExpertQuantizeGlobalScales"
    ExpertDequantizeGlobalScales(t)  # expect: [call-arg] Too many arguments for "ExpertDequantizeGlobalScales"
