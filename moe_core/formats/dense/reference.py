"""The dense format's reference: its weights upcast to float32, activations as they are, biases added."""

from __future__ import annotations

from typing import final

import attrs
import torch

from moe_core.formats.dense.weights import DenseMoeWeights


@final
@attrs.frozen
class DenseRecipe:
    """Unquantized experts in float32."""

    def gate_up(self, weights: DenseMoeWeights, expert: int) -> torch.Tensor:
        """``w13[expert]`` in float32."""
        return weights.w13[expert].to(torch.float32)

    def down(self, weights: DenseMoeWeights, expert: int) -> torch.Tensor:
        """``w2[expert]`` in float32."""
        return weights.w2[expert].to(torch.float32)

    def quantize_input(self, weights: DenseMoeWeights, expert: int, x: torch.Tensor) -> torch.Tensor:
        """Not quantized."""
        return x

    def quantize_hidden(self, weights: DenseMoeWeights, expert: int, h: torch.Tensor) -> torch.Tensor:
        """Not quantized."""
        return h

    def biases(self, weights: DenseMoeWeights, expert: int) -> tuple[torch.Tensor, torch.Tensor] | None:
        """The expert's ``w13`` and ``w2`` biases in float32, or None for weights without."""
        if weights.biases is None:
            return None
        return weights.biases.w13[expert].to(torch.float32), weights.biases.w2[expert].to(torch.float32)
