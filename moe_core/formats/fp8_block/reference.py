"""The block-scaled FP8 format's reference: both GEMM inputs quantized per token and 128-column group, times the
dequantized 128x128-block FP8 weights."""

from __future__ import annotations

from typing import final

import attrs
import torch

from moe_core.formats.fp8_block.weights import Fp8BlockMoeWeights
from moe_core.fp8 import fake_quantize_fp8_per_group


@final
@attrs.frozen
class Fp8BlockRecipe:
    """Block-scaled FP8 weights, 1x128-group FP8 activations, float32 accumulation."""

    def gate_up(self, weights: Fp8BlockMoeWeights, expert: int) -> torch.Tensor:
        """``w13[expert]`` dequantized, each block with its scale."""
        return weights.w13.dequantize_expert(expert)

    def down(self, weights: Fp8BlockMoeWeights, expert: int) -> torch.Tensor:
        """``w2[expert]`` dequantized."""
        return weights.w2.dequantize_expert(expert)

    def quantize_input(self, weights: Fp8BlockMoeWeights, expert: int, x: torch.Tensor) -> torch.Tensor:
        """Each token's 128-column groups through an FP8 round trip with their own amax."""
        return fake_quantize_fp8_per_group(x)

    def quantize_hidden(self, weights: Fp8BlockMoeWeights, expert: int, h: torch.Tensor) -> torch.Tensor:
        """Each token's 128-column groups through an FP8 round trip with their own amax."""
        return fake_quantize_fp8_per_group(h)
