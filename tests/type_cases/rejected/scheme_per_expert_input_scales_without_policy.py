"""A scheme building the scalar-input-scale quant info (what TRT-LLM-gen takes) from per-expert input scales.

Neither the raw per-expert tensor nor the per-expert scale type goes where the
scalar belongs, and collapsing them needs a named policy.
"""

from moe_core import ExpertQuantizeGlobalScales, Nvfp4MoeWeights, QuantizeGlobalScale
from moe_core.schemes.compressed_tensors_w4a4_nvfp4 import CompressedTensorsW4A4Nvfp4MoE


class MyScheme(CompressedTensorsW4A4Nvfp4MoE):
    def canonical_weights(self) -> Nvfp4MoeWeights:
        weights = super().canonical_weights()
        per_expert = self.params.gate_up("input_global_scale")  # [E, 2], one per expert and shard
        scalar = QuantizeGlobalScale.from_checkpoint(per_expert, num_experts=self.config.num_experts)  # expect: [call-arg] Missing named argument "policy" for "from_checkpoint" of "QuantizeGlobalScale"
        return Nvfp4MoeWeights(
            w13=weights.w13,
            w2=weights.w2,
            w13_input_scale=ExpertQuantizeGlobalScales.from_checkpoint(per_expert[:, 0]),  # expect: [arg-type] Argument "w13_input_scale" to "Nvfp4MoeWeights" has incompatible type "ExpertQuantizeGlobalScales"; expected "QuantizeGlobalScale"
            w2_input_scale=scalar,
        )
