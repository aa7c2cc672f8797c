"""The nvfp4-per-expert format kit: NVFP4 W4A4 whose GEMM inputs are quantized per expert, its reference recipe, the
format constant and its degradations (to the layer-wide scalars of NVFP4 W4A4, or to W4A16)."""

from moe_core.conversion import Degradation, WeightFormat
from moe_core.formats.nvfp4 import NVFP4, Nvfp4MoeWeights
from moe_core.formats.nvfp4_per_expert.reference import Nvfp4PerExpertRecipe
from moe_core.formats.nvfp4_per_expert.weights import Nvfp4PerExpertMoeWeights
from moe_core.formats.nvfp4_w4a16 import NVFP4_W4A16, Nvfp4W4A16MoeWeights

PER_EXPERT_TO_LAYER_SCALAR: Degradation[Nvfp4PerExpertMoeWeights, Nvfp4MoeWeights] = Degradation(
    NVFP4,
    "input scales collapsed to the layer's conservative scalar: no kernel here quantizes per expert; "
    "an expert calibrated on small inputs loses precision, or its inputs",
    Nvfp4PerExpertMoeWeights.with_layer_input_scales,
)
"""Where no per-expert W4A4 kernel fits, the one-scalar W4A4 kernels run with the layer-wide scalars."""

PER_EXPERT_TO_W4A16: Degradation[Nvfp4PerExpertMoeWeights, Nvfp4W4A16MoeWeights] = Degradation(
    NVFP4_W4A16,
    "activations stay 16-bit (W4A16): no NVFP4 W4A4 kernel fits; input scales unused",
    Nvfp4PerExpertMoeWeights.without_activation_quantization,
)
"""Where no W4A4 kernel fits at all (Hopper), the W4A16 kernels run the same codes and scales."""

NVFP4_PER_EXPERT: WeightFormat[Nvfp4PerExpertMoeWeights] = WeightFormat(
    "nvfp4-per-expert",
    Nvfp4PerExpertMoeWeights,
    "NVFP4 W4A4 experts, each quantizing its inputs with its own static scale",
    (PER_EXPERT_TO_LAYER_SCALAR, PER_EXPERT_TO_W4A16),
)
"""NVFP4 W4A4 with per-expert input scales: the reference computes it as such; kernels taking one scalar per GEMM
input run it through a named degradation."""

__all__ = [
    "PER_EXPERT_TO_LAYER_SCALAR",
    "PER_EXPERT_TO_W4A16",
    "NVFP4_PER_EXPERT",
    "Nvfp4PerExpertMoeWeights",
    "Nvfp4PerExpertRecipe",
]
