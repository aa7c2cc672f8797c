"""The MXFP4 format's reference: dequantized weights (each 32-element block times its power of two), 16-bit
activations left unquantized (W4A16), the experts' biases added after each GEMM."""

from __future__ import annotations

from typing import final

import attrs
import torch

from moe_core.formats.mxfp4.weights import Mxfp4MoeWeights


@final
@attrs.frozen
class Mxfp4Recipe:
    """MXFP4 weights, float32 activations, biases where the weights carry them."""

    def gate_up(self, weights: Mxfp4MoeWeights, expert: int) -> torch.Tensor:
        """``w13[expert]`` dequantized (gate rows first)."""
        return weights.w13.dequantize_expert(expert)

    def down(self, weights: Mxfp4MoeWeights, expert: int) -> torch.Tensor:
        """``w2[expert]`` dequantized."""
        return weights.w2.dequantize_expert(expert)

    def quantize_input(self, weights: Mxfp4MoeWeights, expert: int, x: torch.Tensor) -> torch.Tensor:
        """Not quantized (W4A16)."""
        return x

    def quantize_hidden(self, weights: Mxfp4MoeWeights, expert: int, h: torch.Tensor) -> torch.Tensor:
        """Not quantized (W4A16)."""
        return h

    def biases(self, weights: Mxfp4MoeWeights, expert: int) -> tuple[torch.Tensor, torch.Tensor] | None:
        """The expert's ``w13`` and ``w2`` biases in float32, or None for weights without."""
        if weights.biases is None:
            return None
        return weights.biases.w13[expert].to(torch.float32), weights.biases.w2[expert].to(torch.float32)
