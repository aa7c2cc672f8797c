"""Expert parallelism over torch.distributed: token dispatchers, the expert placement, and the layer that uses them.

``dispatcher.dispatch(hidden, topk) -> Dispatched[Fmt, H]``, ``forward(dispatched.dispatch)``,
``dispatcher.combine(out, dispatched.handle)``; :class:`ExpertParallelMoe` is that walk. Every dispatcher hands the
runner one row per ``(token, slot)`` and sums a token's slots in slot order (:mod:`.slots` says why), so a rank's output
equals the single-rank layer's rows bit for bit with the reference runners. Every rank of a group passes tokens of
the same hidden size, dtype and top-k (they size the rows on the wire), and takes part in every dispatch and combine,
with or without tokens. The ``Quantized`` dispatchers send each token quantized to FP8 or NVFP4
(:mod:`.quantized`), and :func:`load_expert_parallel` builds a rank's layer from a checkpoint.
"""

from moe_core.distributed.all_gather import AllGatherDispatcher, AllGatherHandle, TokenSharding
from moe_core.distributed.all_to_all import AllToAllDispatcher, AllToAllHandle
from moe_core.distributed.errors import GraphCaptureError, RedundantExpertsError
from moe_core.distributed.layer import ExpertParallelMoe
from moe_core.distributed.load import load_expert_parallel
from moe_core.distributed.local import LocalDispatcher, LocalHandle
from moe_core.distributed.payload import (
    Fp8SlotRows,
    Fp8TokenQuantizer,
    Nvfp4SlotRows,
    Nvfp4TokenQuantizer,
    TokenQuantizer,
)
from moe_core.distributed.placement import ExpertPlacement
from moe_core.distributed.protocol import Dispatched, TokenDispatcher
from moe_core.distributed.quantized import (
    Fp8RowsReferenceRunner,
    Nvfp4RowsReferenceRunner,
    QuantizedAllGatherDispatcher,
    QuantizedAllToAllDispatcher,
    QuantizedLocalDispatcher,
)
from moe_core.distributed.slots import slot_config, sum_slots

__all__ = [
    "AllGatherDispatcher",
    "AllGatherHandle",
    "AllToAllDispatcher",
    "AllToAllHandle",
    "Dispatched",
    "ExpertParallelMoe",
    "ExpertPlacement",
    "Fp8RowsReferenceRunner",
    "Fp8SlotRows",
    "Fp8TokenQuantizer",
    "GraphCaptureError",
    "LocalDispatcher",
    "LocalHandle",
    "Nvfp4RowsReferenceRunner",
    "Nvfp4SlotRows",
    "Nvfp4TokenQuantizer",
    "QuantizedAllGatherDispatcher",
    "QuantizedAllToAllDispatcher",
    "QuantizedLocalDispatcher",
    "RedundantExpertsError",
    "TokenDispatcher",
    "TokenQuantizer",
    "TokenSharding",
    "load_expert_parallel",
    "slot_config",
    "sum_slots",
]
