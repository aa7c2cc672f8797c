"""The protocols a backend implements: its quant info and its runner."""

from __future__ import annotations

from typing import Protocol, TypeGuard, TypeVar, runtime_checkable

import torch

from moe_core._checks import (
    require_distinct_per_row,
    require_finite,
    require_finite_non_negative,
    require_ids_in_range,
    values_readable,
)
from moe_core.config import GroupedTopK, MoeRunnerConfig, RoutedWeights, SparseMixer
from moe_core.dispatch import DispatchFormat, DispatchOutput
from moe_core.routing import method_weights, select_experts


class QuantInfo(Protocol):
    """Everything a backend needs besides the tokens, built once after loading.

    Each backend family has its own frozen class whose fields are exactly what
    its kernels take; these four facts let any runner check it against its
    config before it touches a kernel.
    """

    @property
    def num_experts(self) -> int:
        """Experts held: the config's ``num_local_experts``."""
        ...

    @property
    def hidden_size(self) -> int:
        """H."""
        ...

    @property
    def intermediate_size(self) -> int:
        """I, per partition."""
        ...

    @property
    def device(self) -> torch.device:
        """Where the tensors live."""
        ...


QuantInfoT_contra = TypeVar("QuantInfoT_contra", bound=QuantInfo, contravariant=True)


class Runner(Protocol[QuantInfoT_contra]):
    """Runs one MoE layer's experts for a dispatch, with one backend's quant info.

    ``Runner[Q]`` accepts only ``Q``: mypy rejects another backend's quant info.
    ``run`` takes its arguments by position only, so a runner may name its
    parameters as it likes without breaking a caller.
    """

    @property
    def config(self) -> MoeRunnerConfig:
        """The layer this runner was created for."""
        ...

    def run(self, dispatch: DispatchOutput, quant_info: QuantInfoT_contra, /) -> torch.Tensor:
        """The ``[T, H]`` output, in the dtype of ``dispatch.hidden_states``: a tensor of its own, never one whose
        storage an earlier output the caller holds shares, and without writing the dispatch's tensors."""
        ...


@runtime_checkable
class LayerChecked(Protocol):
    """Weights that check what their shapes cannot say about the layer they run (the experts a scalar input scale
    was collapsed from): routes call it when they bind canonical weights, :func:`check_run_inputs` on every run."""

    def check_layer(self, config: MoeRunnerConfig) -> None:
        """Raise ``ValueError`` naming the field unless the weights fit ``config``'s layer."""
        ...


def check_run_inputs(
    config: MoeRunnerConfig, dispatch: DispatchOutput, quant_info: QuantInfo, formats: tuple[DispatchFormat, ...]
) -> None:
    """Raise ``ValueError`` unless ``dispatch`` and ``quant_info`` fit ``config``.

    For backend authors: call it at the top of ``run``. It reads metadata only
    (no device synchronization, safe under CUDA graph capture); see
    :func:`check_run_values` for the values.
    """
    if dispatch.format not in formats:
        wanted = ", ".join(f.value for f in formats)
        raise ValueError(f"dispatch: expected format {wanted}, got {dispatch.format.value}")
    check_quant_info_sizes(config, quant_info)
    hidden = dispatch.hidden_states
    if hidden.shape[1] != config.hidden_size:
        raise ValueError(f"hidden_states: expected {config.hidden_size} columns (hidden_size), got {hidden.shape[1]}")
    if hidden.device != quant_info.device:
        raise ValueError(f"hidden_states: expected device {quant_info.device} like the quant info, got {hidden.device}")
    topk = dispatch.topk
    if topk.top_k != config.top_k:
        hint = " (an expert-parallel dispatcher's slot rows: bind for dispatcher.runner_config(config))" if topk.top_k == 1 else ""
        raise ValueError(f"topk_ids: expected {config.top_k} columns (top_k), got {topk.top_k}{hint}")
    if topk.num_experts != config.num_experts:
        raise ValueError(f"topk.num_experts: expected {config.num_experts} from the config, got {topk.num_experts}")
    checked: object = quant_info
    if _layer_checked(checked):
        checked.check_layer(config)


