"""The dense format kit: its weights type, its reference recipe and the format constant."""

from moe_core.conversion import WeightFormat
from moe_core.formats.dense.reference import DenseRecipe
from moe_core.formats.dense.weights import DenseMoeWeights, ExpertBiases, GateUpLayout

DENSE: WeightFormat[DenseMoeWeights] = WeightFormat("dense", DenseMoeWeights, "unquantized fp32/bf16/fp16 expert weights")
"""Unquantized experts."""

__all__ = ["DENSE", "DenseMoeWeights", "DenseRecipe", "ExpertBiases", "GateUpLayout"]
