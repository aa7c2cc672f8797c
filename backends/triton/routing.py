"""Routing in one Triton launch: router logits to the top-k ids and float32 weights :func:`~moe_core.select_experts`
computes.

``select_experts`` is a chain of PyTorch operations (a softmax or sigmoid,
``topk``, a gather, a renormalization; grouped top-k adds the group scores,
their ``topk`` and the masks), each a launch and a round trip of the
``[T, E]`` scores through memory, and a fused top-k is part of the forward's
time. :func:`~.kernels.routing_kernel` computes the same in float32 with one
program per token row, the whole row in registers. Nothing is read back to
the host, so a forward that routes with it can be captured in a CUDA graph.

The set of ids per row and each id's weight are ``select_experts``' (to
float32 rounding: sums in another order); the order within a row is the
kernel's (decreasing by what chose them), and equal scores go to the lower
expert id. PhiMoE's sparsemixer is not fused: :func:`fused_routing_refusal`
says so, for callers to fall back to ``select_experts``.
"""

from __future__ import annotations

from typing import final

import attrs
import torch

from moe_core.backends.triton.kernels import (
    EXP_SCORES, INTERPRETED, SIGMOID_SCORES, SOFTMAX_SCORES, one_at_a_time, routing_kernel,
)
from moe_core.backends.triton.sorting import cdiv, next_power_of_2
from moe_core.config import GroupedTopK, GroupScore, MoeRunnerConfig, RoutingMethod, Scoring, SigmoidTopK, SparseMixer
from moe_core.dispatch import TopKOutput
from moe_core.routing import check_correction_bias, check_router_logits

ROW_SLOTS = 256
"""Rows per program: as many as fill this many slots of ``[rows, groups, experts per group]`` (powers of two), so
that rows of few experts share a program (more rows amortize its work; fewer, more programs run at once)."""

MAX_TOP_K = 16
"""The most experts the kernel picks per token: each pick is one arg-max pass over the row, unrolled."""

GROUPED_EPS = 1e-20
"""What grouped top-k adds to the sum it renormalizes by (without a ``sum_floor``), as ``select_experts`` does."""


@final
@attrs.frozen
class _Plan:
    """The kernel's flags for one routing method."""

    scores: int
    """``SOFTMAX_SCORES``, ``SIGMOID_SCORES`` or ``EXP_SCORES`` (:mod:`.kernels`)."""
    renormalize: bool
    grouped: bool = False
    """Chosen on the scores (plus a correction bias) within the best groups, not on the logits."""
    n_group: int = 1
    topk_group: int = 1
    group_max: bool = False
    eps: float = 0.0
    floor: float = 0.0
    """The weights are divided by ``max(sum + eps, floor)`` where ``renormalize``."""


def _plan(config: MoeRunnerConfig) -> _Plan | str:
    """The kernel's flags for ``config``'s routing, or why the kernel cannot route it."""
    method = config.routing_method
    if isinstance(method, SparseMixer):
        return (f"{method.value} routing is not fused (each pick's weight is a softmax over the logits near it): "
                "route it with select_experts")
    if config.top_k > MAX_TOP_K:
        return f"top_k={config.top_k}: the fused routing kernel picks at most {MAX_TOP_K} experts per token"
    if method is RoutingMethod.SOFTMAX_TOPK:
        return _Plan(SOFTMAX_SCORES, renormalize=False)
    if method is RoutingMethod.TOPK_RENORMALIZE:  # the softmax of the top-k logits: exp(logit - max) over their sum
        return _Plan(EXP_SCORES, renormalize=True)
    if isinstance(method, SigmoidTopK):
        return _Plan(SIGMOID_SCORES, renormalize=method.renormalize)
    if isinstance(method, GroupedTopK):
        return _Plan(
            SOFTMAX_SCORES if method.scoring is Scoring.SOFTMAX else SIGMOID_SCORES,
            renormalize=method.renormalize, grouped=True, n_group=method.n_group, topk_group=method.topk_group,
            group_max=method.group_score is GroupScore.MAX,
            eps=GROUPED_EPS if method.sum_floor is None else 0.0,
            floor=0.0 if method.sum_floor is None else method.sum_floor,
        )
    return _Plan(SIGMOID_SCORES, renormalize=False)  # Llama 4: the sigmoid of each top-k logit


def fused_routing_refusal(config: MoeRunnerConfig) -> str | None:
    """Why :func:`fused_select_experts` cannot route ``config``'s layer (sparsemixer routing, ``top_k`` above
    :data:`MAX_TOP_K`), or None: callers fall back to :func:`~moe_core.select_experts` on a reason."""
    plan = _plan(config)
    return plan if isinstance(plan, str) else None


def fused_select_experts(
    router_logits: torch.Tensor, config: MoeRunnerConfig, *, score_correction_bias: torch.Tensor | None
) -> TopKOutput:
    """:func:`~moe_core.select_experts` of ``router_logits [T, num_experts]`` in one kernel launch.

    The inputs are checked as ``select_experts`` checks them, from metadata
    only: the correction bias's values are not read back (a
    :class:`~moe_core.Router` checks its own once), nor are the outputs'
    (``check_values=False``: the kernel's ids are in range and distinct by
    construction), so no forward waits on the device. Raises ``ValueError``
    where :func:`fused_routing_refusal` gives a reason.
    """
    plan = _plan(config)
    if isinstance(plan, str):
        raise ValueError(f"fused_select_experts: {plan}")
    check_router_logits(router_logits, config)
    bias, stride_b = router_logits, 0  # never read without a correction bias
    if score_correction_bias is not None:
        check_correction_bias(score_correction_bias, router_logits, config)
        bias, stride_b = score_correction_bias, score_correction_bias.stride(0)
    tokens, top_k = router_logits.shape[0], config.top_k
    ids = torch.empty(tokens, top_k, dtype=torch.int32, device=router_logits.device)
    weights = torch.empty(tokens, top_k, dtype=torch.float32, device=router_logits.device)
    per_group = config.num_experts // plan.n_group
    groups, padded_group = next_power_of_2(plan.n_group), next_power_of_2(per_group)
    rows = max(1, ROW_SLOTS // (groups * padded_group))
    if tokens:
        with one_at_a_time():
            routing_kernel[(cdiv(tokens, rows),)](
                router_logits, bias, ids, weights, tokens, router_logits.stride(0), router_logits.stride(1), stride_b,
                plan.n_group, per_group, plan.eps, plan.floor,
                TOP_K=top_k, SCORES=plan.scores, GROUPED=plan.grouped,
                TOPK_GROUP=plan.topk_group, GROUP_MAX=plan.group_max, BIAS=score_correction_bias is not None,
                RENORMALIZE=plan.renormalize, LIBDEVICE=not INTERPRETED, ROWS=rows, GROUPS=groups,
                PER_GROUP=padded_group, K_PAD=next_power_of_2(top_k),
            )
    return TopKOutput(
        ids, weights, router_logits, num_experts=config.num_experts, check_values=False, from_router_logits=True
    )
