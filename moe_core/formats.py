"""The canonical weight formats moe-core ships: dense, NVFP4 (W4A4), NVFP4 weights with 16-bit activations, FP8 W8A8
per tensor, per channel and per 128x128 block."""

from __future__ import annotations

from moe_core.conversion import Degradation, WeightFormat
from moe_core.moe_weights import (
    DenseMoeWeights,
    Fp8BlockMoeWeights,
    Fp8ChannelMoeWeights,
    Fp8MoeWeights,
    Nvfp4MoeWeights,
    Nvfp4W4A16MoeWeights,
)

DENSE: WeightFormat[DenseMoeWeights] = WeightFormat(
    "dense", DenseMoeWeights, "unquantized fp32/bf16/fp16 expert weights"
)
"""Unquantized experts (:class:`DenseMoeWeights`)."""

NVFP4_W4A16: WeightFormat[Nvfp4W4A16MoeWeights] = WeightFormat(
    "nvfp4-w4a16", Nvfp4W4A16MoeWeights, "NVFP4 weights with bf16/fp16 activations (W4A16)"
)
"""NVFP4 weights run with unquantized activations (:class:`Nvfp4W4A16MoeWeights`).

A different computation from :data:`NVFP4` (W4A4), so a different format and
type: a backend that converts from it is checked against the dense layer of
the dequantized weights, and W4A4 weights reach it only through NVFP4's
declared degradation.
"""

NVFP4_TO_W4A16: Degradation[Nvfp4MoeWeights, Nvfp4W4A16MoeWeights] = Degradation(
    NVFP4_W4A16,
    "activations stay 16-bit (W4A16): no NVFP4 W4A4 kernel fits; input scales unused",
    Nvfp4MoeWeights.without_activation_quantization,
)
"""Where no W4A4 kernel fits (Hopper), W4A4 weights run on a W4A16 kernel: the same codes and scales."""

NVFP4: WeightFormat[Nvfp4MoeWeights] = WeightFormat(
    "nvfp4", Nvfp4MoeWeights, "NVFP4 W4A4 experts with static scalar input scales", (NVFP4_TO_W4A16,)
)
"""NVFP4 W4A4 experts (:class:`Nvfp4MoeWeights`), which degrade to :data:`NVFP4_W4A16` where no W4A4 kernel fits."""

FP8: WeightFormat[Fp8MoeWeights] = WeightFormat(
    "fp8", Fp8MoeWeights, "FP8 E4M3 W8A8 experts, per-expert per-tensor weight scales, static per-tensor input scales"
)
"""FP8 per-tensor W8A8 experts (:class:`Fp8MoeWeights`)."""

FP8_CHANNEL: WeightFormat[Fp8ChannelMoeWeights] = WeightFormat(
    "fp8-channel", Fp8ChannelMoeWeights, "FP8 E4M3 W8A8 experts, per-channel weight scales, dynamic per-token input scales"
)
"""FP8 per-channel weights with dynamic per-token activations (:class:`Fp8ChannelMoeWeights`, compressed-tensors
``FP8_DYNAMIC``)."""

FP8_BLOCK_SCALED: WeightFormat[Fp8BlockMoeWeights] = WeightFormat(
    "fp8-block", Fp8BlockMoeWeights, "FP8 E4M3 W8A8 experts, 128x128 block weight scales, dynamic 1x128 input scales"
)
"""FP8 with 128x128 block weight scales and per-token 128-column group activation scales (:class:`Fp8BlockMoeWeights`,
DeepSeek-V3 / Qwen3 FP8)."""
