"""The canonical weight formats moe-core ships: dense and NVFP4."""

from __future__ import annotations

from moe_core.conversion import WeightFormat
from moe_core.moe_weights import DenseMoeWeights, Nvfp4MoeWeights

DENSE: WeightFormat[DenseMoeWeights] = WeightFormat(
    "dense", DenseMoeWeights, "unquantized fp32/bf16/fp16 expert weights"
)
"""Unquantized experts (:class:`DenseMoeWeights`)."""

NVFP4: WeightFormat[Nvfp4MoeWeights] = WeightFormat(
    "nvfp4", Nvfp4MoeWeights, "NVFP4 W4A4 experts with static scalar input scales"
)
"""NVFP4 W4A4 experts (:class:`Nvfp4MoeWeights`)."""
