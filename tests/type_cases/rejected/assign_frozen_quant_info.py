"""Assigning to a field of frozen quant info after it was built."""

from moe_core import Nvfp4MoeWeights, QuantizeGlobalScale


def recalibrate(weights: Nvfp4MoeWeights, scale: QuantizeGlobalScale) -> None:
    weights.w13_input_scale = scale  # expect: [misc] Property "w13_input_scale" defined in "Nvfp4MoeWeights" is read-only
