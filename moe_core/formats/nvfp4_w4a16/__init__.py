"""The nvfp4-w4a16 format kit: its weights type, its reference recipe and the format constant."""

from moe_core.conversion import WeightFormat
from moe_core.formats.nvfp4_w4a16.reference import Nvfp4W4A16Recipe
from moe_core.formats.nvfp4_w4a16.weights import Nvfp4W4A16MoeWeights

NVFP4_W4A16: WeightFormat[Nvfp4W4A16MoeWeights] = WeightFormat("nvfp4-w4a16", Nvfp4W4A16MoeWeights, "NVFP4 weights with bf16/fp16 activations (W4A16)")
"""NVFP4 weights run with unquantized activations: a different computation from NVFP4 W4A4, so a different format and
type; W4A4 weights reach it only through NVFP4's declared degradation."""

__all__ = ["NVFP4_W4A16", "Nvfp4W4A16MoeWeights", "Nvfp4W4A16Recipe"]
