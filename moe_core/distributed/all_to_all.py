"""Expert parallelism by uneven all-to-all: each (token, slot) goes to the rank holding its expert, and comes back.

Counts first (an all-to-all of ``W`` ints and one host sync for the split
sizes), then one all-to-all of byte rows each way; every rank takes part in
both, with or without tokens to send or receive. Not capturable in a CUDA
graph (the split sizes are read back): :class:`GraphCaptureError`. Each
token is encoded by a payload before it is packed (:mod:`~moe_core.distributed.payload`:
as it is here, quantized in :mod:`~moe_core.distributed.quantized`).

Why the result is the single-rank layer's, bit for bit, for the reference
runners: the sender orders its slots by destination rank with a stable sort,
so each destination gets them in ``(token, slot)`` order; the all-to-all
concatenates what it receives in source-rank order. With the layer's tokens
numbered rank by rank, each expert therefore sees the same rows in the same
order as on a single rank, so a runner whose results for an expert depend
only on that expert's rows (the reference backends: one GEMM chain per
expert over its rows) computes the same per-slot outputs; they come back as
bytes, and :func:`~moe_core.distributed.slots.sum_slots` adds them in slot
order. Kernels that choose their tiling by the total row count keep their
own tolerance.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import final

import attrs
import torch
import torch.distributed as dist

from moe_core.config import MoeRunnerConfig
from moe_core.dispatch import StandardDispatchOutput, TopKOutput
from moe_core.distributed.collectives import RowShape, all_to_all_rows, exchange_counts, refuse_capture
from moe_core.distributed.payload import Payload, StandardPayload
from moe_core.distributed.placement import ExpertPlacement
from moe_core.distributed.protocol import Dispatched, FormatT
from moe_core.distributed.slots import check_rows, slot_config, sum_slots
from moe_core.distributed.wire import RowLayout, as_bytes, from_bytes


def slot_layout(token_bytes: int) -> RowLayout:
    """A slot row on the wire: its token's encoded row (:mod:`~moe_core.distributed.payload`), expert id, weight."""
    return RowLayout(((torch.uint8, token_bytes), (torch.int32, 1), (torch.float32, 1)))


