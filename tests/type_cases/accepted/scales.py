"""The explicit steps between scale conventions and shapes type-check."""

import torch
from typing_extensions import assert_type

from moe_core import (
    DequantizeGlobalScale,
    ExpertDequantizeGlobalScales,
    ExpertQuantizeGlobalScales,
    ExpertScalePolicy,
    LinearBlockScales,
    QuantizeGlobalScale,
    SwizzledBlockScales,
)


def input_scale_from_checkpoint(per_expert: torch.Tensor) -> QuantizeGlobalScale:
    """compressed-tensors: per-expert quantize-side scales collapsed conservatively."""
    scales = ExpertQuantizeGlobalScales(per_expert)
    return QuantizeGlobalScale.from_experts(scales, policy=ExpertScalePolicy.CONSERVATIVE)


def weight_scales_from_modelopt(weight_scale_2: torch.Tensor) -> ExpertQuantizeGlobalScales:
    """ModelOpt: dequantize-side per-expert scales converted explicitly."""
    return ExpertQuantizeGlobalScales.from_dequantize(ExpertDequantizeGlobalScales(weight_scale_2))


def conversions(scale: QuantizeGlobalScale, scales: LinearBlockScales) -> None:
    assert_type(DequantizeGlobalScale.from_quantize(scale), DequantizeGlobalScale)
    assert_type(scales.swizzle(), SwizzledBlockScales)
    assert_type(scales.swizzle().unswizzle(), LinearBlockScales)
    assert_type(scale.to("cpu"), QuantizeGlobalScale)
