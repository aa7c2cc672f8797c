"""The fp8-block format kit: its weights type, its reference recipe and the format constant."""

from moe_core.conversion import WeightFormat
from moe_core.formats.fp8_block.reference import Fp8BlockRecipe
from moe_core.formats.fp8_block.weights import Fp8BlockMoeWeights, fp8_block_size_refusal

FP8_BLOCK_SCALED: WeightFormat[Fp8BlockMoeWeights] = WeightFormat("fp8-block", Fp8BlockMoeWeights, "FP8 E4M3 W8A8 experts, 128x128 block weight scales, dynamic 1x128 input scales")
"""FP8 with 128x128 block weight scales and per-token 128-column group activation scales (DeepSeek-V3 / Qwen3 FP8)."""

__all__ = ["FP8_BLOCK_SCALED", "Fp8BlockMoeWeights", "Fp8BlockRecipe", "fp8_block_size_refusal"]
