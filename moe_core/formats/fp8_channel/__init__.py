"""The fp8-channel format kit: its weights type, its reference recipe and the format constant."""

from moe_core.conversion import WeightFormat
from moe_core.formats.fp8_channel.reference import Fp8ChannelRecipe
from moe_core.formats.fp8_channel.weights import Fp8ChannelMoeWeights

FP8_CHANNEL: WeightFormat[Fp8ChannelMoeWeights] = WeightFormat("fp8-channel", Fp8ChannelMoeWeights, "FP8 E4M3 W8A8 experts, per-channel weight scales, dynamic per-token input scales")
"""FP8 per-channel weights with dynamic per-token activations (compressed-tensors ``FP8_DYNAMIC``)."""

__all__ = ["FP8_CHANNEL", "Fp8ChannelMoeWeights", "Fp8ChannelRecipe"]
