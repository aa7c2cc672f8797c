"""Routing in plain PyTorch: the router's logits, then top-k ids and weights per the config's routing method.

Each method computes as transformers' own modeling code does (in float32):
Mixtral/Qwen/OLMoE softmax-top-k, Granite/gpt-oss top-k-softmax,
DeepSeek-V3/GLM4-MoE grouped top-k (and its softmax-scored relatives:
DeepSeek-V2's group-limited greedy, Mistral 4, ERNIE 4.5), Llama 4's
sigmoid, PhiMoE's sparsemixer.
"""

from __future__ import annotations

import enum
import functools
import importlib.util
from collections.abc import Callable
from typing import Protocol, final

import attrs
import torch
import torch.nn.functional as F

from moe_core._checks import (
    FLOAT_DTYPES,
    record_built,
    reduce_rebuilt,
    require_dtype,
    require_finite,
    require_ndim,
    require_same_device,
    require_shape,
    require_tensor,
    require_unwritten_since_built,
)
from moe_core._compile import constructed_eagerly, run_eagerly
from moe_core.config import (
    GroupedTopK,
    GroupScore,
    Llama4Sigmoid,
    MoeRunnerConfig,
    Routing,
    RoutingMethod,
    Scoring,
    SigmoidTopK,
    SparseMixer,
)
from moe_core.dispatch import TopKOutput


class Unset(enum.Enum):
    """The default of an argument that must be given explicitly where it matters."""

    UNSET = "unset"


@constructed_eagerly
@final
@attrs.frozen(eq=False, kw_only=True)
class Router:
    """A layer's router: ``logits = hidden @ weight.T + bias``, computed in the weight's dtype.

    ``score_correction_bias`` is DeepSeek-V3's ``e_score_correction_bias``:
    added to the scores that choose the experts, not to their weights
    (:class:`~moe_core.config.GroupedTopK` only).
    """

    weight: torch.Tensor
    """``[num_experts, hidden_size]``."""
    bias: torch.Tensor | None = None
    """``[num_experts]`` (gpt-oss)."""
    score_correction_bias: torch.Tensor | None | Unset = Unset.UNSET
    """``[num_experts]``, float32. Under :class:`~moe_core.config.GroupedTopK` routing it must be given, None for a
    router without one (DeepSeek-V3's routing without its bias picks other experts for a quarter of the tokens, so
    leaving it out is refused, not a default); other methods take none."""

    def __attrs_post_init__(self) -> None:
        require_tensor("Router.weight", self.weight)
        require_dtype("Router.weight", self.weight, FLOAT_DTYPES)
        require_ndim("Router.weight", self.weight, 2, "[num_experts, hidden_size]")
        tensors = [("weight", self.weight)]
        for name, tensor in (("bias", self.bias), ("score_correction_bias", self.score_correction_bias)):
            if tensor is not None and not isinstance(tensor, Unset):
                require_tensor(f"Router.{name}", tensor)
                require_dtype(f"Router.{name}", tensor, FLOAT_DTYPES)
                require_shape(f"Router.{name}", tensor, (self.num_experts,), "[num_experts] like weight")
                tensors.append((name, tensor))
        if self.bias is not None and self.bias.dtype != self.weight.dtype:
            raise TypeError(
                f"Router.bias: expected dtype {self.weight.dtype} like weight (the logits are computed in the weight's "
                f"dtype), got {self.bias.dtype}"
            )
        for name, tensor in tensors:
            require_finite(f"Router.{name}", tensor)
            record_built(self, name, tensor)
        require_same_device(tensors)

    def __reduce__(self) -> tuple[Callable[..., object], tuple[object, ...]]:
        """Copies and pickles are built through the constructor (checked, their tensors recorded); one written in place
        since it was built is refused, as its call would be."""
        return reduce_rebuilt(self, "Router")

    @property
    def num_experts(self) -> int:
        """E, the logits' width."""
        return int(self.weight.shape[0])

    def logits(self, hidden_states: torch.Tensor) -> torch.Tensor:
        """``[T, num_experts]`` logits of ``hidden_states [T, hidden_size]``; ``RuntimeError`` if one of the router's
        tensors was written in place since it was built (a loader's buffer refilled with the next layer's router)."""
        require_unwritten_since_built("Router", self)
        require_tensor("hidden_states", hidden_states)
        require_ndim("hidden_states", hidden_states, 2, "[num_tokens, hidden_size]")
        if hidden_states.shape[1] != self.weight.shape[1]:
            raise ValueError(
                f"hidden_states: expected {self.weight.shape[1]} columns like Router.weight, got {hidden_states.shape[1]}"
            )
        if hidden_states.device != self.weight.device:  # a meta router would give a CPU batch uninitialized logits
            raise ValueError(
                f"hidden_states: on {hidden_states.device}, the router's weight on {self.weight.device}: move the "
                "router to the hidden states' device (a router built on meta has no values to route with)"
            )
        return F.linear(hidden_states.to(self.weight.dtype), self.weight, self.bias)


