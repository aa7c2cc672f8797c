"""SGLang's bug: per-expert ``[E]`` input scales where the kernel takes one scalar."""

from moe_core import ExpertQuantizeGlobalScales, Nvfp4ExpertWeights, Nvfp4GateUpWeights, Nvfp4MoeWeights, QuantizeGlobalScale


def build(
    w13: Nvfp4GateUpWeights, w2: Nvfp4ExpertWeights, per_expert: ExpertQuantizeGlobalScales, a2: QuantizeGlobalScale
) -> Nvfp4MoeWeights:
    return Nvfp4MoeWeights(w13=w13, w2=w2, w13_input_scale=per_expert, w2_input_scale=a2)  # expect: [arg-type] Argument "w13_input_scale" to "Nvfp4MoeWeights" has incompatible type "ExpertQuantizeGlobalScales"; expected "QuantizeGlobalScale"
