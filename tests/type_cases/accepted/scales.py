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


def input_scale_from_checkpoint(input_global_scale: torch.Tensor, num_experts: int) -> QuantizeGlobalScale:
    """compressed-tensors: every expert's quantize-side input scale, collapsed under a named policy."""
    return QuantizeGlobalScale.from_checkpoint(
        input_global_scale, num_experts=num_experts, policy=ExpertScalePolicy.CONSERVATIVE
    )


def weight_scales_from_modelopt(weight_scale_2: torch.Tensor) -> ExpertQuantizeGlobalScales:
    """ModelOpt: dequantize-side per-expert scales converted explicitly."""
    return ExpertQuantizeGlobalScales.from_dequantize(ExpertDequantizeGlobalScales.from_checkpoint(weight_scale_2))


def collapse(per_expert: ExpertQuantizeGlobalScales) -> QuantizeGlobalScale:
    """Per-expert scales become the kernel's scalar only under a named policy."""
    return QuantizeGlobalScale.from_experts(per_expert, policy=ExpertScalePolicy.REQUIRE_EQUAL)


def conversions(scale: QuantizeGlobalScale, scales: LinearBlockScales) -> None:
    assert_type(DequantizeGlobalScale.from_quantize(scale), DequantizeGlobalScale)
    assert_type(QuantizeGlobalScale.from_amax(3.5), QuantizeGlobalScale)
    assert_type(scales.swizzle(), SwizzledBlockScales)
    assert_type(scales.swizzle().unswizzle(), LinearBlockScales)
    assert_type(scale.to("cpu"), QuantizeGlobalScale)
