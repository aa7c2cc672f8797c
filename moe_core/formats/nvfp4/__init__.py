"""The nvfp4 (W4A4) format kit: its weights type, its reference recipe, the format constant and its degradation to
W4A16 where no W4A4 kernel fits."""

from moe_core.conversion import Degradation, WeightFormat
from moe_core.formats.nvfp4.reference import Nvfp4Recipe, fake_quantize_nvfp4
from moe_core.formats.nvfp4.weights import Nvfp4MoeWeights
from moe_core.formats.nvfp4_w4a16 import NVFP4_W4A16, Nvfp4W4A16MoeWeights

NVFP4_TO_W4A16: Degradation[Nvfp4MoeWeights, Nvfp4W4A16MoeWeights] = Degradation(
    NVFP4_W4A16,
    "activations stay 16-bit (W4A16): no NVFP4 W4A4 kernel fits; input scales unused",
    Nvfp4MoeWeights.without_activation_quantization,
)
"""Where no W4A4 kernel fits (Hopper), W4A4 weights run on a W4A16 kernel: the same codes and scales."""

NVFP4: WeightFormat[Nvfp4MoeWeights] = WeightFormat(
    "nvfp4", Nvfp4MoeWeights, "NVFP4 W4A4 experts with static scalar input scales", (NVFP4_TO_W4A16,)
)
"""NVFP4 W4A4 experts, which degrade to NVFP4 W4A16 where no W4A4 kernel fits."""

__all__ = ["NVFP4", "NVFP4_TO_W4A16", "Nvfp4MoeWeights", "Nvfp4Recipe", "fake_quantize_nvfp4"]
