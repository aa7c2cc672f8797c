"""The per-channel FP8 format's reference: both GEMM inputs quantized per token at run time (dynamic scales), times
the dequantized per-channel FP8 weights."""

from __future__ import annotations

from typing import final

import attrs
import torch

from moe_core.formats.fp8_channel.weights import Fp8ChannelMoeWeights
from moe_core.fp8 import fake_quantize_fp8_per_token


@final
@attrs.frozen
class Fp8ChannelRecipe:
    """Per-channel FP8 weights, per-token FP8 activations, float32 accumulation."""

    def gate_up(self, weights: Fp8ChannelMoeWeights, expert: int) -> torch.Tensor:
        """``w13[expert]`` dequantized, each row with its scale."""
        return weights.w13.dequantize_expert(expert)

    def down(self, weights: Fp8ChannelMoeWeights, expert: int) -> torch.Tensor:
        """``w2[expert]`` dequantized."""
        return weights.w2.dequantize_expert(expert)

    def quantize_input(self, weights: Fp8ChannelMoeWeights, expert: int, x: torch.Tensor) -> torch.Tensor:
        """Each row through an FP8 round trip with its own amax."""
        return fake_quantize_fp8_per_token(x)

    def quantize_hidden(self, weights: Fp8ChannelMoeWeights, expert: int, h: torch.Tensor) -> torch.Tensor:
        """Each row through an FP8 round trip with its own amax."""
        return fake_quantize_fp8_per_token(h)
