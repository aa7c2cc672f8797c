"""Random MoE layers for the CLI's check and for backend tests."""

from __future__ import annotations

import math

import torch

from moe_core.config import MoeRunnerConfig
from moe_core.dispatch import StandardDispatchOutput
from moe_core.global_scales import QuantizeGlobalScale
from moe_core.moe_weights import Nvfp4MoeWeights
from moe_core.nvfp4 import Nvfp4ExpertWeights
from moe_core.routing import select_experts


def random_nvfp4_layer(
    config: MoeRunnerConfig, num_tokens: int, dtype: torch.dtype, device: torch.device, seed: int
) -> tuple[Nvfp4MoeWeights, StandardDispatchOutput]:
    """Random NVFP4 expert weights and a routed batch, with input scales calibrated on it.

    Weights are N(0, 1/fan_in), so activations stay O(1); the static input
    scales take the amax of this batch's GEMM inputs over all local experts.
    """
    gen = torch.Generator().manual_seed(seed)
    experts, hidden, inter = config.num_local_experts, config.hidden_size, config.intermediate_size_per_partition
    w13 = torch.randn(experts, 2 * inter, hidden, generator=gen) / math.sqrt(hidden)
    w2 = torch.randn(experts, hidden, inter, generator=gen) / math.sqrt(inter)
    x = torch.randn(num_tokens, hidden, generator=gen).to(dtype)
    logits = torch.randn(num_tokens, config.num_experts, generator=gen)
    w13_q = Nvfp4ExpertWeights.quantize(w13.to(device))
    w2_q = Nvfp4ExpertWeights.quantize(w2.to(device))
    gate_up = torch.einsum("th,eih->eti", x.float().to(device), w13_q.dequantize())
    activation_amax = config.activation.apply(gate_up).abs().amax()
    weights = Nvfp4MoeWeights(
        w13_q,
        w2_q,
        QuantizeGlobalScale.from_amax(x.float().abs().amax()).to(device),
        QuantizeGlobalScale.from_amax(activation_amax).to(device),
    )
    dispatch = StandardDispatchOutput(x.to(device), select_experts(logits.to(device), config))
    return weights, dispatch
