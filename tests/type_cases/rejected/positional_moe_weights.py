"""The two input scales passed by position, where swapping them runs and changes the output."""

from moe_core import Nvfp4ExpertWeights, Nvfp4GateUpWeights, Nvfp4MoeWeights, QuantizeGlobalScale


def build(w13: Nvfp4GateUpWeights, w2: Nvfp4ExpertWeights, a1: QuantizeGlobalScale, a2: QuantizeGlobalScale) -> Nvfp4MoeWeights:
    return Nvfp4MoeWeights(w13, w2, a2, a1)  # expect: [call-arg] Too many positional arguments for "Nvfp4MoeWeights"
