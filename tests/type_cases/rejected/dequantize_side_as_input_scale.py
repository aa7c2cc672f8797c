"""A ModelOpt (dequantize-side) input scale where the quantize-side scalar belongs."""

from moe_core import DequantizeGlobalScale, Nvfp4ExpertWeights, Nvfp4GateUpWeights, Nvfp4MoeWeights, QuantizeGlobalScale


def build(
    w13: Nvfp4GateUpWeights, w2: Nvfp4ExpertWeights, input_scale: DequantizeGlobalScale, a2: QuantizeGlobalScale
) -> Nvfp4MoeWeights:
    return Nvfp4MoeWeights(w13=w13, w2=w2, w13_input_scale=input_scale, w2_input_scale=a2)  # expect: [arg-type] Argument "w13_input_scale" to "Nvfp4MoeWeights" has incompatible type "DequantizeGlobalScale"; expected "QuantizeGlobalScale"
