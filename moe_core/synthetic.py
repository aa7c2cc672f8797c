"""Random MoE layers for the CLI's check and for backend tests."""

from __future__ import annotations

import math
from typing import Protocol

import torch

from moe_core.config import MoeRunnerConfig
from moe_core.dispatch import StandardDispatchOutput
from moe_core.fp8 import Fp8BlockExpertWeights, Fp8ChannelExpertWeights, Fp8ExpertWeights, Fp8GateUpWeights, Fp8TensorScale
from moe_core.global_scales import ExpertInputScales, QuantizeGlobalScale
from moe_core.formats import (
    DenseMoeWeights,
    Fp8BlockMoeWeights,
    Fp8ChannelMoeWeights,
    Fp8MoeWeights,
    Nvfp4PerExpertMoeWeights,
    Nvfp4MoeWeights,
)
from moe_core.nvfp4 import Nvfp4ExpertWeights, Nvfp4GateUpWeights
from moe_core.routing import select_experts


ROUTER_LOGIT_STD = 2.0
"""The spread of the random router logits: as confident as trained routers', so that top-k weights span about 0.01
to 0.99 (at N(0, 1) a plugin that skipped slots weighted under 0.1 met none: adversarial pass 6, c13)."""


def random_dense_layer(
    config: MoeRunnerConfig, num_tokens: int, dtype: torch.dtype, device: torch.device, seed: int
) -> tuple[DenseMoeWeights, StandardDispatchOutput]:
    """Random float32 expert weights and a routed batch of ``dtype`` activations.

    Weights are N(0, 1/fan_in), so activations stay O(1); each expert's up
    rows are scaled by its own random factor (0.4x to 2.5x), so that NVFP4
    quantization gives gate and up different global scales, as real
    checkpoints have them. Router logits are normal with standard deviation :data:`ROUTER_LOGIT_STD`.
    """
    gen = torch.Generator().manual_seed(seed)
    experts, hidden, inter = config.num_local_experts, config.hidden_size, config.intermediate_size_per_partition
    w13 = torch.randn(experts, 2 * inter, hidden, generator=gen) / math.sqrt(hidden)
    w13[:, inter:] *= torch.exp(torch.empty(experts, 1, 1).uniform_(-0.9, 0.9, generator=gen))
    w2 = torch.randn(experts, hidden, inter, generator=gen) / math.sqrt(inter)
    x, logits = random_tokens(config, num_tokens, dtype, device, gen)
    dispatch = StandardDispatchOutput(x, select_experts(logits, config))
    return DenseMoeWeights(w13=w13.to(device), w2=w2.to(device)), dispatch


