"""The per-expert NVFP4 W4A4 format's reference: the NVFP4 W4A4 reference, each local expert's GEMM inputs
quantized (by the kernels' recipe) with that expert's own input scale."""

from __future__ import annotations

from typing import final

import attrs
import torch

from moe_core.formats.nvfp4.reference import fake_quantize_nvfp4
from moe_core.formats.nvfp4_per_expert.weights import Nvfp4PerExpertMoeWeights
from moe_core.formats.reference import require_static_range


@final
@attrs.frozen
class Nvfp4PerExpertRecipe:
    """NVFP4 W4A4 with per-expert input scales: FP4 activations and weights, float32 accumulation."""

    def gate_up(self, weights: Nvfp4PerExpertMoeWeights, expert: int) -> torch.Tensor:
        """The gate and up halves dequantized, each with its own global scale."""
        return weights.w13.dequantize_expert(expert)

    def down(self, weights: Nvfp4PerExpertMoeWeights, expert: int) -> torch.Tensor:
        """``w2[expert]`` dequantized."""
        return weights.w2.dequantize_expert(expert)

    def quantize_input(self, weights: Nvfp4PerExpertMoeWeights, expert: int, x: torch.Tensor) -> torch.Tensor:
        """An NVFP4 round trip with this expert's first-GEMM input scale (refused where it clips most of ``x``)."""
        scale = weights.own_input_scales(expert)[0]
        require_static_range("w13_input_scales", x, scale.covered_amax(), expert, "first GEMM")
        return fake_quantize_nvfp4(x, scale)

    def quantize_hidden(self, weights: Nvfp4PerExpertMoeWeights, expert: int, h: torch.Tensor) -> torch.Tensor:
        """An NVFP4 round trip with this expert's second-GEMM input scale (refused where it clips most of ``h``)."""
        scale = weights.own_input_scales(expert)[1]
        require_static_range("w2_input_scales", h, scale.covered_amax(), expert, "second GEMM")
        return fake_quantize_nvfp4(h, scale)
