"""An MoE layer in float64, one token and one expert at a time: the check on the reference backends.

It shares nothing with the reference runners but the activation quantizers
(NVFP4's checked bit for bit against compressed-tensors), so an indexing,
routing, scaling or activation mistake in either shows up as a difference.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from moe_core.config import Activation, MoeRunnerConfig
from moe_core.dispatch import DispatchOutput
from moe_core.fp8 import Fp8TensorScale, fake_quantize_fp8, fake_quantize_fp8_per_group, fake_quantize_fp8_per_token
from moe_core.global_scales import QuantizeGlobalScale
from moe_core.formats import Fp8MoeWeights, Nvfp4MoeWeights
from moe_core.nvfp4 import Nvfp4Tensor

RoundTrip = Callable[[torch.Tensor], torch.Tensor]
"""One token's float64 vector -> the same after its GEMM input's quantization round trip, float64."""


def _nvfp4_round_trip(scale: QuantizeGlobalScale) -> RoundTrip:
    return lambda x: Nvfp4Tensor.quantize(x.float()[None], scale).dequantize()[0].double()


def _fp8_round_trip(scale: Fp8TensorScale) -> RoundTrip:
    on_cpu = scale.to("cpu")
    return lambda x: fake_quantize_fp8(x.float(), on_cpu).double()


def nvfp4_round_trips(weights: Nvfp4MoeWeights) -> tuple[RoundTrip, RoundTrip]:
    """Both GEMM inputs' NVFP4 round trips with the layer's input scales, from their float32 values (as W4A4 kernels see them)."""
    return _nvfp4_round_trip(weights.w13_input_scale), _nvfp4_round_trip(weights.w2_input_scale)


def fp8_round_trips(weights: Fp8MoeWeights) -> tuple[RoundTrip, RoundTrip]:
    """Both GEMM inputs' FP8 round trips with the layer's static per-tensor scales."""
    return _fp8_round_trip(weights.w13_input_scale), _fp8_round_trip(weights.w2_input_scale)


def _dynamic_round_trips(fake_quantize: Callable[[torch.Tensor], torch.Tensor]) -> tuple[RoundTrip, RoundTrip]:
    """Both GEMM inputs through ``fake_quantize`` of a ``[T, K]`` batch, one token at a time (scales from its own values)."""

    def round_trip(x: torch.Tensor) -> torch.Tensor:
        return fake_quantize(x.float()[None])[0].double()

    return round_trip, round_trip


def fp8_per_token_round_trips() -> tuple[RoundTrip, RoundTrip]:
    """Both GEMM inputs' FP8 round trips with dynamic per-token scales (each token's own amax)."""
    return _dynamic_round_trips(fake_quantize_fp8_per_token)


def fp8_per_group_round_trips() -> tuple[RoundTrip, RoundTrip]:
    """Both GEMM inputs' FP8 round trips with dynamic scales per 128-column group of each token."""
    return _dynamic_round_trips(fake_quantize_fp8_per_group)


def float64_moe(
    config: MoeRunnerConfig,
    dispatch: DispatchOutput,
    w13: torch.Tensor,
    w2: torch.Tensor,
    round_trips: tuple[RoundTrip, RoundTrip] | None = None,
) -> torch.Tensor:
    """The layer's ``[T, H]`` output in float64, on the CPU, for weights ``w13 [E, 2I, H]`` and ``w2 [E, H, I]``.

    With ``round_trips``, each GEMM input goes through its quantization round
    trip first (:func:`nvfp4_round_trips`, :func:`fp8_round_trips`,
    :func:`fp8_per_token_round_trips`, :func:`fp8_per_group_round_trips`).
    """
    hidden, topk = dispatch.hidden_states.cpu(), dispatch.topk
    ids, weights = topk.topk_ids.cpu(), topk.topk_weights.cpu()
    w13, w2 = w13.cpu(), w2.cpu()
    inter = config.intermediate_size_per_partition
    out = torch.zeros(hidden.shape, dtype=torch.float64)
    for t in range(hidden.shape[0]):
        for k in range(topk.top_k):
            local = int(ids[t, k]) - config.local_expert_offset
            if not 0 <= local < config.num_local_experts:
                continue
            xt = hidden[t].double()
            if round_trips is not None:
                xt = round_trips[0](xt)
            h = w13[local].double() @ xt
            gate, up = h[:inter], h[inter:]
            if config.activation is Activation.SILU_GATED:
                act = gate * torch.sigmoid(gate) * up
            else:
                act = 0.5 * gate * (1 + torch.erf(gate / 2**0.5)) * up
            if round_trips is not None:
                act = round_trips[1](act)
            out[t] += float(weights[t, k]) * (w2[local].double() @ act)
    return out * config.routed_scaling_factor
