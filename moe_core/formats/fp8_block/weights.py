"""The block-scaled FP8 format's weights (DeepSeek-V3 / Qwen3 FP8: 128x128 weight blocks)."""

from __future__ import annotations

from typing import final

import attrs
import torch

from moe_core._checks import require_same_device
from moe_core.formats._experts import ExpertSizes, check_expert_shapes
from moe_core.formats.dense.weights import DenseMoeWeights
from moe_core.fp8 import FP8_BLOCK, Fp8BlockExpertWeights


def fp8_block_size_refusal(hidden: int, inter: int) -> str | None:
    """Why block-scaled FP8 cannot hold a layer of hidden size ``hidden`` and intermediate size ``inter`` (both must
    be multiples of 128), or ``None`` where it can."""
    if hidden % FP8_BLOCK or inter % FP8_BLOCK:
        return (
            f"Fp8BlockMoeWeights: expected hidden and intermediate sizes that are multiples of {FP8_BLOCK}, "
            f"got {hidden} and {inter}"
        )
    return None


@final
@attrs.frozen(eq=False, kw_only=True)
class Fp8BlockMoeWeights(ExpertSizes):
    """FP8 E4M3 expert weights with 128x128 block scales, for activations quantized per token and 128-column group.

    The DeepSeek-V3 / Qwen3 FP8 layout: ``w13 [E, 2I, H]`` (gate rows first)
    and ``w2 [E, H, I]``, one scale per 128x128 block; each GEMM input's
    groups of 128 columns are quantized with their own amax at run time.
    ``H`` and ``I`` must be multiples of 128, so no block straddles the gate
    and up halves and every input group meets one column of blocks.
    """

    w13: Fp8BlockExpertWeights
    w2: Fp8BlockExpertWeights

    def __attrs_post_init__(self) -> None:
        for name, weights in (("w13", self.w13), ("w2", self.w2)):
            if not isinstance(weights, Fp8BlockExpertWeights):
                raise TypeError(f"Fp8BlockMoeWeights.{name}: expected Fp8BlockExpertWeights, got {type(weights).__name__}")
        check_expert_shapes("Fp8BlockMoeWeights", self.w13.shape, self.w2.shape)
        _, hidden, inter = self.w2.shape
        refusal = fp8_block_size_refusal(hidden, inter)
        if refusal is not None:
            raise ValueError(refusal)
        require_same_device([("w13", self.w13.codes), ("w2", self.w2.codes)])

    @property
    def device(self) -> torch.device:
        """Where the weights live."""
        return self.w2.codes.device

    def dequantize(self, dtype: torch.dtype = torch.float32) -> DenseMoeWeights:
        """The dense weights the codes stand for."""
        return DenseMoeWeights(w13=self.w13.dequantize(dtype), w2=self.w2.dequantize(dtype))
