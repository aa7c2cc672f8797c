"""The NVFP4 W4A4 format's reference, the way the FP4 kernels compute: each GEMM's input quantized to NVFP4 with its
scalar global input scale (16-element E4M3 blocks), times the dequantized FP4 weights, the gate and up halves of w13
each with its own global scale. Activations are quantized by the kernels' recipe
(:func:`~moe_core.nvfp4.quantize_activation`: a run-time quantizer's oracle is the kernel, not compressed-tensors).
The gated activation is quantized from its float32 value; a kernel that writes it as bf16 first (FlashInfer's
CUTLASS MoE does) may round some of its codes the other way."""

from __future__ import annotations

from typing import final

import attrs
import torch

from moe_core.formats.nvfp4.weights import Nvfp4MoeWeights
from moe_core.formats.reference import require_static_range
from moe_core.global_scales import QuantizeGlobalScale
from moe_core.nvfp4 import quantize_activation


def fake_quantize_nvfp4(x: torch.Tensor, global_scale: QuantizeGlobalScale) -> torch.Tensor:
    """``x`` after the FP4 kernels' NVFP4 round trip with ``global_scale``, as float32."""
    return quantize_activation(x, global_scale).dequantize()


@final
@attrs.frozen
class Nvfp4Recipe:
    """NVFP4 W4A4: FP4 activations and weights, float32 accumulation."""

    def gate_up(self, weights: Nvfp4MoeWeights, expert: int) -> torch.Tensor:
        """The gate and up halves dequantized, each with its own global scale."""
        return weights.w13.dequantize_expert(expert)

    def down(self, weights: Nvfp4MoeWeights, expert: int) -> torch.Tensor:
        """``w2[expert]`` dequantized."""
        return weights.w2.dequantize_expert(expert)

    def quantize_input(self, weights: Nvfp4MoeWeights, expert: int, x: torch.Tensor) -> torch.Tensor:
        """An NVFP4 round trip with the first GEMM's input scale (refused where it clips most of ``x``)."""
        require_static_range("w13_input_scale", x, weights.w13_input_scale.covered_amax(), expert, "first GEMM")
        return fake_quantize_nvfp4(x, weights.w13_input_scale)

    def quantize_hidden(self, weights: Nvfp4MoeWeights, expert: int, h: torch.Tensor) -> torch.Tensor:
        """An NVFP4 round trip with the second GEMM's input scale (refused where it clips most of ``h``)."""
        require_static_range("w2_input_scale", h, weights.w2_input_scale.covered_amax(), expert, "second GEMM")
        return fake_quantize_nvfp4(h, weights.w2_input_scale)
