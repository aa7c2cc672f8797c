"""The torch.distributed calls the dispatchers make: one code path for gloo (CPU or CUDA tensors) and NCCL.

Payloads are uint8 rows (:mod:`moe_core.distributed.wire`), so no collective
depends on which dtypes a backend moves; only the reduce-scatter is chosen by
the group's backend name.
"""

from __future__ import annotations

import zlib
from typing import final

import attrs
import torch
import torch.distributed as dist

from moe_core.distributed.errors import GraphCaptureError


def refuse_capture(where: str) -> None:
    """Raise :class:`GraphCaptureError` if the current CUDA stream is capturing a graph."""
    if torch.cuda.is_available() and torch.cuda.is_current_stream_capturing():
        raise GraphCaptureError(
            f"{where}: reads its split sizes back to the host once per call, which a CUDA graph cannot capture; "
            "run it outside capture (a capturable dispatcher needs static split sizes, not built yet)"
        )


def backend_name(group: dist.ProcessGroup, device: torch.device) -> str:
    """The backend that moves ``device``'s tensors in ``group``: ``"gloo"``, ``"nccl"``, ... (``"cpu:gloo,cuda:nccl"`` resolved)."""
    name = str(dist.get_backend(group))
    if ":" not in name:
        return name
    per_device = dict(item.split(":", 1) for item in name.split(","))
    return per_device.get(device.type, name)


def _first_collective_failed(where: str, error: RuntimeError) -> RuntimeError:
    """The error of a layer's first collective, naming the contract a rank most often breaks there."""
    return RuntimeError(
        f"{where}: the first collective of this layer's dispatch failed ({str(error).splitlines()[0]}); most often a "
        "rank of the group did not call the layer this step: every rank calls it each step, with an empty batch "
        "(0 tokens) where it has none"
    )


WIRE_DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64)
"""The hidden-states dtypes a :class:`RowShape` names by index (another dtype is -1)."""


@final
@attrs.frozen
class RowShape:
    """What every rank's rows must agree on before they travel: their bytes, the hidden states' dtype and width, the
    top-k, the layer's expert count and the dispatch they travel through.

    A rank whose rows differ (another dtype: the collectives move bytes)
    made gloo abort the receiving process, or its bytes were decoded as the
    other dtype into garbage ids and values; the counts' exchange carries
    this, so it is refused by name on every rank first.
    """

    row_bytes: int
    dtype: torch.dtype
    hidden_size: int
    top_k: int
    """The layer's experts per token (an all-gather's token rows carry the top-k: a rank of another top-k made gloo
    abort its peer, adversarial pass 7, c12)."""
    num_experts: int
    """The layer's experts (a rank of a layer of another expert count placed the experts elsewhere: outputs 0.55-1.35
    off, or two owners' bytes summed into garbage, adversarial pass 11, c03)."""
    exchange: str
    """The dispatch and payload the rows travel through, by name (a rank of another met other collectives: gloo's
    own error or a timeout, pass 11, c05)."""

    def encoded(self) -> tuple[int, int, int, int, int, int]:
        """The six integers sent beside each count (the exchange as a CRC-32 of its name)."""
        code = WIRE_DTYPES.index(self.dtype) if self.dtype in WIRE_DTYPES else -1
        return self.row_bytes, code, self.hidden_size, self.top_k, self.num_experts, zlib.crc32(self.exchange.encode())

    def require_same(self, received: list[list[int]], where: str) -> None:
        """Raise ``ValueError`` naming the first rank whose encoded shape differs from this one's."""
        mine = list(self.encoded())
        for rank, theirs in enumerate(received):
            if theirs != mine:
                dtype = WIRE_DTYPES[theirs[1]] if 0 <= theirs[1] < len(WIRE_DTYPES) else "another dtype"
                exchange = self.exchange if theirs[5] == mine[5] else "another dispatch or payload"
                raise ValueError(
                    f"{where}: rank {rank} sends rows of {theirs[0]} bytes from {dtype} hidden states of width "
                    f"{theirs[2]} at top-{theirs[3]} of {theirs[4]} experts through {exchange}, this rank "
                    f"{self.row_bytes} bytes from {self.dtype} of width {self.hidden_size} at top-{self.top_k} of "
                    f"{self.num_experts} experts through {self.exchange}: every rank runs the layer in one dtype, "
                    "hidden size, top-k, expert count and dispatch"
                )


