"""The FP8 per-tensor W8A8 format's reference: each GEMM input through an FP8 round trip with its static per-tensor
scale, times the dequantized FP8 weights, the gate and up halves each with its own scale."""

from __future__ import annotations

from typing import final

import attrs
import torch

from moe_core.formats.fp8.weights import Fp8MoeWeights
from moe_core.formats.reference import require_static_range
from moe_core.fp8 import fake_quantize_fp8


@final
@attrs.frozen
class Fp8Recipe:
    """FP8 activations (static scales) and weights, float32 accumulation."""

    def gate_up(self, weights: Fp8MoeWeights, expert: int) -> torch.Tensor:
        """The gate and up halves dequantized, each with its own scale."""
        return weights.w13.dequantize_expert(expert)

    def down(self, weights: Fp8MoeWeights, expert: int) -> torch.Tensor:
        """``w2[expert]`` dequantized."""
        return weights.w2.dequantize_expert(expert)

    def quantize_input(self, weights: Fp8MoeWeights, expert: int, x: torch.Tensor) -> torch.Tensor:
        """An FP8 round trip with the first GEMM's static input scale (refused where it clips most of ``x``)."""
        require_static_range("w13_input_scale", x, weights.w13_input_scale.covered_amax(), expert, "first GEMM")
        return fake_quantize_fp8(x, weights.w13_input_scale)

    def quantize_hidden(self, weights: Fp8MoeWeights, expert: int, h: torch.Tensor) -> torch.Tensor:
        """An FP8 round trip with the second GEMM's static input scale (refused where it clips most of ``h``)."""
        require_static_range("w2_input_scale", h, weights.w2_input_scale.covered_amax(), expert, "second GEMM")
        return fake_quantize_fp8(h, weights.w2_input_scale)