def random_tokens(
    config: MoeRunnerConfig, num_tokens: int, dtype: torch.dtype, device: torch.device, gen: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    """``num_tokens`` random hidden states of ``dtype`` and their router logits (float32, standard deviation
    :data:`ROUTER_LOGIT_STD`), drawn from ``gen`` in that order, on ``device``."""
    x = torch.randn(num_tokens, config.hidden_size, generator=gen).to(dtype)
    logits = torch.randn(num_tokens, config.num_experts, generator=gen) * ROUTER_LOGIT_STD
    return x.to(device), logits.to(device)


class _QuantizedGateUp(Protocol):
    """A quantized ``w13 [E, 2I, H]`` that dequantizes one expert at a time."""

    def dequantize_expert(self, expert: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """Expert ``expert``'s ``[2I, H]``."""
        ...


def _activation_amax(config: MoeRunnerConfig, x: torch.Tensor, w13: _QuantizedGateUp, expert: int) -> torch.Tensor:
    """The amax of the gated activation of ``x`` (float32) through local expert ``expert`` as the layer runs it."""
    return config.activation.apply(x @ w13.dequantize_expert(expert).T).abs().amax()


def _input_amax(
    config: MoeRunnerConfig, dispatch: StandardDispatchOutput, w13: _QuantizedGateUp
) -> tuple[torch.Tensor, torch.Tensor]:
    """The amax of this batch's two GEMM inputs over all local experts, for ``w13`` as the layer runs it (an expert
    at a time: DeepSeek-V3's whole w13 in float32 is 30 GB)."""
    x = dispatch.hidden_states.float()
    activation = torch.stack([_activation_amax(config, x, w13, e) for e in range(config.num_local_experts)]).amax()
    return x.abs().amax(), activation


def quantize_nvfp4_layer(
    config: MoeRunnerConfig, dense: DenseMoeWeights, dispatch: StandardDispatchOutput
) -> Nvfp4MoeWeights:
    """``dense`` quantized to NVFP4, with static input scales calibrated on ``dispatch``.

    The input scales take the amax of this batch's GEMM inputs over all local
    experts; the weights' global scales come from each expert's (and each
    half's) own amax.
    """
    w13 = Nvfp4GateUpWeights.quantize(dense.w13)
    hidden_amax, activation_amax = _input_amax(config, dispatch, w13)
    return Nvfp4MoeWeights(
        w13=w13,
        w2=Nvfp4ExpertWeights.quantize(dense.w2),
        w13_input_scale=QuantizeGlobalScale.from_amax(hidden_amax),
        w2_input_scale=QuantizeGlobalScale.from_amax(activation_amax),
    )


def _expert_input_amax(
    config: MoeRunnerConfig, dispatch: StandardDispatchOutput, w13: _QuantizedGateUp
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per expert of the layer (``[num_experts]``), the amax of this batch's two GEMM inputs over the tokens routed to
    it: the hidden states' for every expert, the gated activation's for the local ones (``w13`` is theirs). An
    expert routed none, or another rank's activation, takes the layer's amax, as a calibration that never reached it
    would leave a layer-wide value."""
    x = dispatch.hidden_states.float()
    layer_hidden, layer_activation = _input_amax(config, dispatch, w13)
    hidden = torch.full((config.num_experts,), float(layer_hidden))
    activation = torch.full((config.num_experts,), float(layer_activation))
    ids = dispatch.topk.topk_ids.cpu()
    for expert in range(config.num_experts):
        tokens = torch.nonzero((ids == expert).any(dim=1)).flatten().to(x.device)
        if not tokens.numel():
            continue
        routed = x[tokens]
        hidden[expert] = routed.abs().amax()
        local = expert - config.local_expert_offset
        if 0 <= local < config.num_local_experts:
            activation[expert] = _activation_amax(config, routed, w13, local)
    return hidden.to(x.device), activation.to(x.device)


def quantize_nvfp4_per_expert_layer(
    config: MoeRunnerConfig, dense: DenseMoeWeights, dispatch: StandardDispatchOutput
) -> Nvfp4PerExpertMoeWeights:
    """``dense`` (this rank's experts) quantized to NVFP4 with per-expert static input scales for every expert of the
    layer, each calibrated on the tokens ``dispatch`` routes to it (see :func:`_expert_input_amax`); the weights
    derive the layer-wide scalars."""
    w13 = Nvfp4GateUpWeights.quantize(dense.w13)
    hidden_amax, activation_amax = _expert_input_amax(config, dispatch, w13)
    return Nvfp4PerExpertMoeWeights(
        w13=w13,
        w2=Nvfp4ExpertWeights.quantize(dense.w2),
        w13_input_scales=ExpertInputScales.from_amax(hidden_amax),
        w2_input_scales=ExpertInputScales.from_amax(activation_amax),
        local_expert_offset=config.local_expert_offset,
    )


def quantize_fp8_layer(config: MoeRunnerConfig, dense: DenseMoeWeights, dispatch: StandardDispatchOutput) -> Fp8MoeWeights:
    """``dense`` quantized to FP8 per tensor (each expert and half its own scale), input scales calibrated on ``dispatch``."""
    w13 = Fp8GateUpWeights.quantize(dense.w13)
    hidden_amax, activation_amax = _input_amax(config, dispatch, w13)
    return Fp8MoeWeights(
        w13=w13,
        w2=Fp8ExpertWeights.quantize(dense.w2),
        w13_input_scale=Fp8TensorScale.from_amax(hidden_amax),
        w2_input_scale=Fp8TensorScale.from_amax(activation_amax),
    )


def quantize_fp8_channel_layer(
    config: MoeRunnerConfig, dense: DenseMoeWeights, dispatch: StandardDispatchOutput
) -> Fp8ChannelMoeWeights:
    """``dense`` quantized to FP8 per channel (each row its own scale); the activations need no calibration."""
    return Fp8ChannelMoeWeights(w13=Fp8ChannelExpertWeights.quantize(dense.w13), w2=Fp8ChannelExpertWeights.quantize(dense.w2))


def quantize_fp8_block_layer(
    config: MoeRunnerConfig, dense: DenseMoeWeights, dispatch: StandardDispatchOutput
) -> Fp8BlockMoeWeights:
    """``dense`` quantized to FP8 per 128x128 block (w1 and w3 apart: I is a multiple of 128); nothing calibrated."""
    return Fp8BlockMoeWeights(w13=Fp8BlockExpertWeights.quantize(dense.w13), w2=Fp8BlockExpertWeights.quantize(dense.w2))


def random_nvfp4_layer(
    config: MoeRunnerConfig, num_tokens: int, dtype: torch.dtype, device: torch.device, seed: int
) -> tuple[Nvfp4MoeWeights, StandardDispatchOutput]:
    """A random layer (see :func:`random_dense_layer`) quantized to NVFP4 (see :func:`quantize_nvfp4_layer`)."""
    dense, dispatch = random_dense_layer(config, num_tokens, dtype, device, seed)
    return quantize_nvfp4_layer(config, dense, dispatch), dispatch
