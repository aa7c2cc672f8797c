"""Per-expert input scales collapsed from w1's and w3's shards are not a weight's global scales: given to both
halves of the gate/up weights, one half's codes dequantized at the other's scale (2.64 off)."""

import torch

from moe_core import ExpertInputScales, ExpertScalePolicy, Nvfp4ExpertWeights


def both_halves(gate: Nvfp4ExpertWeights, fused_global_scales: torch.Tensor) -> Nvfp4ExpertWeights:
    one = ExpertInputScales.from_checkpoint_shards(fused_global_scales, policy=ExpertScalePolicy.CONSERVATIVE)
    return Nvfp4ExpertWeights(gate.packed, gate.block_scales, one)  # expect: [arg-type] Argument 3 to "Nvfp4ExpertWeights" has incompatible type "ExpertInputScales"; expected "ExpertQuantizeGlobalScales"