@final
@attrs.frozen(eq=False)
class Outbox:
    """This rank's slot rows ordered by destination rank, ready to send."""

    rows: torch.Tensor
    """uint8 ``[T * K, row bytes]`` (:func:`slot_layout`), destination rank 0's first, each in ``(token, slot)`` order."""
    counts: torch.Tensor
    """int64 ``[W]``: rows for each rank."""
    inverse: torch.Tensor
    """int64 ``[T * K]``: the row of ``rows`` holding slot ``t * K + k``."""

    @classmethod
    def pack(cls, tokens: torch.Tensor, topk: TopKOutput, placement: ExpertPlacement) -> Outbox:
        """The outbox of the encoded token rows ``tokens`` (uint8 ``[T, B]``) routed by ``topk``."""
        destination, order = torch.sort(placement.rank_of(topk.topk_ids).flatten(), stable=True)
        inverse = torch.empty_like(order)
        inverse[order] = torch.arange(order.numel(), device=order.device)
        ranks = torch.arange(placement.world_size + 1, device=order.device)
        counts = torch.searchsorted(destination, ranks).diff()  # no host sync, unlike bincount on CUDA
        layout = slot_layout(tokens.shape[1])
        rows = layout.pack(tokens[order // topk.top_k], topk.topk_ids.flatten()[order], topk.topk_weights.flatten()[order])
        return cls(rows, counts, inverse)


def received_slots(rows: torch.Tensor, payload: Payload[FormatT], num_experts: int) -> FormatT:
    """The runner's input from the byte rows an all-to-all delivered, decoded by ``payload``."""
    tokens, ids, weights = slot_layout(payload.row_bytes).unpack(rows)
    return payload.decode(tokens, ids.flatten(), weights.flatten(), num_experts)


@final
@attrs.frozen(eq=False)
class AllToAllHandle:
    """What the combine of one all-to-all dispatch reads."""

    inverse: torch.Tensor
    """int64 ``[T * K]``: where each ``(token, slot)`` of this rank sits among the rows sent (and returned)."""
    send_splits: tuple[int, ...]
    """Rows sent to each rank, which each returns."""
    recv_splits: tuple[int, ...]
    """Rows received from each rank, whose outputs go back."""
    top_k: int


def returned_slots(returned: torch.Tensor, handle: AllToAllHandle, dtype: torch.dtype, hidden_size: int) -> torch.Tensor:
    """This rank's ``[T, H]`` output from its slot rows' outputs, returned as bytes in the order they were sent."""
    slots = from_bytes(returned.index_select(0, handle.inverse), dtype, hidden_size)
    return sum_slots(slots, handle.top_k)


def exchange_slots(
    where: str,
    payload_of: Callable[[torch.Tensor], Payload[FormatT]],
    hidden_states: torch.Tensor,
    topk: TopKOutput,
    placement: ExpertPlacement,
    group: dist.ProcessGroup,
) -> Dispatched[FormatT, AllToAllHandle]:
    """The all-to-all dispatch of ``hidden_states`` in the payload ``payload_of`` makes for them (``where`` names the
    caller in errors)."""
    refuse_capture(where)
    placement.check_routing(hidden_states, topk)
    payload = payload_of(hidden_states)
    outbox = Outbox.pack(payload.encode(hidden_states), topk, placement)
    shape = RowShape(
        payload.row_bytes, hidden_states.dtype, int(hidden_states.shape[1]), topk.top_k, topk.num_experts,
        f"all-to-all of {type(payload).__name__}",
    )
    send_splits, recv_splits = exchange_counts(outbox.counts, group, shape)
    received = all_to_all_rows(outbox.rows, send_splits, recv_splits, group)
    dispatch = received_slots(received, payload, topk.num_experts)
    return Dispatched(dispatch, AllToAllHandle(outbox.inverse, send_splits, recv_splits, topk.top_k))


def return_slots(out: torch.Tensor, handle: AllToAllHandle, group: dist.ProcessGroup) -> torch.Tensor:
    """Each received row's output back to its rank; there, each token's slots added in slot order."""
    check_rows(out, sum(handle.recv_splits))
    returned = all_to_all_rows(as_bytes(out), handle.recv_splits, handle.send_splits, group)
    return returned_slots(returned, handle, out.dtype, out.shape[1])


@final
@attrs.frozen(eq=False)
class AllToAllDispatcher:
    """Sends each (token, slot) to the rank of its expert under ``placement`` and its output back."""

    group: dist.ProcessGroup
    placement: ExpertPlacement

    def __attrs_post_init__(self) -> None:
        if not isinstance(self.placement, ExpertPlacement):
            raise TypeError(f"placement: expected an ExpertPlacement, got {type(self.placement).__name__}")
        if self.placement.world_size != self.group.size():
            raise ValueError(
                f"placement: expected world_size={self.group.size()} like the group, got {self.placement.world_size}"
            )

    def runner_config(self, config: MoeRunnerConfig) -> MoeRunnerConfig:
        """This rank's experts of the layer's ``config``, over slot rows (``top_k = 1``)."""
        return slot_config(self.placement.runner_config(config, self.group.rank()))

    def dispatch(self, hidden_states: torch.Tensor, topk: TopKOutput) -> Dispatched[StandardDispatchOutput, AllToAllHandle]:
        """The slot rows of every rank for this rank's experts, in source-rank then ``(token, slot)`` order."""
        where = "AllToAllDispatcher.dispatch"
        return exchange_slots(where, StandardPayload.of, hidden_states, topk, self.placement, self.group)

    def combine(self, out: torch.Tensor, handle: AllToAllHandle) -> torch.Tensor:
        """Each received row's output back to its rank; there, each token's slots added in slot order."""
        return return_slots(out, handle, self.group)
