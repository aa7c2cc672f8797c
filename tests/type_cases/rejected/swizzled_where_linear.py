"""Swizzled block scales where the row-major layout is required."""

import torch

from moe_core import LinearBlockScales, Nvfp4Tensor, QuantizeGlobalScale


def build(packed: torch.Tensor, scales: LinearBlockScales, scale: QuantizeGlobalScale) -> Nvfp4Tensor:
    return Nvfp4Tensor(packed, scales.swizzle(), scale)  # expect: [arg-type] Argument 2 to "Nvfp4Tensor" has incompatible type "SwizzledBlockScales"; expected "LinearBlockScales"
