"""The static shape and semantics of one MoE layer, shared by every backend.

The activation and the routing method are typed values: an enum member where
the method has no parameter, a frozen class where it has some, so a wrong
parameter is a type error and every value hashes (backends keep them in sets
and tables). Each value says its name (``.value``) for messages and tables.
"""

from __future__ import annotations

import enum
import math
from typing import TypeAlias, final

import attrs
import torch
import torch.nn.functional as F

from moe_core._checks import require_int


class Activation(enum.Enum):
    """The activation between the two expert GEMMs, for those without parameters.

    A gated one reads ``w13``'s output as ``[gate | up]`` (gate first, as
    checkpoints store w1/w3) and computes ``act(gate) * up``; a non-gated one
    (``RELU2``) has ``w13`` of ``I`` rows, not ``2I``, and computes ``act(h)``.
    """

    SILU_GATED = "silu"
    GELU_GATED = "gelu"
    """Exact (erf) GELU."""
    GELU_TANH_GATED = "gelu_tanh"
    """GELU's tanh approximation (``gelu_pytorch_tanh``)."""
    RELU2 = "relu2"
    """Non-gated ``relu(h) ** 2`` (Nemotron-H)."""

    @property
    def gated(self) -> bool:
        """True when ``w13`` holds gate and up halves (``2I`` rows)."""
        return self is not Activation.RELU2

    def apply(self, gate_up: torch.Tensor) -> torch.Tensor:
        """The hidden activation of ``w13``'s output (``[gate | up]`` along the last dim when gated)."""
        if self is Activation.RELU2:
            return torch.square(F.relu(gate_up))
        gate, up = gate_up.chunk(2, dim=-1)
        if self is Activation.SILU_GATED:
            return F.silu(gate) * up
        if self is Activation.GELU_GATED:
            return F.gelu(gate) * up
        return F.gelu(gate, approximate="tanh") * up


HIDDEN_ACTS: dict[str, Activation] = {
    "silu": Activation.SILU_GATED,
    "swish": Activation.SILU_GATED,
    "gelu": Activation.GELU_GATED,
    "gelu_python": Activation.GELU_GATED,
    "gelu_pytorch_tanh": Activation.GELU_TANH_GATED,
    "gelu_new": Activation.GELU_TANH_GATED,
    "gelu_fast": Activation.GELU_TANH_GATED,
    "gelu_accurate": Activation.GELU_TANH_GATED,
    "relu2": Activation.RELU2,
}
"""transformers' ``hidden_act`` names -> the activation that computes the same (its ``ACT2FN``, within 1e-9:
``gelu_new``, ``gelu_fast`` and ``gelu_accurate`` write out the tanh approximation); a name missing here
(``quick_gelu``, ``gelu_10``, ...) is refused by name, never run as another."""


def _positive_finite(
    instance: object, attribute: attrs.Attribute[float] | attrs.Attribute[float | None], value: object
) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{type(instance).__name__}.{attribute.name}: expected a float, got {type(value).__name__}")
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"{type(instance).__name__}.{attribute.name}: expected a finite value > 0, got {value}")