def check_quant_info_sizes(config: MoeRunnerConfig, quant_info: QuantInfo) -> None:
    """Raise ``ValueError`` unless ``quant_info`` holds ``config``'s local experts, hidden and intermediate sizes
    (binding checks it once, :func:`check_run_inputs` on every run)."""
    expected = {
        "num_experts": config.num_local_experts,
        "hidden_size": config.hidden_size,
        "intermediate_size": config.intermediate_size_per_partition,
    }
    for name, value in expected.items():
        actual = getattr(quant_info, name)
        if actual != value:
            raise ValueError(f"quant_info.{name}: expected {value} from the config, got {actual}")


_LAYER_CHECKED: dict[type, bool] = {}
"""Whether quant infos of each type seen are :class:`LayerChecked`."""


def _layer_checked(quant_info: object) -> TypeGuard[LayerChecked]:
    """``isinstance(quant_info, LayerChecked)``, answered once per type: a protocol's ``isinstance`` walks its members
    each time, and :func:`check_run_inputs` runs on every forward."""
    kind = type(quant_info)
    known = _LAYER_CHECKED.get(kind)
    if known is None:
        known = _LAYER_CHECKED[kind] = isinstance(quant_info, LayerChecked)
    return known


def check_run_values(config: MoeRunnerConfig, dispatch: DispatchOutput) -> None:
    """Raise ``ValueError`` unless the dispatch's values are valid for ``config``.

    Every top-k id a global expert id of ``config`` and distinct within its
    row, top-k weights and hidden states finite, and, where the top-k was
    built with ``check_values``, the weights what the config's routing method
    gives (:class:`~moe_core.config.RoutedWeights`: weights already
    multiplied by ``routed_scaling_factor``, or not renormalized, are
    refused where they break its bound; where the top-k says it was routed
    from the router logits it carries, ``from_router_logits``, wherever they
    differ from the method's weights of those logits for its ids). Reads the values back (device synchronizations; skipped on meta
    and during CUDA graph capture): for reference and debugging runners, and
    for every bound runner whose top-k checks its values.
    """
    topk = dispatch.topk
    require_ids_in_range("topk_ids", topk.topk_ids, config.num_experts, "num_experts")
    require_distinct_per_row("topk_ids", topk.topk_ids)
    require_finite_non_negative("topk_weights", topk.topk_weights)
    require_finite("hidden_states", dispatch.hidden_states)
    if config.slot_rows:
        _require_local_rows(topk.topk_ids, config)
    if topk.check_values:
        routed = topk.router_logits is not None and topk.from_router_logits is True
        _require_routed_weights(topk.topk_weights, config, routed)
        if routed and topk.router_logits is not None:
            _require_weights_of_logits(topk.topk_weights, topk.topk_ids, topk.router_logits, config)


def _require_local_rows(ids: torch.Tensor, config: MoeRunnerConfig) -> None:
    """Slot rows reach only the rank that holds their expert: a row for another expert means a runner made for
    another rank's part of the layer (it would compute zeros for every row), so it is refused by name."""
    if not values_readable(ids) or ids.numel() == 0:
        return
    first, stop = config.local_expert_offset, config.local_expert_offset + config.num_local_experts
    outside = (ids < first) | (ids >= stop)
    if bool(outside.any()):
        expert = int(ids[outside][0])
        raise ValueError(
            f"topk_ids: a slot row for expert {expert} reached a runner of experts [{first}, {stop}): dispatchers "
            "deliver each row to the rank holding its expert; was this forward built for another rank "
            "(dispatcher.runner_config(config), its weights from placement.local_slice)?"
        )


ROUTED_WEIGHTS_SLACK = 1e-2
"""How far a token's weights may sit outside their method's bound: weights computed in bf16 and summed in float32
(k = 8: at most about 8 x 2^-9)."""


RENORMALIZED_EVIDENCE = 4
"""Tokens whose weights all sum to 1 before a batch counts as renormalized under a method that does not
renormalize (a softmax top-k of k < E experts, or k sigmoid scores, sums to 1 within float32 rounding on a token by
coincidence, not on four)."""


