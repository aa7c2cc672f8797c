"""Expert parallelism over torch.distributed: token dispatchers, the expert placement, and the layer that uses them.

``dispatcher.dispatch(hidden, topk) -> Dispatched[Fmt, H]``, ``forward(dispatched.dispatch)``,
``dispatcher.combine(out, dispatched.handle)``; :class:`ExpertParallelMoe` is that walk. Every dispatcher hands the
runner one row per ``(token, slot)`` and sums a token's slots in slot order (:mod:`.slots` says why), so a rank's output
equals the single-rank layer's rows bit for bit with the reference runners. Every rank of a group passes tokens of
the same hidden size, dtype and top-k (they size the rows on the wire), and takes part in every dispatch and combine,
with or without tokens.
"""

from moe_core.distributed.all_gather import AllGatherDispatcher, AllGatherHandle, TokenSharding
from moe_core.distributed.all_to_all import AllToAllDispatcher, AllToAllHandle
from moe_core.distributed.errors import GraphCaptureError, RedundantExpertsError
from moe_core.distributed.layer import ExpertParallelMoe
from moe_core.distributed.local import LocalDispatcher, LocalHandle
from moe_core.distributed.placement import ExpertPlacement
from moe_core.distributed.protocol import Dispatched, TokenDispatcher
from moe_core.distributed.slots import slot_config, sum_slots

__all__ = [
    "AllGatherDispatcher",
    "AllGatherHandle",
    "AllToAllDispatcher",
    "AllToAllHandle",
    "Dispatched",
    "ExpertParallelMoe",
    "ExpertPlacement",
    "GraphCaptureError",
    "LocalDispatcher",
    "LocalHandle",
    "RedundantExpertsError",
    "TokenDispatcher",
    "TokenSharding",
    "slot_config",
    "sum_slots",
]
