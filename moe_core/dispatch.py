"""What a runner receives for one forward: tokens and their routing."""

from __future__ import annotations

import enum
from typing import Protocol, final

import attrs
import torch

from moe_core._compile import constructed_eagerly
from moe_core._checks import (
    FLOAT_DTYPES,
    require_distinct_per_row,
    require_dtype,
    require_finite_non_negative,
    require_ids_in_range,
    require_int,
    require_ndim,
    require_same_device,
    require_shape,
    require_tensor,
)


class DispatchFormat(enum.Enum):
    """How tokens are laid out when they reach the runner."""

    STANDARD = "standard"
    """All of this rank's tokens, unpermuted, with their global top-k routing."""


@constructed_eagerly
@final
@attrs.frozen(eq=False)
class TopKOutput:
    """The router's choice for each token.

    ``topk_ids`` are global expert ids (int32 ``[T, K]``, each in
    ``[0, num_experts)``, distinct within a row: top-k routing never picks an
    expert twice), ``topk_weights`` their float32 weights; ``router_logits``
    (``[T, num_experts]``) is kept for kernels that route internally.

    The constructor checks dtypes, shapes and devices from metadata alone.
    With ``check_values`` (the default) it also reads the values back: ids in
    range and distinct per row, weights finite and >= 0 (every routing
    method's are; raw logits are not weights). A serving loop that builds one per forward passes ``check_values=False``;
    the value checks are skipped on meta tensors and while a CUDA graph is
    being captured. Unchecked duplicate ids are outside the contract: kernels
    differ (most add each slot's contribution, so the expert counts twice).
    """

    topk_ids: torch.Tensor
    topk_weights: torch.Tensor
    router_logits: torch.Tensor | None = None
    num_experts: int = attrs.field(kw_only=True)
    """Experts of the whole layer (global ids), the bound every id is below."""
    check_values: bool = attrs.field(default=True, kw_only=True, repr=False)
    from_router_logits: bool | None = attrs.field(default=None, kw_only=True)
    """True where ``topk_ids`` and ``topk_weights`` are what :func:`~moe_core.select_experts` computed from
    ``router_logits`` (it sets this): only then may a kernel that routes internally route from the logits instead,
    and a checked top-k is held to its routing method's weights of them. A top-k built or edited elsewhere
    (capacity drops, expert-load-balancing remaps, ids reordered) says False, and every kernel runs its ids and
    weights as given. A top-k that carries ``router_logits`` must say which (None is refused there: ids sorted
    without their weights ran silently under the default); without logits None stands for False."""

    def __attrs_post_init__(self) -> None:
        require_int("num_experts", self.num_experts, minimum=1)
        require_tensor("topk_ids", self.topk_ids)
        require_tensor("topk_weights", self.topk_weights)
        require_dtype("topk_ids", self.topk_ids, (torch.int32,))
        require_ndim("topk_ids", self.topk_ids, 2, "[num_tokens, top_k]")
        require_dtype("topk_weights", self.topk_weights, (torch.float32,))
        require_shape("topk_weights", self.topk_weights, self.topk_ids.shape, "like topk_ids [num_tokens, top_k]")
        tensors = [("topk_ids", self.topk_ids), ("topk_weights", self.topk_weights)]
        if self.router_logits is not None:
            logits = require_tensor("router_logits", self.router_logits)
            require_ndim("router_logits", logits, 2, "[num_tokens, num_experts]")
            require_dtype("router_logits", logits, FLOAT_DTYPES)
            expected = (self.num_tokens, self.num_experts)
            require_shape("router_logits", logits, expected, "[num_tokens like topk_ids, num_experts]")
            tensors.append(("router_logits", logits))
        require_same_device(tensors)
        if self.top_k > self.num_experts:
            raise ValueError(f"topk_ids: expected at most num_experts={self.num_experts} columns, got {self.top_k}")
        if self.from_router_logits is None and self.router_logits is not None:
            raise TypeError(
                "from_router_logits: a top-k that carries router_logits says whether its ids and weights are "
                "select_experts' own of them (True: held to them) or were built or edited otherwise (False)"
            )
        if self.from_router_logits is not None and not isinstance(self.from_router_logits, bool):
            raise TypeError(f"from_router_logits: expected a bool, got {type(self.from_router_logits).__name__}")
        if self.from_router_logits and self.router_logits is None:
            raise ValueError("from_router_logits: a top-k computed from router logits carries them (router_logits=None)")
        if self.check_values:
            require_ids_in_range("topk_ids", self.topk_ids, self.num_experts, "num_experts")
            require_distinct_per_row("topk_ids", self.topk_ids)
            require_finite_non_negative("topk_weights", self.topk_weights)

    @property
    def num_tokens(self) -> int:
        """T, the number of routed tokens."""
        return int(self.topk_ids.shape[0])

    @property
    def top_k(self) -> int:
        """K, the experts chosen per token."""
        return int(self.topk_ids.shape[1])


class DispatchOutput(Protocol):
    """The input of :meth:`moe_core.Runner.run`: tokens, routing and their format."""

    @property
    def format(self) -> DispatchFormat:
        """The token layout; a runner refuses formats it does not implement."""
        ...

    @property
    def hidden_states(self) -> torch.Tensor:
        """``[T, H]`` activations in bf16, fp16 or fp32."""
        ...

    @property
    def topk(self) -> TopKOutput:
        """The routing of each of the ``T`` tokens."""
        ...


@constructed_eagerly
@final
@attrs.frozen(eq=False)
class StandardDispatchOutput:
    """Tokens in their original order with their top-k routing (no all-to-all)."""

    hidden_states: torch.Tensor
    topk: TopKOutput

    def __attrs_post_init__(self) -> None:
        require_tensor("hidden_states", self.hidden_states)
        require_ndim("hidden_states", self.hidden_states, 2, "[num_tokens, hidden_size]")
        require_dtype("hidden_states", self.hidden_states, FLOAT_DTYPES)
        if not isinstance(self.topk, TopKOutput):
            raise TypeError(f"topk: expected a TopKOutput, got {type(self.topk).__name__}")
        if self.hidden_states.shape[0] != self.topk.num_tokens:
            raise ValueError(
                f"hidden_states: expected {self.topk.num_tokens} rows like topk_ids, "
                f"got {self.hidden_states.shape[0]}"
            )
        require_same_device([("hidden_states", self.hidden_states), ("topk_ids", self.topk.topk_ids)])

    @property
    def format(self) -> DispatchFormat:
        """Always :attr:`DispatchFormat.STANDARD`."""
        return DispatchFormat.STANDARD
