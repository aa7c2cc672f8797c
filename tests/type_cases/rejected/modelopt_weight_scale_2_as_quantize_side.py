"""ModelOpt's dequantize-side ``weight_scale_2`` where NVFP4 weights take quantize-side global scales."""

import torch

from moe_core import ExpertDequantizeGlobalScales, LinearBlockScales, Nvfp4ExpertWeights


def experts(weight: torch.Tensor, weight_scale: torch.Tensor, weight_scale_2: torch.Tensor) -> Nvfp4ExpertWeights:
    scales = LinearBlockScales.from_checkpoint(weight_scale)
    return Nvfp4ExpertWeights(weight, scales, ExpertDequantizeGlobalScales.from_checkpoint(weight_scale_2))  # expect: [arg-type] Argument 3 to "Nvfp4ExpertWeights" has incompatible type "ExpertDequantizeGlobalScales"; expected "ExpertQuantizeGlobalScales"
