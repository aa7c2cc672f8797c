"""The mxfp4 format kit: its weights type, its reference recipe, the format constant and its degradation to dense
bf16 where no MXFP4 kernel fits."""

from moe_core.conversion import Degradation, WeightFormat
from moe_core.formats.dense import DENSE, DenseMoeWeights
from moe_core.formats.mxfp4.reference import Mxfp4Recipe
from moe_core.formats.mxfp4.weights import Mxfp4MoeWeights

MXFP4_TO_BF16: Degradation[Mxfp4MoeWeights, DenseMoeWeights] = Degradation(
    DENSE,
    "weights dequantized once to bf16 (exact; 4x the MXFP4 bytes): no MXFP4 kernel fits",
    Mxfp4MoeWeights.dequantized_bf16,
)
"""Where no MXFP4 kernel fits (e.g. a layer triton-mxfp4-w4a16 refuses), the same values run on a bf16 kernel."""

MXFP4: WeightFormat[Mxfp4MoeWeights] = WeightFormat(
    "mxfp4",
    Mxfp4MoeWeights,
    "MXFP4 weights (E8M0 scales per 32) with bf16/fp16 activations (W4A16), optional expert biases",
    (MXFP4_TO_BF16,),
)
"""MXFP4 weights run with unquantized activations (gpt-oss), which degrade to dense bf16 where no MXFP4 kernel fits."""

__all__ = ["MXFP4", "MXFP4_TO_BF16", "Mxfp4MoeWeights", "Mxfp4Recipe"]
