"""A kernel's one input scale from checkpoint values without saying how many experts the layer has: the constructor
could not tell every expert's values from a slice of them (``per_expert[:1].clone()``)."""

import torch

from moe_core import DequantizeGlobalScale, ExpertScalePolicy, Fp8TensorScale, QuantizeGlobalScale


def input_scales(per_expert: torch.Tensor) -> tuple[QuantizeGlobalScale, DequantizeGlobalScale, Fp8TensorScale]:
    policy = ExpertScalePolicy.CONSERVATIVE
    return (
        QuantizeGlobalScale.from_checkpoint(per_expert[:1].clone(), policy=policy),  # expect: [call-arg] Missing named argument "num_experts" for "from_checkpoint" of "QuantizeGlobalScale"
        DequantizeGlobalScale.from_checkpoint(per_expert[:1].float(), policy=policy),  # expect: [call-arg] Missing named argument "num_experts" for "from_checkpoint" of "DequantizeGlobalScale"
        Fp8TensorScale.from_checkpoint(per_expert.max().reshape(1), policy=policy),  # expect: [call-arg] Missing named argument "num_experts" for "from_checkpoint" of "Fp8TensorScale"
    )