SATURATED_WEIGHT = 1 - 1e-3
"""A token whose largest of several weights reaches this is a saturated router's (nearly all its mass on one
expert): its weights sum to 1 under any method, so it is no evidence of renormalization (adversarial pass 16,
c17). One weight renormalized is exactly 1, which a sigmoid reaches only past a logit of about 17."""


def _stored_roundoff(weights: torch.Tensor) -> float:
    """The unit roundoff of the narrowest floating type holding every weight exactly: renormalized in bf16 and cast
    to float32, weights sum to 1 only within bf16's rounding (adversarial pass 16, c07)."""
    for narrow in (torch.bfloat16, torch.float16):
        if weights.dtype == narrow or torch.equal(weights.to(narrow).to(weights.dtype), weights):
            return torch.finfo(narrow).eps / 2
    return torch.finfo(torch.float32).eps / 2


def _renormalized(weights: torch.Tensor, num_experts: int) -> bool:
    """Whether every token's weights sum to 1 within the rounding of a renormalization stored in their precision (a
    top-1's weight is 1 exactly), over enough tokens that are not saturated to tell (:data:`RENORMALIZED_EVIDENCE`,
    :data:`SATURATED_WEIGHT`), with fewer slots than experts. Each stored weight is off by at most the roundoff
    relative to itself, so their sum is off by at most the roundoff (and float32's own rounding before it)."""
    top_k = weights.shape[1]
    slack = 1.5 * _stored_roundoff(weights) + 4 * top_k * torch.finfo(torch.float32).eps
    if top_k >= num_experts or float((weights.double().sum(dim=1) - 1).abs().max()) > slack:
        return False
    if top_k == 1:
        return bool((weights == 1.0).all()) and weights.shape[0] >= RENORMALIZED_EVIDENCE
    return int((weights.amax(dim=1) < SATURATED_WEIGHT).sum()) >= RENORMALIZED_EVIDENCE


def _require_routed_weights(weights: torch.Tensor, config: MoeRunnerConfig, routed: bool) -> None:
    """Raise ``ValueError`` naming the routing method unless every token's weights satisfy its bound; where they
    do not come with the logits they were ``routed`` from, also where every token's weights sum to 1 under a method
    that does not renormalize (renormalized weights, most likely). With the logits, the weights are checked against
    them exactly instead: a saturated or masked router's own weights sum to 1 too (adversarial pass 16, c09)."""
    if not values_readable(weights) or not weights.numel():
        return
    method = config.routing_method
    bound = method.routed_weights
    sums = weights.sum(dim=1)
    if bound is RoutedWeights.SUM_TO_ONE:
        worst = float((sums - 1).abs().max())
        bad = worst > ROUTED_WEIGHTS_SLACK
        found = f"a token's weights sum to {float(sums[(sums - 1).abs().argmax()]):.4g}"
    elif bound is RoutedWeights.SUM_AT_MOST_ONE:
        bad = float(sums.max()) > 1 + ROUTED_WEIGHTS_SLACK
        found = f"a token's weights sum to {float(sums.max()):.4g}"
    else:
        bad = float(weights.max()) > 1 + ROUTED_WEIGHTS_SLACK
        found = f"a weight of {float(weights.max()):.4g}"
    # a renormalizing method with a floor under its sum (ERNIE 4.5's moe_norm_min) sums to 1 wherever the floor is
    # below the sum, which is nearly everywhere: its bound is at most one, its weights' sums are no evidence
    floored = isinstance(method, GroupedTopK) and method.renormalize
    suspect = not (bad or routed or floored) and bound is not RoutedWeights.SUM_TO_ONE
    if suspect and _renormalized(weights, config.num_experts):
        raise ValueError(
            f"topk_weights: {method.value} routing does not renormalize its weights, yet every one of the "
            f"{int(sums.numel())} tokens' weights sums to 1 (renormalized weights, or another routing method's; build "
            "the top-k with moe_core.select_experts, or check_values=False to skip the value checks)"
        )
    if bad:
        scaling = (
            f"; routed_scaling_factor={config.routed_scaling_factor:g} is the runner's to apply, not the weights'"
            if config.routed_scaling_factor != 1.0 else ""
        )
        raise ValueError(
            f"topk_weights: {method.value} routing gives weights where {bound.value}, but {found}{scaling} "
            f"(build the top-k with moe_core.select_experts, or check_values=False to skip the value checks)"
        )