def exchange_counts(
    send_counts: torch.Tensor, group: dist.ProcessGroup, shape: RowShape
) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Rows this rank sends to each rank (int64 ``[W]``) and, after an all-to-all, receives from each: one host sync.
    Each count travels with ``shape``, which every rank's must equal (:class:`RowShape`)."""
    world_size = send_counts.numel()
    encoded = torch.tensor(shape.encoded(), dtype=torch.int64, device=send_counts.device)
    sent = torch.cat((send_counts.reshape(world_size, 1), encoded.expand(world_size, encoded.numel())), dim=1)
    received = torch.empty_like(sent)
    try:
        dist.all_to_all_single(received.view(-1), sent.view(-1), group=group)
    except RuntimeError as error:  # gloo's timeout: a rank that skipped the layer
        raise _first_collective_failed("all-to-all dispatch", error) from error
    both = torch.cat((sent, received)).tolist()
    shape.require_same([row[1:] for row in both[world_size:]], "all-to-all dispatch")
    return tuple(int(row[0]) for row in both[:world_size]), tuple(int(row[0]) for row in both[world_size:])


def all_to_all_rows(
    rows: torch.Tensor, send_splits: tuple[int, ...], recv_splits: tuple[int, ...], group: dist.ProcessGroup
) -> torch.Tensor:
    """uint8 ``rows`` sent ``send_splits[r]`` rows to rank ``r`` (in rank order); the ``sum(recv_splits)`` rows received."""
    received = rows.new_empty((sum(recv_splits), rows.shape[1]))
    dist.all_to_all_single(
        received, rows.contiguous(), output_split_sizes=list(recv_splits), input_split_sizes=list(send_splits), group=group
    )
    return received


def all_gather_rows(rows: torch.Tensor, group: dist.ProcessGroup, world_size: int) -> torch.Tensor:
    """Every rank's ``rows [n, B]`` (the same ``n`` on all ranks) stacked in rank order: ``[world_size * n, B]``."""
    gathered = rows.new_empty((world_size * rows.shape[0], rows.shape[1]))
    dist.all_gather(list(gathered.view(world_size, rows.shape[0], rows.shape[1]).unbind(0)), rows.contiguous(), group=group)
    return gathered


def gather_counts(
    count: int, device: torch.device, group: dist.ProcessGroup, world_size: int, shape: RowShape
) -> tuple[int, ...]:
    """Every rank's ``count``, in rank order: one host sync. Each travels with ``shape``, which every rank's must
    equal (:class:`RowShape`)."""
    mine = torch.tensor([[count, *shape.encoded()]], dtype=torch.int64, device=device)
    try:
        gathered = all_gather_rows(mine, group, world_size)
    except RuntimeError as error:  # gloo's timeout: a rank that skipped the layer
        raise _first_collective_failed("all-gather dispatch", error) from error
    rows = gathered.tolist()
    shape.require_same([row[1:] for row in rows], "all-gather dispatch")
    return tuple(int(row[0]) for row in rows)


def sum_rows(rows: torch.Tensor, group: dist.ProcessGroup) -> None:
    """In place: ``rows`` summed over the ranks."""
    dist.all_reduce(rows, group=group)


def reduce_scatter_rows(rows: torch.Tensor, group: dist.ProcessGroup, rank: int, world_size: int) -> torch.Tensor:
    """Block ``rank`` of ``rows [world_size * n, B]`` summed over the ranks: ``[n, B]``.

    Gloo lacks reduce-scatter in the older torch releases this library
    supports, so on gloo every release all-reduces and keeps this rank's
    block (the same sum, ``world_size`` times the traffic: CPU tests, not
    production); other backends reduce-scatter.
    """
    blocks = rows.view(world_size, rows.shape[0] // world_size, rows.shape[1])
    if backend_name(group, rows.device) == "gloo":
        sum_rows(rows, group)
        return blocks[rank]
    out = rows.new_empty(blocks.shape[1:])
    dist.reduce_scatter(out, list(blocks.unbind(0)), group=group)
    return out
