"""NVFP4 global scales built through attrs' private alias (``_value=``), which once passed mypy and every run-time check."""

import torch

from moe_core import DequantizeGlobalScale, ExpertDequantizeGlobalScales, ExpertQuantizeGlobalScales, QuantizeGlobalScale


def build(t: torch.Tensor) -> None:
    QuantizeGlobalScale(_value=t)  # expect: [call-arg] Unexpected keyword argument "_value" for "QuantizeGlobalScale"
    DequantizeGlobalScale(_value=t)  # expect: [call-arg] Unexpected keyword argument "_value" for "DequantizeGlobalScale"
    ExpertQuantizeGlobalScales(_value=t)  # expect: [call-arg] Unexpected keyword argument "_value" for "ExpertQuantizeGlobalScales"
    ExpertDequantizeGlobalScales(_value=t)  # expect: [call-arg] Unexpected keyword argument "_value" for "ExpertDequantizeGlobalScales"