def _grouped_choice(
    logits: torch.Tensor, method: GroupedTopK, top_k: int, correction: torch.Tensor | None
) -> torch.Tensor:
    """DeepSeek-V3's choice of experts from its logits, step for step (and its relatives' scorings, see
    GroupedTopK): the best ``topk_group`` groups by their scores plus the correction bias, then the top-k in them."""
    tokens, experts = logits.shape
    for_choice = _scores(logits, method.scoring)
    if correction is not None:
        for_choice = for_choice + correction.float()
    groups = for_choice.view(tokens, method.n_group, experts // method.n_group)
    if method.group_score is GroupScore.MAX:
        group_scores = groups.max(dim=-1).values
    else:
        group_scores = groups.topk(2, dim=-1)[0].sum(dim=-1)
    group_idx = torch.topk(group_scores, k=method.topk_group, dim=-1, sorted=False)[1]
    group_mask = torch.zeros_like(group_scores).scatter_(1, group_idx, 1)
    score_mask = group_mask.unsqueeze(-1).expand(-1, -1, experts // method.n_group).reshape(tokens, experts)
    for_choice = for_choice.masked_fill(~score_mask.bool(), float("-inf"))
    return torch.topk(for_choice, k=top_k, dim=-1, sorted=False)[1]


def _scores(logits: torch.Tensor, scoring: Scoring) -> torch.Tensor:
    return logits.softmax(dim=-1) if scoring is Scoring.SOFTMAX else logits.sigmoid()


def _chosen_ids(
    logits: torch.Tensor, method: RoutingMethod | GroupedTopK | SigmoidTopK | Llama4Sigmoid, top_k: int,
    correction: torch.Tensor | None,
) -> torch.Tensor:
    """The ``[T, top_k]`` experts each method chooses from float32 ``logits`` (as transformers' models do: on the
    softmax where they take the top-k of it, so that scores equal in float32 tie as they do there)."""
    if isinstance(method, GroupedTopK):
        return _grouped_choice(logits, method, top_k, correction)
    if method is RoutingMethod.SOFTMAX_TOPK:
        return logits.softmax(dim=-1).topk(top_k, dim=-1).indices
    if isinstance(method, SigmoidTopK):
        return logits.sigmoid().topk(top_k, dim=-1).indices
    return logits.topk(top_k, dim=-1).indices  # top-k-then-softmax and Llama 4 choose on the logits


def method_weights(
    logits: torch.Tensor, ids: torch.Tensor, method: RoutingMethod | GroupedTopK | SigmoidTopK | Llama4Sigmoid
) -> torch.Tensor:
    """The float32 ``[T, K]`` weights a routing method gives experts ``ids [T, K]`` of float32 ``logits [T, E]``:
    the one formula :func:`select_experts` routes with and runners hold a top-k's weights to
    (``from_router_logits``). Sparsemixer has none of this form (each pick's weight depends on the logits near it).
    """
    ids = ids.long()
    if method is RoutingMethod.SOFTMAX_TOPK:
        return logits.softmax(dim=-1).gather(1, ids)
    if method is RoutingMethod.TOPK_RENORMALIZE:
        return logits.gather(1, ids).softmax(dim=-1)
    if isinstance(method, GroupedTopK):
        weights = _scores(logits, method.scoring).gather(1, ids)
        if not method.renormalize:
            return weights
        total = weights.sum(dim=-1, keepdim=True)
        return weights / (total + 1e-20 if method.sum_floor is None else total.clamp(min=method.sum_floor))
    weights = logits.gather(1, ids).sigmoid()  # sigmoid top-k and Llama 4
    if isinstance(method, SigmoidTopK) and method.renormalize:
        return weights / weights.sum(dim=-1, keepdim=True)
    return weights


def _mixer_pick(scores: torch.Tensor, candidates: torch.Tensor, jitter_eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """One sparsemixer pick: the arg-max of ``candidates`` and its softmax among the candidates near it."""
    threshold, picked = candidates.max(dim=-1, keepdim=True)
    factor = scores.abs().clamp(min=threshold)
    far = ((threshold - scores) / factor) > (2 * jitter_eps)
    gates = torch.softmax(candidates.masked_fill(far, float("-inf")), dim=-1)
    return gates.gather(dim=-1, index=picked), picked


def _sparsemixer(logits: torch.Tensor, method: SparseMixer) -> tuple[torch.Tensor, torch.Tensor]:
    """PhiMoE's ``sparsemixer`` at inference (no Gumbel sampling, no gradient estimator)."""
    first_weight, first = _mixer_pick(logits, logits, method.jitter_eps)
    rest = torch.scatter(logits, -1, first, float("-inf"))
    second_weight, second = _mixer_pick(logits, rest, method.jitter_eps)
    return torch.cat((first_weight, second_weight), dim=-1), torch.cat((first, second), dim=-1)


def check_router_logits(router_logits: torch.Tensor, config: MoeRunnerConfig) -> None:
    """Raise unless ``router_logits`` is a float ``[T, num_experts]`` tensor of ``config``'s layer (metadata only):
    what :func:`select_experts` and the fused routing kernels take."""
    if config.slot_rows:
        raise ValueError(
            "config: a slot-row config (top_k 1 a (token, slot) row, a runner's over a dispatcher's rows) routes no "
            "tokens: route them with the layer's own config and top_k"
        )
    require_tensor("router_logits", router_logits)
    require_dtype("router_logits", router_logits, FLOAT_DTYPES)
    require_ndim("router_logits", router_logits, 2, "[num_tokens, num_experts]")
    if router_logits.shape[1] != config.num_experts:
        raise ValueError(
            f"router_logits: expected {config.num_experts} columns (num_experts), got {router_logits.shape[1]}"
        )


def check_correction_bias(score_correction_bias: torch.Tensor, router_logits: torch.Tensor, config: MoeRunnerConfig) -> None:
    """Raise unless ``score_correction_bias`` is a float ``[num_experts]`` tensor beside the logits, for a
    :class:`~moe_core.config.GroupedTopK` layer (metadata only: its values are the caller's to check)."""
    if not isinstance(config.routing_method, GroupedTopK):
        raise ValueError(f"score_correction_bias: only GroupedTopK routing takes one, not {config.routing_method.value}")
    require_tensor("score_correction_bias", score_correction_bias)
    require_dtype("score_correction_bias", score_correction_bias, FLOAT_DTYPES)
    require_shape("score_correction_bias", score_correction_bias, (config.num_experts,), "[num_experts]")
    require_same_device([("router_logits", router_logits), ("score_correction_bias", score_correction_bias)])


@run_eagerly
def select_experts(
    router_logits: torch.Tensor,
    config: MoeRunnerConfig,
    *,
    score_correction_bias: torch.Tensor | None | Unset = Unset.UNSET,
) -> TopKOutput:
    """The top-k ids and weights of ``router_logits [T, num_experts]`` under the config's routing method.

    ``score_correction_bias`` (``[num_experts]``) is taken by
    :class:`~moe_core.config.GroupedTopK` only, and there it must be given,
    ``None`` for a router without one: DeepSeek-V3's routing without its
    ``e_score_correction_bias`` picks other experts for a quarter of the
    tokens, so leaving it out is an error, not a default
    (:func:`route` passes the router's own). The weights exclude the
    config's ``routed_scaling_factor``, which runners apply to the output;
    under :class:`~moe_core.config.Llama4Sigmoid` they scale each expert's
    input (the config says so, and runners that cannot do that refuse it).
    """
    check_router_logits(router_logits, config)
    method = config.routing_method
    if isinstance(score_correction_bias, Unset):
        _require_correction_bias_said(
            "score_correction_bias", method, "None", "route(hidden_states, router, config) passes the router's own"
        )
        score_correction_bias = None
    if score_correction_bias is not None:
        check_correction_bias(score_correction_bias, router_logits, config)
        require_finite("score_correction_bias", score_correction_bias)
    logits = router_logits.float()
    if isinstance(method, SparseMixer):
        weights, ids = _sparsemixer(logits, method)
    else:
        ids = _chosen_ids(logits, method, config.top_k, score_correction_bias)
        weights = method_weights(logits, ids, method)
    return TopKOutput(ids.to(torch.int32), weights, router_logits, num_experts=config.num_experts, from_router_logits=True)


def check_router(router: Router, config: MoeRunnerConfig) -> None:
    """Raise ``ValueError`` unless ``router`` routes ``config``'s layer: its expert count, and a logit bias only
    where no correction bias belongs (a DeepSeek-V3 ``e_score_correction_bias`` passed as ``bias`` would move every
    weight, not only the choice): never under grouped or sigmoid top-k."""
    if router.num_experts != config.num_experts:
        raise ValueError(f"router: expected {config.num_experts} experts like the config, got {router.num_experts}")
    if router.bias is not None and isinstance(config.routing_method, GroupedTopK):
        raise ValueError(
            f"Router.bias: {config.routing_method.value} routing chooses on scores plus a correction bias, which goes in "
            "Router(score_correction_bias=...) (DeepSeek-V3's e_score_correction_bias); a logit bias under it is "
            "no model moe-core computes"
        )
    if router.bias is not None and isinstance(config.routing_method, SigmoidTopK):
        raise ValueError(
            f"Router.bias: no model moe-core computes routes {config.routing_method.value} on biased logits; sigmoid "
            "scores chosen with a correction bias (MiniMax-M2, AFMoE, LFM2) are GroupedTopK(n_group=1, topk_group=1, "
            "renormalize=...) with Router(score_correction_bias=...)"
        )
    if isinstance(router.score_correction_bias, Unset):
        _require_correction_bias_said(
            "Router.score_correction_bias", config.routing_method, "score_correction_bias=None",
            "MoeCheckpoint.router(layer) reads the checkpoint's",
        )


def _require_correction_bias_said(name: str, method: Routing, none: str, hint: str) -> None:
    """Refuse a correction bias left unset under :class:`~moe_core.config.GroupedTopK`, which chooses with it:
    ``none`` is how the caller says a router has none, ``hint`` where the bias comes from."""
    if isinstance(method, GroupedTopK):
        raise ValueError(
            f"{name}: {method.value} routing chooses with the router's correction bias (DeepSeek-V3's "
            f"e_score_correction_bias): pass it, or {none} for a router without one ({hint})"
        )


class FusedRouting(Protocol):
    """A kernel that computes :func:`select_experts`' top-k in one launch, reading nothing back to the host."""

    def __call__(
        self, router_logits: torch.Tensor, config: MoeRunnerConfig, *, score_correction_bias: torch.Tensor | None
    ) -> TopKOutput:
        """The top-k of ``router_logits [T, num_experts]``, as :func:`select_experts` takes them."""
        ...


@functools.cache
def _triton_installed() -> bool:
    """Whether triton can be imported (asked once: every forward on CUDA asks)."""
    return importlib.util.find_spec("triton") is not None


def fused_routing(config: MoeRunnerConfig, device: torch.device, *, interpreter: bool = False) -> FusedRouting | str:
    """The fused routing kernel for ``config``'s layer with router logits on ``device``, or why :func:`route` routes
    it with :func:`select_experts` instead.

    Automatically on CUDA devices only; ``interpreter`` also allows Triton's CPU interpreter (``TRITON_INTERPRET=1``),
    which is correct but slow.
    """
    on_cpu = f"the fused routing kernel runs on CUDA devices (logits on {device})"
    if device.type != "cuda" and not interpreter:
        return on_cpu
    if not _triton_installed():
        return "the fused routing kernel needs triton (pip install 'moe-core[triton]')"
    from moe_core.backends.triton import interpreted
    from moe_core.backends.triton.routing import fused_routing_refusal, fused_select_experts

    if device.type != "cuda" and not interpreted():
        return f"{on_cpu}, or on the CPU under Triton's interpreter (TRITON_INTERPRET=1)"
    refusal = fused_routing_refusal(config)
    return fused_select_experts if refusal is None else refusal


def routing_summary(config: MoeRunnerConfig, device: torch.device, *, fused: bool | None = None) -> str:
    """What :func:`route` computes ``config``'s routing with on ``device`` (given ``fused`` as it takes it), for a
    person reading a layer's summary."""
    if fused is False:
        return "routing: select_experts (fused=False)"
    kernel = fused_routing(config, device, interpreter=fused is True)
    if not isinstance(kernel, str):
        return "routing: fused Triton kernel"
    return f"routing: none, route(fused=True) refuses: {kernel}" if fused else f"routing: select_experts ({kernel})"


@run_eagerly
def route(
    hidden_states: torch.Tensor, router: Router, config: MoeRunnerConfig, *, fused: bool | None = None
) -> TopKOutput:
    """The routing of ``hidden_states [T, hidden_size]``: the router's logits, then their top-k.

    The top-k is the fused routing kernel's where :func:`fused_routing` gives one (on CUDA, for every method but
    sparsemixer and ``top_k`` up to 16: one launch, no read back, so a CUDA graph can capture it), else
    :func:`select_experts`'. The two agree on each row's set of ids and, to float32 rounding, their weights; the
    order within a row may differ. ``fused=True`` requires the kernel (raising ``ValueError`` with its reason,
    and allowing Triton's CPU interpreter), ``fused=False`` always takes ``select_experts``.
    """
    if fused is not None and not isinstance(fused, bool):
        raise TypeError(f"route: fused is True, False or None (automatic), got {fused!r}")
    check_router(router, config)
    logits = router.logits(hidden_states)
    bias = None if isinstance(router.score_correction_bias, Unset) else router.score_correction_bias  # checked above
    if fused is not False:
        kernel = fused_routing(config, logits.device, interpreter=fused is True)
        if not isinstance(kernel, str):
            return kernel(logits, config, score_correction_bias=bias)
        if fused:
            raise ValueError(f"route(fused=True): {kernel}")
    require_finite("hidden_states", hidden_states)  # else the top-k's weights are refused, which names them instead
    return select_experts(logits, config, score_correction_bias=bias)
