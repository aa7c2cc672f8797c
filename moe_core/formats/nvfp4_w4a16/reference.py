"""The NVFP4 W4A16 format's reference: dequantized weights (each half with its own global scale), 16-bit activations
left unquantized."""

from __future__ import annotations

from typing import final

import attrs
import torch

from moe_core.formats.nvfp4_w4a16.weights import Nvfp4W4A16MoeWeights


@final
@attrs.frozen
class Nvfp4W4A16Recipe:
    """NVFP4 weights, float32 activations."""

    def gate_up(self, weights: Nvfp4W4A16MoeWeights, expert: int) -> torch.Tensor:
        """The gate and up halves dequantized, each with its own global scale."""
        return weights.w13.dequantize_expert(expert)

    def down(self, weights: Nvfp4W4A16MoeWeights, expert: int) -> torch.Tensor:
        """``w2[expert]`` dequantized."""
        return weights.w2.dequantize_expert(expert)

    def quantize_input(self, weights: Nvfp4W4A16MoeWeights, expert: int, x: torch.Tensor) -> torch.Tensor:
        """Not quantized (W4A16)."""
        return x

    def quantize_hidden(self, weights: Nvfp4W4A16MoeWeights, expert: int, h: torch.Tensor) -> torch.Tensor:
        """Not quantized (W4A16)."""
        return h
