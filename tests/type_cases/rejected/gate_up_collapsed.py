"""A fused w13 with one global scale per expert where the gate and up halves keep their own."""

from moe_core import Nvfp4ExpertWeights, Nvfp4MoeWeights, QuantizeGlobalScale


def build(w13: Nvfp4ExpertWeights, w2: Nvfp4ExpertWeights, a1: QuantizeGlobalScale, a2: QuantizeGlobalScale) -> Nvfp4MoeWeights:
    return Nvfp4MoeWeights(w13=w13, w2=w2, w13_input_scale=a1, w2_input_scale=a2)  # expect: [arg-type] Argument "w13" to "Nvfp4MoeWeights" has incompatible type "Nvfp4ExpertWeights"; expected "Nvfp4GateUpWeights"