TIED_LOGITS = 1e-5
"""How far (relative to the logits' magnitude) a chosen expert's logit may sit below an unchosen one's: scores that
tie in float32 (a saturated softmax or sigmoid) are chosen in either order."""


def _require_top_ids(ids: torch.Tensor, logits: torch.Tensor, method: str) -> None:
    """Raise ``ValueError`` unless each token's ids are a top-k of its logits (every method but grouped top-k and
    sparsemixer chooses on the logits or a monotone map of them): weights computed right for other ids pass the
    weights' check."""
    if ids.shape[1] >= logits.shape[1]:
        return
    chosen = logits.gather(1, ids.long())
    others = logits.scatter(1, ids.long(), float("-inf")).amax(dim=1)
    slack = TIED_LOGITS * (1 + logits.abs().amax(dim=1))
    short = chosen.amin(dim=1) < others - slack
    if bool(short.any()):
        token = int(short.nonzero()[0, 0])
        raise ValueError(
            f"topk_ids: {method} routing chooses each token's {ids.shape[1]} highest-scoring experts of its router_logits, "
            f"but token {token} has {ids[token].tolist()} (logits {[round(v, 4) for v in chosen[token].tolist()]}) while "
            f"an unchosen expert scores {float(others[token]):.4g} (ids of other logits or another method? build the "
            "top-k with moe_core.select_experts, or from_router_logits=False for a top-k edited after routing)"
        )


def _require_weights_of_logits(
    weights: torch.Tensor, ids: torch.Tensor, logits: torch.Tensor, config: MoeRunnerConfig
) -> None:
    """Raise ``ValueError`` unless ``weights`` are what the routing method gives the top-k's ids of the router
    logits it was routed from (within :data:`ROUTED_WEIGHTS_SLACK`): weights scaled by ``routed_scaling_factor``
    inside the bound (softmax weights x 2 that stay below 1, a ``select_experts`` top-k edited with
    ``attrs.evolve``) are caught here. A top-k edited after routing (an engine's expert remap, a capacity drop)
    says so by ``from_router_logits=False`` and is not held to its logits."""
    if not (values_readable(weights) and values_readable(logits)) or not weights.numel():
        return
    method = config.routing_method
    if isinstance(method, SparseMixer):  # each pick's weight depends on the logits near it: routed again, ids included
        routed = select_experts(logits, config)
        routed_ids = routed.topk_ids.to(ids.device)
        if not torch.equal(routed_ids, ids.to(torch.int32)):
            row = int((routed_ids != ids).any(dim=1).nonzero()[0, 0])
            raise ValueError(
                f"topk_ids: {method.value} routing of the top-k's own router_logits picks experts "
                f"{routed_ids[row].tolist()} for token {row}, the top-k has {ids[row].tolist()} (routed by another "
                "method? build the top-k with moe_core.select_experts, or check_values=False to skip the value checks)"
            )
        expected = routed.topk_weights
    else:
        if not isinstance(method, GroupedTopK):  # its choice adds the correction bias, which a top-k does not carry
            _require_top_ids(ids, logits.float().to(ids.device), method.value)
        expected = method_weights(logits.float(), ids, method)
    off = (weights - expected.to(weights.device)).abs()
    if float(off.max()) > ROUTED_WEIGHTS_SLACK:
        token, slot = divmod(int(off.argmax()), weights.shape[1])
        got, want = float(weights[token, slot]), float(expected[token, slot])
        ratio = f" ({got / want:.4g} times it)" if want > 0 else ""
        raise ValueError(
            f"topk_weights: {config.routing_method.value} routing of the top-k's own router_logits gives token {token}'s "
            f"expert {int(ids[token, slot])} the weight {want:.4g}, got {got:.4g}{ratio} (weights already multiplied by "
            "routed_scaling_factor, which the runner applies, or routed by another method? build the top-k with "
            "moe_core.select_experts, or check_values=False to skip the value checks)"
        )