def _nonnegative_finite(instance: object, attribute: attrs.Attribute[float], value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{type(instance).__name__}.{attribute.name}: expected a float, got {type(value).__name__}")
    if not (math.isfinite(value) and value >= 0):
        raise ValueError(f"{type(instance).__name__}.{attribute.name}: expected a finite value >= 0, got {value}")


def _positive_limit(instance: object, attribute: attrs.Attribute[float], value: float) -> None:
    """:func:`_positive_finite` for a required field (mypy infers its type from the validator)."""
    _positive_finite(instance, attribute, value)


def _bool(instance: object, attribute: attrs.Attribute[bool], value: object) -> None:
    if not isinstance(value, bool):
        raise TypeError(f"{type(instance).__name__}.{attribute.name}: expected a bool, got {type(value).__name__}")


def _positive_int(instance: object, attribute: attrs.Attribute[int], value: int) -> None:
    require_int(f"{type(instance).__name__}.{attribute.name}", value, minimum=1)


@final
@attrs.frozen(kw_only=True)
class ClampedSwiglu:
    """gpt-oss's SwiGLU: ``(up + 1) * gate * sigmoid(alpha * gate)``, gate clamped from above at ``limit``, up to
    ``[-limit, limit]``.

    gpt-oss checkpoints interleave gate and up rows; that is a property of
    the checkpoint's layout (:class:`~moe_core.formats.dense.weights.GateUpLayout`),
    undone when the weights are loaded: ``w13`` is ``[gate | up]`` here too.
    """

    alpha: float = attrs.field(default=1.702, validator=_positive_finite)
    limit: float = attrs.field(default=7.0, validator=_positive_finite)

    @property
    def value(self) -> str:
        """The name for messages and tables."""
        return "clamped_swiglu"

    @property
    def gated(self) -> bool:
        """Gate and up halves: always."""
        return True

    def apply(self, gate_up: torch.Tensor) -> torch.Tensor:
        """The activation of ``[gate | up]``, in transformers' order of operations."""
        gate, up = gate_up.chunk(2, dim=-1)
        gate = gate.clamp(min=None, max=self.limit)
        up = up.clamp(min=-self.limit, max=self.limit)
        glu = gate * torch.sigmoid(gate * self.alpha)
        return (up + 1) * glu


class GateClamp(enum.Enum):
    """Where :class:`LimitedSwiglu` clamps the gate half from above: the models that clamp disagree."""

    BEFORE_SILU = "before_silu"
    """``silu(min(gate, limit))`` (DeepSeek-V4, GLM-5-Next, HY-V4)."""
    AFTER_SILU = "after_silu"
    """``min(silu(gate), limit)`` (Step 3.7)."""


@final
@attrs.frozen(kw_only=True)
class LimitedSwiglu:
    """Gated SiLU with limits: the gate half clamped from above at ``limit`` (before or after its SiLU, as
    ``gate_clamp`` says), the up half to ``[-limit, limit]``; no alpha and no ``+ 1`` (gpt-oss's is
    :class:`ClampedSwiglu`).

    ``gate_clamp`` has no default: the two placements give different outputs
    wherever the gate passes the limit, and each model family uses one.
    """

    limit: float = attrs.field(validator=_positive_limit)
    gate_clamp: GateClamp

    def __attrs_post_init__(self) -> None:
        if not isinstance(self.gate_clamp, GateClamp):
            raise TypeError(f"LimitedSwiglu.gate_clamp: expected a GateClamp, got {self.gate_clamp!r}")

    @property
    def value(self) -> str:
        """The name for messages and tables."""
        return "swiglu_limit" if self.gate_clamp is GateClamp.BEFORE_SILU else "swiglu_limit_after_silu"

    @property
    def gated(self) -> bool:
        """Gate and up halves: always."""
        return True

    def apply(self, gate_up: torch.Tensor) -> torch.Tensor:
        """The activation of ``[gate | up]``, in transformers' order of operations."""
        gate, up = gate_up.chunk(2, dim=-1)
        up = up.clamp(min=-self.limit, max=self.limit)
        if self.gate_clamp is GateClamp.BEFORE_SILU:
            return F.silu(gate.clamp(min=None, max=self.limit)) * up
        return F.silu(gate).clamp(min=None, max=self.limit) * up


ExpertActivation: TypeAlias = Activation | ClampedSwiglu | LimitedSwiglu
"""Every activation a layer may name."""

ACTIVATION_TYPES = (Activation, ClampedSwiglu, LimitedSwiglu)
"""The classes of :data:`ExpertActivation`, for checks at run time."""


class RoutedWeights(enum.Enum):
    """What every token's top-k weights satisfy under a routing method (before ``routed_scaling_factor``, which
    runners apply to the output): a dispatch routed elsewhere must satisfy it too, and is checked with its values."""

    SUM_TO_ONE = "each token's weights sum to 1"
    """Renormalized methods."""
    SUM_AT_MOST_ONE = "each token's weights sum to at most 1"
    """Softmax over all experts, k of the probabilities kept."""
    EACH_AT_MOST_ONE = "each weight is at most 1"
    """Sigmoid scores (and PhiMoE's per-pick softmaxes), not renormalized."""


class RoutingMethod(enum.Enum):
    """How router logits become top-k ids and weights, for the methods without parameters.

    Runners that take precomputed top-k (the standard dispatch format) apply
    the weights to the experts' outputs whatever the method; kernels that
    route internally from ``router_logits`` must honour it.
    """

    SOFTMAX_TOPK = "softmax_topk"
    """Softmax over all experts, then keep the top-k probabilities as they are."""
    TOPK_RENORMALIZE = "topk_renormalize"
    """Top-k of the logits, then softmax over the k picked (weights sum to 1)."""

    @property
    def scales_input(self) -> bool:
        """False: the weights scale each expert's output."""
        return False

    @property
    def routed_weights(self) -> RoutedWeights:
        """What its top-k weights satisfy."""
        return RoutedWeights.SUM_TO_ONE if self is RoutingMethod.TOPK_RENORMALIZE else RoutedWeights.SUM_AT_MOST_ONE


@final
@attrs.frozen(kw_only=True)
class SigmoidTopK:
    """Sigmoid of each logit, the top-k of those scores, divided by their sum when ``renormalize``."""

    renormalize: bool = attrs.field(validator=_bool)

    @property
    def value(self) -> str:
        """The name for messages and tables."""
        return "sigmoid_topk_renormalize" if self.renormalize else "sigmoid_topk"

    @property
    def scales_input(self) -> bool:
        """False: the weights scale each expert's output."""
        return False

    @property
    def routed_weights(self) -> RoutedWeights:
        """What its top-k weights satisfy."""
        return RoutedWeights.SUM_TO_ONE if self.renormalize else RoutedWeights.EACH_AT_MOST_ONE


class Scoring(enum.Enum):
    """How :class:`GroupedTopK` turns logits into the scores that choose experts and weight them."""

    SIGMOID = "sigmoid"
    """Each logit through a sigmoid (DeepSeek-V3, GLM4-MoE)."""
    SOFTMAX = "softmax"
    """A softmax over all experts (DeepSeek-V2's group-limited greedy, Mistral 4, ERNIE 4.5)."""


class GroupScore(enum.Enum):
    """How :class:`GroupedTopK` scores a group of experts to keep the best ``topk_group`` groups."""

    TOP2_SUM = "top2_sum"
    """The sum of its two best (corrected) scores (DeepSeek-V3, Mistral 4)."""
    MAX = "max"
    """Its best score (DeepSeek-V2's group-limited greedy)."""


def _optional_positive_finite(instance: object, attribute: attrs.Attribute[float | None], value: object) -> None:
    if value is not None:
        _positive_finite(instance, attribute, value)


@final
@attrs.frozen(kw_only=True)
class GroupedTopK:
    """DeepSeek-V3's grouped top-k and its relatives: experts picked within the best groups by corrected scores.

    The experts form ``n_group`` groups of consecutive ids. Each logit becomes
    a score (``scoring``: sigmoid, or a softmax over all experts); a group
    scores the sum of its two best ``score + e_score_correction_bias`` (or its
    best one: ``group_score``); the ``topk_group`` best groups stay, and the
    top-k of the corrected scores among their experts are picked. Each weight
    is its uncorrected score, divided by the sum of the k (plus 1e-20) when
    ``renormalize``, or by ``max(sum, sum_floor)`` where a ``sum_floor`` is
    given (ERNIE 4.5's ``moe_norm_min``); the config's
    ``routed_scaling_factor`` multiplies the output. The correction bias is
    a learned tensor: the :class:`~moe_core.routing.Router` holds it. Experts
    of dropped groups are never picked (DeepSeek-V2 and Mistral 4 mask them
    with 0.0 rather than -inf: the same choice wherever the kept groups hold k
    experts with a nonzero score).
    """

    n_group: int = attrs.field(validator=_positive_int)
    topk_group: int = attrs.field(validator=_positive_int)
    renormalize: bool = attrs.field(validator=_bool)
    scoring: Scoring = Scoring.SIGMOID
    group_score: GroupScore = GroupScore.TOP2_SUM
    sum_floor: float | None = attrs.field(default=None, validator=_optional_positive_finite)

    def __attrs_post_init__(self) -> None:
        if self.topk_group > self.n_group:
            raise ValueError(f"GroupedTopK.topk_group: expected at most n_group={self.n_group}, got {self.topk_group}")
        for name, kind in (("scoring", Scoring), ("group_score", GroupScore)):
            if not isinstance(getattr(self, name), kind):
                raise TypeError(f"GroupedTopK.{name}: expected a {kind.__name__}, got {getattr(self, name)!r}")
        if self.sum_floor is not None and not self.renormalize:
            raise ValueError("GroupedTopK.sum_floor: bounds the renormalizing sum, so it needs renormalize=True")

    @property
    def value(self) -> str:
        """The name for messages and tables: ``grouped_topk``, with the scoring and group score where they are not
        DeepSeek-V3's."""
        name = "grouped_topk"
        if self.scoring is not Scoring.SIGMOID:
            name += f"_{self.scoring.value}"
        if self.group_score is not GroupScore.TOP2_SUM:
            name += f"_group_{self.group_score.value}"
        return name

    @property
    def scales_input(self) -> bool:
        """False: the weights scale each expert's output."""
        return False

    @property
    def routed_weights(self) -> RoutedWeights:
        """What its top-k weights satisfy: renormalized ones sum to 1 (at most 1 under a floor), softmax scores to
        at most 1, sigmoid scores are each at most 1."""
        if self.renormalize:
            return RoutedWeights.SUM_TO_ONE if self.sum_floor is None else RoutedWeights.SUM_AT_MOST_ONE
        return RoutedWeights.SUM_AT_MOST_ONE if self.scoring is Scoring.SOFTMAX else RoutedWeights.EACH_AT_MOST_ONE


@final
@attrs.frozen
class Llama4Sigmoid:
    """Llama 4's routing: the top-k logits, each through a sigmoid, scale each picked expert's INPUT.

    An expert of token ``x`` computes ``mlp(sigmoid(logit) * x)`` and its
    output is summed with weight 1; with a nonlinear MLP that differs from
    scaling the output, so a runner that scales outputs must refuse it.
    """

    @property
    def value(self) -> str:
        """The name for messages and tables."""
        return "llama4_sigmoid"

    @property
    def scales_input(self) -> bool:
        """True: the weights scale each expert's input."""
        return True

    @property
    def routed_weights(self) -> RoutedWeights:
        """What its top-k weights satisfy."""
        return RoutedWeights.EACH_AT_MOST_ONE


@final
@attrs.frozen(kw_only=True)
class SparseMixer:
    """PhiMoE's sparsemixer at inference: two experts, each from a softmax over the logits near the best one.

    The first is the arg-max; its weight is its softmax among the logits
    ``l`` with ``(max - l) / max(|l|, max) <= 2 * jitter_eps``. The second is
    the arg-max of the rest, weighted the same way among the rest (threshold
    from the second's logit). Top-2 only.
    """

    jitter_eps: float = attrs.field(validator=_nonnegative_finite)

    @property
    def value(self) -> str:
        """The name for messages and tables."""
        return "sparsemixer"

    @property
    def scales_input(self) -> bool:
        """False: the weights scale each expert's output."""
        return False

    @property
    def routed_weights(self) -> RoutedWeights:
        """What its top-k weights satisfy."""
        return RoutedWeights.EACH_AT_MOST_ONE


Routing: TypeAlias = RoutingMethod | SigmoidTopK | GroupedTopK | Llama4Sigmoid | SparseMixer
"""Every routing method a layer may name."""

ROUTING_TYPES = (RoutingMethod, SigmoidTopK, GroupedTopK, Llama4Sigmoid, SparseMixer)
"""The classes of :data:`Routing`, for checks at run time."""


def _require_kind(name: str, value: object, kinds: tuple[type, ...]) -> None:
    if not isinstance(value, kinds):
        names = [kind.__name__ for kind in kinds]
        article = "an" if names[0][0] in "AEIOU" else "a"
        raise TypeError(f"{name}: expected {article} {', '.join(names[:-1])} or {names[-1]}, got {value!r}")


@final
@attrs.frozen
class MoeRunnerConfig:
    """Sizes and semantics of an MoE layer as seen by this rank.

    Expert ids in a dispatch are global (``0 <= id < num_experts``); this rank
    owns ``[local_expert_offset, local_expert_offset + num_local_experts)`` and
    contributes nothing for the rest (expert parallelism).
    """

    num_experts: int
    hidden_size: int
    intermediate_size_per_partition: int
    top_k: int
    num_local_experts: int = attrs.field(default=attrs.Factory(lambda self: self.num_experts, takes_self=True))
    local_expert_offset: int = 0
    activation: ExpertActivation = Activation.SILU_GATED
    routing_method: Routing = RoutingMethod.TOPK_RENORMALIZE
    routed_scaling_factor: float = 1.0
    expert_biases: bool = attrs.field(default=False, validator=_bool)
    """Each expert adds a bias after both GEMMs (gpt-oss): a backend whose kernels add none refuses the layer."""
    slot_rows: bool = attrs.field(default=False, validator=_bool, kw_only=True)
    """A runner's config over a dispatcher's slot rows (one ``(token, slot)`` pair a row, ``top_k`` 1), made by
    :func:`moe_core.distributed.slot_config`; routing refuses it (tokens route with the layer's own ``top_k``), and a
    checkpoint takes ``top_k`` 1 in place of its own only with it."""

    def __attrs_post_init__(self) -> None:
        for name in ("num_experts", "hidden_size", "intermediate_size_per_partition", "top_k", "num_local_experts"):
            require_int(name, getattr(self, name), minimum=1)
        require_int("local_expert_offset", self.local_expert_offset, minimum=0)
        if self.slot_rows and self.top_k != 1:
            raise ValueError(f"top_k: a slot-row config runs one (token, slot) pair a row, top_k 1, got {self.top_k}")
        if self.top_k > self.num_experts:
            raise ValueError(f"top_k: expected at most num_experts={self.num_experts}, got {self.top_k}")
        if self.local_expert_offset + self.num_local_experts > self.num_experts:
            raise ValueError(
                "num_local_experts, local_expert_offset: local experts "
                f"[{self.local_expert_offset}, {self.local_expert_offset + self.num_local_experts}) "
                f"exceed num_experts={self.num_experts}"
            )
        _require_kind("activation", self.activation, ACTIVATION_TYPES)
        _require_kind("routing_method", self.routing_method, ROUTING_TYPES)
        self._check_routing()
        factor = self.routed_scaling_factor
        if isinstance(factor, bool) or not isinstance(factor, (int, float)):
            raise TypeError(f"routed_scaling_factor: expected a float, got {type(factor).__name__}")
        if not (math.isfinite(factor) and factor > 0):
            raise ValueError(f"routed_scaling_factor: expected a finite value > 0, got {factor}")

    def _check_routing(self) -> None:
        """The routing method's own constraints on the sizes."""
        routing = self.routing_method
        if isinstance(routing, SparseMixer) and self.top_k != 2:
            raise ValueError(f"top_k: sparsemixer routing picks exactly 2 experts, got top_k={self.top_k}")
        if isinstance(routing, GroupedTopK):
            if self.num_experts % routing.n_group:
                raise ValueError(
                    f"routing_method: GroupedTopK.n_group={routing.n_group} must divide num_experts={self.num_experts}"
                )
            per_group = self.num_experts // routing.n_group
            if per_group < 2 and routing.group_score is GroupScore.TOP2_SUM:
                raise ValueError(f"routing_method: a group scores its best two experts, got {per_group} per group")
            if self.top_k > routing.topk_group * per_group:
                raise ValueError(
                    f"top_k: expected at most the {routing.topk_group * per_group} experts of the kept groups, "
                    f"got {self.top_k}"
                )


def config_differences(config: MoeRunnerConfig, other: MoeRunnerConfig, whose: str) -> list[str]:
    """Each field where ``other`` (``whose``) differs from ``config``, as ``name value (whose: other value)``."""
    return [
        f"{field.name} {getattr(config, field.name)!r} ({whose}: {getattr(other, field.name)!r})"
        for field in attrs.fields(MoeRunnerConfig)
        if getattr(config, field.name) != getattr(other, field.name)
    ]


EXAMPLE_LIMIT = 1.0
"""The limit of the example clamped and limited SwiGLUs: ``moe-core check``'s layers have pre-activations of about
unit scale, which pass it often (the models' own limits, 7 or 10, they never reach), so a backend that ignores the
limit, or clamps the gate on the other side of its SiLU, is off there."""

EXAMPLE_ACTIVATIONS: tuple[ExpertActivation, ...] = (
    *Activation,
    ClampedSwiglu(limit=EXAMPLE_LIMIT),
    *(LimitedSwiglu(limit=EXAMPLE_LIMIT, gate_clamp=clamp) for clamp in GateClamp),
)
"""One value of every activation (gpt-oss's alpha for the clamped SwiGLU, each placement of the limited one's gate
clamp, both with :data:`EXAMPLE_LIMIT`): what ``moe-core info`` asks each backend about and ``moe-core check`` runs
each backend on."""


def example_routings(num_experts: int, top_k: int) -> tuple[Routing, ...]:
    """One value of every routing method (each scoring of :class:`GroupedTopK`) that a layer of ``num_experts``
    experts and ``top_k`` takes: the most groups of at least two experts (up to 8), half of them kept; sparsemixer
    at ``top_k == 2`` only. What ``moe-core info`` and ``moe-core check`` try; a new method belongs here."""
    routings: list[Routing] = [*RoutingMethod, SigmoidTopK(renormalize=False), SigmoidTopK(renormalize=True)]
    groups = next((g for g in (8, 4, 2, 1) if num_experts % g == 0 and num_experts // g >= 2), None)
    if groups is not None and top_k <= max(1, groups // 2) * (num_experts // groups):
        kept = max(1, groups // 2)
        routings += [
            GroupedTopK(n_group=groups, topk_group=kept, renormalize=True),
            GroupedTopK(n_group=groups, topk_group=kept, renormalize=True, scoring=Scoring.SOFTMAX),
            GroupedTopK(n_group=groups, topk_group=kept, renormalize=False, scoring=Scoring.SOFTMAX,
                        group_score=GroupScore.MAX),
        ]
    routings.append(Llama4Sigmoid())
    if top_k == 2:
        routings.append(SparseMixer(jitter_eps=0.01))
    return tuple(routings)
