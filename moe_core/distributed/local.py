"""World size 1: every expert on this rank, no communication; the layer the distributed ones must reproduce."""

from __future__ import annotations

from typing import final

import attrs
import torch

from moe_core.config import MoeRunnerConfig
from moe_core.dispatch import StandardDispatchOutput, TopKOutput
from moe_core.distributed.placement import require_whole_layer
from moe_core.distributed.protocol import Dispatched
from moe_core.distributed.slots import check_rows, slot_config, slot_rows, sum_slots


@final
@attrs.frozen
class LocalHandle:
    """The token and slot counts of one local dispatch."""

    num_tokens: int
    top_k: int


@final
@attrs.frozen
class LocalDispatcher:
    """Slot rows of every token in ``(token, slot)`` order, on this rank; no process group, no placement.

    No host synchronization either: a local layer can be captured in a CUDA
    graph where its runner can.
    """

    def runner_config(self, config: MoeRunnerConfig) -> MoeRunnerConfig:
        """The whole layer's ``config`` over slot rows (``top_k = 1``)."""
        require_whole_layer(config)
        return slot_config(config)

    def dispatch(self, hidden_states: torch.Tensor, topk: TopKOutput) -> Dispatched[StandardDispatchOutput, LocalHandle]:
        """Row ``t * top_k + k`` is token ``t`` for its slot ``k``."""
        StandardDispatchOutput(hidden_states, topk)  # checks the pair
        rows = slot_rows(
            hidden_states.repeat_interleave(topk.top_k, dim=0),
            topk.topk_ids.flatten(),
            topk.topk_weights.flatten(),
            topk.num_experts,
        )
        return Dispatched(rows, LocalHandle(topk.num_tokens, topk.top_k))

    def combine(self, out: torch.Tensor, handle: LocalHandle) -> torch.Tensor:
        """Each token's slot outputs added in slot order."""
        check_rows(out, handle.num_tokens * handle.top_k)
        return sum_slots(out, handle.top_k)

