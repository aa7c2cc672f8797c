"""The fp8 format kit: its weights type, its reference recipe and the format constant."""

from moe_core.conversion import WeightFormat
from moe_core.formats.fp8.reference import Fp8Recipe
from moe_core.formats.fp8.weights import Fp8MoeWeights

FP8: WeightFormat[Fp8MoeWeights] = WeightFormat("fp8", Fp8MoeWeights, "FP8 E4M3 W8A8 experts, per-expert per-tensor weight scales, static per-tensor input scales")
"""FP8 per-tensor W8A8 experts."""

__all__ = ["FP8", "Fp8MoeWeights", "Fp8Recipe"]
