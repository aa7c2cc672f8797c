"""An MoE layer in float64, one token and one expert at a time: the check on the reference backends.

It shares nothing with the reference runners but the activation quantizers
(NVFP4's follows the FP4 kernels' recipe, :func:`~moe_core.nvfp4.quantize_activation`), so an indexing,
routing, scaling or activation mistake in either shows up as a difference.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from moe_core.config import Activation, ClampedSwiglu, ExpertActivation, GateClamp, LimitedSwiglu, MoeRunnerConfig
from moe_core.dispatch import DispatchOutput
from moe_core.fp8 import Fp8TensorScale, fake_quantize_fp8, fake_quantize_fp8_per_group, fake_quantize_fp8_per_token
from moe_core.global_scales import QuantizeGlobalScale
from moe_core.formats import Fp8MoeWeights, Nvfp4PerExpertMoeWeights, Nvfp4MoeWeights
from moe_core.formats.dense import ExpertBiases
from moe_core.nvfp4 import quantize_activation

RoundTrip = Callable[[int, torch.Tensor], torch.Tensor]
"""``(local expert, one token's float64 vector)`` -> the vector after that expert's GEMM input's quantization round
trip, float64."""


def _nvfp4_round_trip(scale: QuantizeGlobalScale) -> RoundTrip:
    return lambda expert, x: quantize_activation(x.float()[None], scale).dequantize()[0].double()


def _nvfp4_expert_round_trip(own: list[QuantizeGlobalScale]) -> RoundTrip:
    return lambda expert, x: quantize_activation(x.float()[None], own[expert]).dequantize()[0].double()


def _fp8_round_trip(scale: Fp8TensorScale) -> RoundTrip:
    on_cpu = scale.to("cpu")
    return lambda expert, x: fake_quantize_fp8(x.float(), on_cpu).double()


def nvfp4_round_trips(weights: Nvfp4MoeWeights) -> tuple[RoundTrip, RoundTrip]:
    """Both GEMM inputs' NVFP4 round trips with the layer's input scales, from their float32 values, by the W4A4
    kernels' recipe."""
    return _nvfp4_round_trip(weights.w13_input_scale), _nvfp4_round_trip(weights.w2_input_scale)


def nvfp4_expert_round_trips(weights: Nvfp4PerExpertMoeWeights) -> tuple[RoundTrip, RoundTrip]:
    """Both GEMM inputs' NVFP4 round trips with each local expert's own input scales, by the W4A4 kernels' recipe."""
    own = [weights.own_input_scales(expert) for expert in range(weights.num_experts)]
    return _nvfp4_expert_round_trip([first for first, _ in own]), _nvfp4_expert_round_trip([second for _, second in own])


def fp8_round_trips(weights: Fp8MoeWeights) -> tuple[RoundTrip, RoundTrip]:
    """Both GEMM inputs' FP8 round trips with the layer's static per-tensor scales."""
    return _fp8_round_trip(weights.w13_input_scale), _fp8_round_trip(weights.w2_input_scale)


def _dynamic_round_trips(fake_quantize: Callable[[torch.Tensor], torch.Tensor]) -> tuple[RoundTrip, RoundTrip]:
    """Both GEMM inputs through ``fake_quantize`` of a ``[T, K]`` batch, one token at a time (scales from its own values)."""

    def round_trip(expert: int, x: torch.Tensor) -> torch.Tensor:
        return fake_quantize(x.float()[None])[0].double()

    return round_trip, round_trip


def fp8_per_token_round_trips() -> tuple[RoundTrip, RoundTrip]:
    """Both GEMM inputs' FP8 round trips with dynamic per-token scales (each token's own amax)."""
    return _dynamic_round_trips(fake_quantize_fp8_per_token)


def fp8_per_group_round_trips() -> tuple[RoundTrip, RoundTrip]:
    """Both GEMM inputs' FP8 round trips with dynamic scales per 128-column group of each token."""
    return _dynamic_round_trips(fake_quantize_fp8_per_group)


def _activation(activation: ExpertActivation, h: torch.Tensor, inter: int) -> torch.Tensor:
    """One token's hidden activation from ``w13``'s float64 output, each activation written out here; one this
    module does not know yet is computed by its own ``apply`` (in float64)."""
    if not activation.gated:
        if activation is Activation.RELU2:
            return torch.relu(h) ** 2
        return activation.apply(h)
    gate, up = h[:inter], h[inter:]
    if activation is Activation.SILU_GATED:
        return gate * torch.sigmoid(gate) * up
    if activation is Activation.GELU_GATED:
        return 0.5 * gate * (1 + torch.erf(gate / math.sqrt(2))) * up
    if activation is Activation.GELU_TANH_GATED:
        return 0.5 * gate * (1 + torch.tanh(math.sqrt(2 / math.pi) * (gate + 0.044715 * gate**3))) * up
    if isinstance(activation, ClampedSwiglu):
        gate, up = gate.clamp(max=activation.limit), up.clamp(-activation.limit, activation.limit)
        return (up + 1) * gate * torch.sigmoid(activation.alpha * gate)
    if isinstance(activation, LimitedSwiglu):
        up = up.clamp(-activation.limit, activation.limit)
        if activation.gate_clamp is GateClamp.BEFORE_SILU:
            gate = gate.clamp(max=activation.limit)
            return gate * torch.sigmoid(gate) * up
        return (gate * torch.sigmoid(gate)).clamp(max=activation.limit) * up
    return activation.apply(h)


def float64_moe(
    config: MoeRunnerConfig,
    dispatch: DispatchOutput,
    w13: torch.Tensor,
    w2: torch.Tensor,
    round_trips: tuple[RoundTrip, RoundTrip] | None = None,
    *,
    biases: ExpertBiases | None = None,
) -> torch.Tensor:
    """The layer's ``[T, H]`` output in float64, on the CPU, for weights ``w13 [E, 2I, H]`` and ``w2 [E, H, I]``.

    The top-k weights scale each expert's output, or its input where the
    routing method says so; ``biases`` are each expert's, added after its
    GEMMs (gpt-oss), before the top-k weight. With ``round_trips``, each GEMM input goes through its quantization round
    trip first (:func:`nvfp4_round_trips`, :func:`nvfp4_expert_round_trips`, :func:`fp8_round_trips`,
    :func:`fp8_per_token_round_trips`, :func:`fp8_per_group_round_trips`).
    """
    hidden, topk = dispatch.hidden_states.cpu(), dispatch.topk
    ids, weights = topk.topk_ids.cpu(), topk.topk_weights.cpu()
    w13, w2 = w13.cpu(), w2.cpu()
    b13, b2 = (None, None) if biases is None else (biases.w13.cpu().double(), biases.w2.cpu().double())
    inter = config.intermediate_size_per_partition
    input_weighted = config.routing_method.scales_input
    out = torch.zeros(hidden.shape, dtype=torch.float64)
    for t in range(hidden.shape[0]):
        for k in range(topk.top_k):
            local = int(ids[t, k]) - config.local_expert_offset
            if not 0 <= local < config.num_local_experts:
                continue
            weight = float(weights[t, k])
            xt = hidden[t].double() * (weight if input_weighted else 1.0)
            if round_trips is not None:
                xt = round_trips[0](local, xt)
            h = w13[local].double() @ xt
            act = _activation(config.activation, h if b13 is None else h + b13[local], inter)
            if round_trips is not None:
                act = round_trips[1](local, act)
            down = w2[local].double() @ act
            out[t] += (1.0 if input_weighted else weight) * (down if b2 is None else down + b2[local])
    return out * config.routed_scaling_factor
