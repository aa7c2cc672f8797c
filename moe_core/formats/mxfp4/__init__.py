"""The mxfp4 format kit: its weights type, its reference recipe and the format constant."""

from moe_core.conversion import WeightFormat
from moe_core.formats.mxfp4.reference import Mxfp4Recipe
from moe_core.formats.mxfp4.weights import Mxfp4MoeWeights

MXFP4: WeightFormat[Mxfp4MoeWeights] = WeightFormat("mxfp4", Mxfp4MoeWeights, "MXFP4 weights (E8M0 scales per 32) with bf16/fp16 activations (W4A16), optional expert biases")
"""MXFP4 weights run with unquantized activations (gpt-oss)."""

__all__ = ["MXFP4", "Mxfp4MoeWeights", "Mxfp4Recipe"]
