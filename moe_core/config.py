"""The static shape and semantics of one MoE layer, shared by every backend."""

from __future__ import annotations

import enum
import math
from typing import final

import attrs
import torch
import torch.nn.functional as F

from moe_core._checks import require_int


class Activation(enum.Enum):
    """The gated activation between the two expert GEMMs.

    ``w13`` produces ``[gate | up]`` (gate first, as checkpoints store w1/w3);
    the expert's hidden activation is ``act(gate) * up``.
    """

    SILU_GATED = "silu"
    GELU_GATED = "gelu"

    def apply(self, gate_up: torch.Tensor) -> torch.Tensor:
        """``act(gate) * up`` for ``gate_up = [gate | up]`` along the last dim."""
        gate, up = gate_up.chunk(2, dim=-1)
        if self is Activation.SILU_GATED:
            return F.silu(gate) * up
        return F.gelu(gate) * up


class RoutingMethod(enum.Enum):
    """How router logits become top-k ids and weights.

    Runners that take precomputed top-k (the standard dispatch format) ignore
    it; kernels that route internally from ``router_logits`` must honour it.
    """

    SOFTMAX_TOPK = "softmax_topk"
    """Softmax over all experts, then keep the top-k probabilities as they are."""
    TOPK_RENORMALIZE = "topk_renormalize"
    """Top-k of the logits, then softmax over the k picked (weights sum to 1)."""


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
    activation: Activation = Activation.SILU_GATED
    routing_method: RoutingMethod = RoutingMethod.TOPK_RENORMALIZE
    routed_scaling_factor: float = 1.0

    def __attrs_post_init__(self) -> None:
        for name in ("num_experts", "hidden_size", "intermediate_size_per_partition", "top_k", "num_local_experts"):
            require_int(name, getattr(self, name), minimum=1)
        require_int("local_expert_offset", self.local_expert_offset, minimum=0)
        if self.top_k > self.num_experts:
            raise ValueError(f"top_k: expected at most num_experts={self.num_experts}, got {self.top_k}")
        if self.local_expert_offset + self.num_local_experts > self.num_experts:
            raise ValueError(
                "num_local_experts, local_expert_offset: local experts "
                f"[{self.local_expert_offset}, {self.local_expert_offset + self.num_local_experts}) "
                f"exceed num_experts={self.num_experts}"
            )
        if not isinstance(self.activation, Activation):
            raise TypeError(f"activation: expected an Activation, got {self.activation!r}")
        if not isinstance(self.routing_method, RoutingMethod):
            raise TypeError(f"routing_method: expected a RoutingMethod, got {self.routing_method!r}")
        factor = self.routed_scaling_factor
        if isinstance(factor, bool) or not isinstance(factor, (int, float)):
            raise TypeError(f"routed_scaling_factor: expected a float, got {type(factor).__name__}")
        if not (math.isfinite(factor) and factor > 0):
            raise ValueError(f"routed_scaling_factor: expected a finite value > 0, got {factor}")
