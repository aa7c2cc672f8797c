"""The dense format's weights: unquantized fp32/bf16/fp16 experts."""

from __future__ import annotations

from typing import final

import attrs
import torch

from moe_core._checks import FLOAT_DTYPES, require_dtype, require_finite, require_ndim, require_same_device, require_tensor
from moe_core.formats._experts import TensorExperts, check_expert_shapes, shape3


@final
@attrs.frozen(eq=False, kw_only=True)
class DenseMoeWeights(TensorExperts):
    """Unquantized expert weights in fp32, bf16 or fp16, finite (checked where values exist)."""

    w13: torch.Tensor
    """``[E, 2 * I, H]``, gate rows then up rows."""
    w2: torch.Tensor
    """``[E, H, I]``."""

    def __attrs_post_init__(self) -> None:
        for name, tensor in (("DenseMoeWeights.w13", self.w13), ("DenseMoeWeights.w2", self.w2)):
            require_tensor(name, tensor)
            require_dtype(name, tensor, FLOAT_DTYPES)
            require_ndim(name, tensor, 3, "[num_experts, out_features, in_features]")
            require_finite(name, tensor)
        if self.w13.dtype != self.w2.dtype:
            raise TypeError(f"DenseMoeWeights.w2: expected dtype {self.w13.dtype} like w13, got {self.w2.dtype}")
        check_expert_shapes("DenseMoeWeights", shape3(self.w13), shape3(self.w2))
        require_same_device([("w13", self.w13), ("w2", self.w2)])
