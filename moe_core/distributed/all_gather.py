"""Expert parallelism by all-gather and reduce-scatter: every rank sees every token and runs its own experts' slots.

For data-parallel attention (each rank its own tokens, :attr:`TokenSharding.PER_RANK`):
the ranks' token counts are gathered first (a host sync), then the token
rows, padded to the largest count; after the runner, a reduce-scatter
returns each rank its tokens' slot outputs. For tensor-parallel attention
(every rank the same tokens, :attr:`TokenSharding.REPLICATED`) only each
rank's token count and row shape are gathered (they must all be equal), and
an all-reduce returns the slot outputs. Choosing this rank's slots reads
their count back (a host sync), so neither layout is capturable in a CUDA
graph yet (:class:`GraphCaptureError`). Each token is encoded by a payload
before it is gathered (:mod:`~moe_core.distributed.payload`: as it is here,
quantized in :mod:`~moe_core.distributed.quantized`).

Exact by construction: the buffer reduced holds one row per gathered
``(token, slot)``, written by the one rank holding that slot's expert and
zero bytes on every other rank. It is reduced as uint8, and an integer sum
with a single non-zero addend is that addend, so the reduction hands over
each slot output's bytes whatever order the collective adds in. Under
replicated tokens each slot carries one more byte, 1 where a rank wrote it,
and a digest of the expert each rank routed it to, so a sum of another
writer count or digest (ranks that held different tokens) is refused. The slots a
rank computes are selected in gathered ``(token, slot)`` order, which is the
layer's order with tokens numbered rank by rank, so each expert sees the
single-rank layer's rows (see :mod:`moe_core.distributed.all_to_all`). The
price is ``top_k`` output rows per token on the wire instead of one
partial sum per token.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from typing import final

import attrs
import torch
import torch.distributed as dist
import torch.nn.functional as F

from moe_core.config import MoeRunnerConfig
from moe_core.dispatch import StandardDispatchOutput, TopKOutput
from moe_core.distributed.collectives import (
    RowShape,
    all_gather_rows,
    gather_counts,
    reduce_scatter_rows,
    refuse_capture,
    sum_rows,
)
from moe_core.distributed.payload import Payload, StandardPayload
from moe_core.distributed.placement import ExpertPlacement
from moe_core.distributed.protocol import Dispatched, FormatT
from moe_core.distributed.slots import check_rows, slot_config, sum_slots
from moe_core.distributed.wire import RowLayout, as_bytes, from_bytes


class TokenSharding(enum.Enum):
    """Which tokens a rank holds when the MoE layer starts."""

    PER_RANK = "per_rank"
    """Its own tokens, other ranks others (data-parallel attention): all-gather, then reduce-scatter."""
    REPLICATED = "replicated"
    """The same tokens as every other rank (tensor-parallel attention): no gather, all-reduce."""


def token_layout(token_bytes: int, top_k: int) -> RowLayout:
    """A token row on the wire: its encoded row (:mod:`~moe_core.distributed.payload`), its top-k expert ids and weights."""
    return RowLayout(((torch.uint8, token_bytes), (torch.int32, top_k), (torch.float32, top_k)))


def gathered_slots(
    hidden_states: torch.Tensor,
    topk_ids: torch.Tensor,
    topk_weights: torch.Tensor,
    token_counts: tuple[int, ...],
    experts: range,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The slot rows of gathered tokens routed to ``experts``: token rows, expert ids, weights, and their indices.

    The gathered token rows (``[W * T_max, ...]``) are ``len(token_counts)``
    blocks of ``T_max = max(token_counts)`` rows, block ``r`` holding rank
    ``r``'s tokens then padding, which is never selected. Indices are flat
    ``(token, slot)`` positions in that layout, ascending.
    """
    blocks, padded, top_k = len(token_counts), max(token_counts, default=0), topk_ids.shape[1]
    counts = torch.tensor(token_counts, device=topk_ids.device)
    real = (torch.arange(padded, device=topk_ids.device) < counts[:, None]).reshape(blocks * padded, 1)
    mine = real & (topk_ids >= experts.start) & (topk_ids < experts.stop)
    selected = mine.flatten().nonzero().flatten()
    return hidden_states[selected // top_k], topk_ids.flatten()[selected], topk_weights.flatten()[selected], selected


@final
@attrs.frozen(eq=False)
class AllGatherHandle:
    """What the combine of one all-gather dispatch reads."""

    selected: torch.Tensor
    """int64: the gathered ``(token, slot)`` index of each row this rank's runner got."""
    token_counts: tuple[int, ...]
    """Tokens of each rank, in rank order (one entry, this rank's, when tokens are replicated)."""
    top_k: int
    digests: torch.Tensor | None = None
    """Replicated tokens: uint8 ``[T * K, DIGEST_PIECES]``, each slot's expert as this rank routed it
    (:func:`view_digests`), which every rank's must equal."""


DIGEST_PIECES = 8
"""A slot's 16-bit digest in 2-bit pieces, one a byte: summed over up to :data:`DIGEST_RANKS` ranks no byte wraps."""
DIGEST_RANKS = 85


def view_digests(ids: torch.Tensor) -> torch.Tensor:
    """uint8 ``[T * K, DIGEST_PIECES]``: a 16-bit hash of each ``(token, slot)``'s position and expert id
    (``ids [T, K]``), in 2-bit pieces.

    The ids, not the token's bytes or weight: ranks that route the same
    tokens may differ in their last bits (each computes the router itself;
    3e-7 between two ranks' weights was refused as other tokens: adversarial
    pass 7, c11), and each slot's output is its owner's alone. Ranks that
    hold other tokens pick other experts for some slot.
    """
    flat = ids.reshape(-1).to(torch.int64)
    slots = flat * 40503 + torch.arange(flat.numel(), device=ids.device) * 7919
    digest = (slots ^ (slots >> 16)) & 0xFFFF
    shifts = torch.arange(0, 2 * DIGEST_PIECES, 2, device=ids.device)
    return ((digest[:, None] >> shifts) & 3).to(torch.uint8)


def slot_buffer(out: torch.Tensor, handle: AllGatherHandle) -> torch.Tensor:
    """uint8 rows of every gathered ``(token, slot)``: this rank's outputs where it ran the slot, zero bytes elsewhere."""
    check_rows(out, handle.selected.numel())
    data = as_bytes(out)
    slots = len(handle.token_counts) * max(handle.token_counts, default=0) * handle.top_k
    return data.new_zeros((slots, data.shape[1])).index_copy_(0, handle.selected, data)


def gather_slots(
    where: str,
    payload_of: Callable[[torch.Tensor], Payload[FormatT]],
    hidden_states: torch.Tensor,
    topk: TopKOutput,
    placement: ExpertPlacement,
    group: dist.ProcessGroup,
    tokens: TokenSharding,
) -> Dispatched[FormatT, AllGatherHandle]:
    """The all-gather dispatch of ``hidden_states`` in the payload ``payload_of`` makes for them (``where`` names the
    caller in errors)."""
    refuse_capture(where)
    placement.check_routing(hidden_states, topk)
    payload = payload_of(hidden_states)
    rows, ids, weights = payload.encode(hidden_states), topk.topk_ids, topk.topk_weights
    token_counts: tuple[int, ...] = (topk.num_tokens,)
    world_size = group.size()
    shape = RowShape(
        payload.row_bytes, hidden_states.dtype, int(hidden_states.shape[1]), topk.top_k, topk.num_experts,
        f"all-gather {tokens.name.lower()} of {type(payload).__name__}",
    )
    every_count = gather_counts(topk.num_tokens, hidden_states.device, group, world_size, shape)
    if tokens is TokenSharding.REPLICATED and len(set(every_count)) > 1:
        raise ValueError(
            f"TokenSharding.REPLICATED: the ranks hold {list(every_count)} tokens, not one count: data-parallel "
            "attention (each rank its own tokens) takes TokenSharding.PER_RANK"
        )
    if tokens is TokenSharding.PER_RANK:
        token_counts = every_count
        layout = token_layout(payload.row_bytes, topk.top_k)
        packed = F.pad(layout.pack(rows, ids, weights), (0, 0, 0, max(token_counts) - topk.num_tokens))
        rows, ids, weights = layout.unpack(all_gather_rows(packed, group, world_size))
    slot_tokens, slot_ids, slot_weights, selected = gathered_slots(
        rows, ids, weights, token_counts, placement.experts_of(group.rank())
    )
    dispatch = payload.decode(slot_tokens, slot_ids, slot_weights, topk.num_experts)
    digests = None
    if tokens is TokenSharding.REPLICATED and group.size() <= DIGEST_RANKS:
        digests = view_digests(ids)
    return Dispatched(dispatch, AllGatherHandle(selected, token_counts, topk.top_k, digests))


def scatter_slots(out: torch.Tensor, handle: AllGatherHandle, group: dist.ProcessGroup, tokens: TokenSharding) -> torch.Tensor:
    """Every slot output to its token's rank (bytes, exactly), then each token's slots added in slot order."""
    buffer = slot_buffer(out, handle)
    if tokens is TokenSharding.REPLICATED:
        mine = _sum_replicated(buffer, handle, group)
    else:
        rank = group.rank()
        mine = reduce_scatter_rows(buffer, group, rank, group.size())
        mine = mine[: handle.token_counts[rank] * handle.top_k]
    return sum_slots(from_bytes(mine, out.dtype, out.shape[1]), handle.top_k)


def _sum_replicated(buffer: torch.Tensor, handle: AllGatherHandle, group: dist.ProcessGroup) -> torch.Tensor:
    """``buffer`` summed over the ranks, with one more byte per slot, 1 where this rank wrote it, and the slot's
    :func:`view_digests` pieces. Replicated tokens give every slot exactly one writer and every rank's digest; another
    writer count, or a digest sum other than the world size times this rank's, means the ranks routed different
    tokens or top-k (slots then mix or miss ranks' bytes): refused instead of returning garbage (one host sync)."""
    written = buffer.new_zeros((buffer.shape[0], 1)).index_fill_(0, handle.selected, 1)
    digests = handle.digests if handle.digests is not None else buffer.new_zeros((buffer.shape[0], 0))
    flagged = torch.cat((buffer, written, digests), dim=1)
    sum_rows(flagged, group)
    width = buffer.shape[1]
    writers = flagged[:, width]
    differ = (writers != 1) | (flagged[:, width + 1 :].to(torch.int64) != digests.to(torch.int64) * group.size()).any(dim=1)
    if bool(differ.any()):
        slot = int(differ.nonzero()[0, 0])
        count = int(writers[slot])
        what = f"was computed by {count} ranks, not one" if count != 1 else "is routed to another expert on some rank"
        raise ValueError(
            f"TokenSharding.REPLICATED: slot {slot} {what}: the ranks hold different tokens or top-k; data-parallel "
            "attention (each rank its own tokens) takes TokenSharding.PER_RANK"
        )
    return flagged[:, :width]


@final
@attrs.frozen(eq=False)
class AllGatherDispatcher:
    """Runs this rank's experts on every rank's tokens; gathers tokens, reduces slot outputs (see the module)."""

    group: dist.ProcessGroup
    placement: ExpertPlacement
    tokens: TokenSharding = TokenSharding.PER_RANK

    def __attrs_post_init__(self) -> None:
        if not isinstance(self.placement, ExpertPlacement):
            raise TypeError(f"placement: expected an ExpertPlacement, got {type(self.placement).__name__}")
        if self.placement.world_size != self.group.size():
            raise ValueError(
                f"placement: expected world_size={self.group.size()} like the group, got {self.placement.world_size}"
            )
        if not isinstance(self.tokens, TokenSharding):
            raise TypeError(f"tokens: expected a TokenSharding, got {self.tokens!r}")

    def runner_config(self, config: MoeRunnerConfig) -> MoeRunnerConfig:
        """This rank's experts of the layer's ``config``, over slot rows (``top_k = 1``)."""
        return slot_config(self.placement.runner_config(config, self.group.rank()))

    def dispatch(self, hidden_states: torch.Tensor, topk: TopKOutput) -> Dispatched[StandardDispatchOutput, AllGatherHandle]:
        """The slot rows of every rank's tokens routed to this rank's experts, in gathered ``(token, slot)`` order."""
        where = "AllGatherDispatcher.dispatch"
        return gather_slots(where, StandardPayload.of, hidden_states, topk, self.placement, self.group, self.tokens)

    def combine(self, out: torch.Tensor, handle: AllGatherHandle) -> torch.Tensor:
        """Every slot output to its token's rank (bytes, exactly), then each token's slots added in slot order."""
        return scatter_slots(out, handle, self.group, self.tokens)
