"""Expert-parallel dispatch and combine times on the Mixtral and DeepSeek-V3 shapes, on whatever this machine has.

Run from the repository root::

    python benchmarks/ep_bench.py [--shapes mixtral,deepseek] [--tokens 1,256,4096]
        [--dispatchers local,all-to-all,all-gather,replicated,fp8-all-to-all,fp8-all-gather,nvfp4-all-to-all]
        [--world-size N] [--backend auto|nccl|gloo] [--iters 20]

It starts one process per rank itself (spawn, a ``file://`` rendezvous):
NCCL with one GPU per rank where there are several GPUs (world size: all of
them), gloo with CUDA tensors at world size 2 where there is one, gloo on
the CPU otherwise. Each rank routes ``T`` random bf16 tokens of its own
(``T`` is per rank) with random logits; the expert computation is left out
(the runner's stand-in returns its input rows), so the times are the
dispatchers' own: ``dispatch`` (count exchange, host sync, packing, the
payload collective, unpacking) and ``combine`` (the return collective and the
slot sum). Each is the median over ``--iters`` calls after a barrier, the
slowest rank's; ``rows`` is the most slot rows one rank's runner got, and
``dispatch bytes`` what one rank hands the dispatch's payload collective
(all-to-all: a row per slot; all-gather: a row per token, which goes to every
other rank; the count exchange left out). The ``fp8-`` and ``nvfp4-``
dispatchers quantize each token before the exchange (FP8 with its own
scale: ``H + 4`` bytes of hidden state per row instead of ``2 H``; NVFP4
under one input scale, here for an amax of 6: ``H / 2 + H / 16``); their
times include the quantization, their combine is the same bf16 one. The
``local`` row is the world-size-1 layer on each rank, for the cost of the slot
layout alone. Not captured in CUDA graphs: the communicating dispatchers read
split sizes back (``GraphCaptureError``).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import attrs
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from moe_core.config import MoeRunnerConfig  # noqa: E402
from moe_core.dispatch import StandardDispatchOutput, TopKOutput  # noqa: E402
from moe_core.distributed import (  # noqa: E402
    AllGatherDispatcher,
    AllToAllDispatcher,
    ExpertPlacement,
    Fp8SlotRows,
    Fp8TokenQuantizer,
    Nvfp4SlotRows,
    Nvfp4TokenQuantizer,
    QuantizedAllGatherDispatcher,
    QuantizedAllToAllDispatcher,
    LocalDispatcher,
    TokenDispatcher,
    TokenSharding,
)
from moe_core.distributed.all_gather import token_layout  # noqa: E402
from moe_core.distributed.all_to_all import slot_layout  # noqa: E402
from moe_core.distributed.payload import StandardPayload  # noqa: E402
from moe_core.global_scales import QuantizeGlobalScale  # noqa: E402
from moe_core.routing import select_experts  # noqa: E402

SHAPES = {"mixtral": (8, 2, 4096), "deepseek": (256, 8, 7168)}
"""name -> (experts, top_k, hidden)."""
DISPATCHERS = ("local", "all-to-all", "all-gather", "replicated", "fp8-all-to-all", "fp8-all-gather", "nvfp4-all-to-all")
HandleT = TypeVar("HandleT")
D = TypeVar("D")
T = TypeVar("T")


@attrs.frozen
class World:
    """Where the ranks run."""

    backend: str
    world_size: int
    device_type: str

    def device(self, rank: int) -> torch.device:
        if self.device_type == "cpu":
            return torch.device("cpu")
        return torch.device("cuda", rank if self.backend == "nccl" else 0)


@attrs.frozen
class Row:
    shape: str
    tokens: int
    dispatcher: str
    dispatch_ms: float
    combine_ms: float
    rows: int
    dispatch_bytes: int


def available_world(world_size: int | None, backend: str) -> World:
    """``backend`` ``auto``: NCCL over every GPU where there are several, gloo with CUDA tensors on one, gloo on the
    CPU without; ``nccl``: one GPU per rank (world size 1 on one GPU runs the same code path); ``gloo``: as auto
    without NCCL."""
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if backend == "nccl" or (backend == "auto" and gpus >= 2):
        size = world_size or gpus
        if not 0 < size <= gpus:
            sys.exit(f"--backend nccl: needs one GPU per rank, {size} ranks on {gpus} GPUs (NCCL refuses two ranks on one)")
        return World("nccl", size, "cuda")
    return World("gloo", world_size or 2, "cuda" if gpus >= 1 else "cpu")


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(fn: Callable[[], T], device: torch.device, group: dist.ProcessGroup | None) -> tuple[T, float]:
    """``fn()`` and its wall time in ms, started together on every rank (``group``) with nothing queued."""
    synchronize(device)
    if group is not None:
        dist.barrier(group)
    start = time.perf_counter()
    result = fn()
    synchronize(device)
    return result, (time.perf_counter() - start) * 1e3


def measure(
    dispatcher: TokenDispatcher[D, HandleT],
    stand_in: Callable[[D], torch.Tensor],
    batch: tuple[torch.Tensor, TopKOutput],
    group: dist.ProcessGroup | None,
    iters: int,
) -> tuple[float, float, int]:
    """Median dispatch and combine ms of this rank, and the slot rows its runner gets (``stand_in`` is the runner)."""
    device = batch[0].device
    dispatch_ms, combine_ms, rows = [], [], 0
    for _ in range(iters + 3):  # three warm-up calls
        dispatched, took = timed(lambda: dispatcher.dispatch(*batch), device, group)
        dispatch_ms.append(took)
        out = stand_in(dispatched.dispatch)  # one output row per slot row
        rows = out.shape[0]
        _, took = timed(lambda: dispatcher.combine(out, dispatched.handle), device, group)
        combine_ms.append(took)
    return statistics.median(dispatch_ms[3:]), statistics.median(combine_ms[3:]), rows


def rows_as_output(dispatch: StandardDispatchOutput) -> torch.Tensor:
    """The runner's stand-in: its input rows."""
    return dispatch.hidden_states


def dequantized_as_output(dispatch: Fp8SlotRows | Nvfp4SlotRows) -> torch.Tensor:
    """The runner's stand-in for quantized rows: its input rows dequantized, in the activations' dtype."""
    return dispatch.dequantize().to(dispatch.dtype)


def dispatch_bytes(name: str, tokens: int, top_k: int, payload_bytes: int) -> int:
    """Bytes of the rows one rank hands the dispatch's payload collective (its tokens encoded in ``payload_bytes``
    each), from the dispatchers' own row layouts."""
    if name.endswith("all-to-all"):
        return tokens * top_k * slot_layout(payload_bytes).row_bytes
    if name.endswith("all-gather"):
        return tokens * token_layout(payload_bytes, top_k).row_bytes
    return 0  # local, replicated: nothing is sent before the experts run


def slowest(values: tuple[float, float, int], device: torch.device) -> tuple[float, float, int]:
    """Each value's maximum over the ranks."""
    reduced = torch.tensor(values, dtype=torch.float64, device=device)
    dist.all_reduce(reduced, op=dist.ReduceOp.MAX)
    dispatch_ms, combine_ms, rows = reduced.tolist()
    return dispatch_ms, combine_ms, int(rows)


def run_rank(rank: int, world: World, init: str, shapes: list[str], tokens: list[int], dispatchers: list[str], iters: int) -> None:
    """One rank: every shape, token count and dispatcher; rank 0 prints the table."""
    device = world.device(rank)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group(world.backend, init_method=init, rank=rank, world_size=world.world_size)
    group = dist.group.WORLD
    assert group is not None
    rows: list[Row] = []
    for shape in shapes:
        experts, top_k, hidden = SHAPES[shape]
        config = MoeRunnerConfig(num_experts=experts, hidden_size=hidden, intermediate_size_per_partition=128, top_k=top_k)
        placement = ExpertPlacement(experts, world.world_size)
        for count in tokens:
            batches = []
            for seed in (rank, world.world_size):  # this rank's own tokens; then every rank's same ones (replicated)
                gen = torch.Generator(device=device).manual_seed(seed)
                rows_in = torch.randn(count, hidden, generator=gen, device=device).to(torch.bfloat16)
                batches.append((rows_in, select_experts(torch.randn(count, experts, generator=gen, device=device), config)))
            (x, topk), replicated = batches
            fp8, nvfp4 = Fp8TokenQuantizer(), Nvfp4TokenQuantizer(QuantizeGlobalScale.from_amax(6.0))  # randn: amax ~5
            batch = (x, topk)
            for name in dispatchers:
                payload_bytes = StandardPayload.of(x).row_bytes
                if name == "local":
                    result = measure(LocalDispatcher(), rows_as_output, batch, None, iters)
                elif name == "all-to-all":
                    result = measure(AllToAllDispatcher(group, placement), rows_as_output, batch, group, iters)
                elif name == "fp8-all-to-all":
                    payload_bytes = fp8.payload(x).row_bytes
                    fp8_to_all = QuantizedAllToAllDispatcher(group, placement, fp8)
                    result = measure(fp8_to_all, dequantized_as_output, batch, group, iters)
                elif name == "fp8-all-gather":
                    payload_bytes = fp8.payload(x).row_bytes
                    fp8_gather = QuantizedAllGatherDispatcher(group, placement, fp8)
                    result = measure(fp8_gather, dequantized_as_output, batch, group, iters)
                elif name == "nvfp4-all-to-all":
                    payload_bytes = nvfp4.payload(x).row_bytes
                    nvfp4_to_all = QuantizedAllToAllDispatcher(group, placement, nvfp4)
                    result = measure(nvfp4_to_all, dequantized_as_output, batch, group, iters)
                else:
                    sharding = TokenSharding.REPLICATED if name == "replicated" else TokenSharding.PER_RANK
                    same = replicated if name == "replicated" else batch
                    result = measure(AllGatherDispatcher(group, placement, sharding), rows_as_output, same, group, iters)
                sent = dispatch_bytes(name, count, top_k, payload_bytes)
                rows.append(Row(shape, count, name, *slowest(result, device), sent))
            del x, topk, batch, batches, replicated
            if device.type == "cuda":
                torch.cuda.empty_cache()
    if rank == 0:
        print(table(world, rows), flush=True)
    dist.destroy_process_group()


def table(world: World, rows: list[Row]) -> str:
    lines = [
        f"{world.backend}, world size {world.world_size}, {world.device_type} tensors; T per rank; ms: median, slowest rank",
        "| shape | T | dispatcher | dispatch ms | combine ms | rows | dispatch bytes |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    lines += [
        f"| {r.shape} | {r.tokens} | {r.dispatcher} | {r.dispatch_ms:.3f} | {r.combine_ms:.3f} | {r.rows} | {r.dispatch_bytes} |"
        for r in rows
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shapes", default="mixtral,deepseek")
    parser.add_argument("--tokens", default="1,256,4096")
    parser.add_argument("--dispatchers", default=",".join(DISPATCHERS))
    parser.add_argument("--world-size", type=int, default=None)
    parser.add_argument("--backend", choices=("auto", "nccl", "gloo"), default="auto")
    parser.add_argument("--iters", type=int, default=20)
    args = parser.parse_args()
    shapes, dispatchers = args.shapes.split(","), args.dispatchers.split(",")
    for name, known in ((shapes, SHAPES), (dispatchers, DISPATCHERS)):
        unknown = [item for item in name if item not in known]
        if unknown:
            parser.error(f"unknown {unknown}; the choices are {list(known)}")
    tokens = [int(count) for count in args.tokens.split(",")]
    world = available_world(args.world_size, args.backend)
    context = mp.get_context("spawn")
    with tempfile.TemporaryDirectory() as folder:
        init = f"file://{Path(folder) / 'rendezvous'}"
        ranks = [
            context.Process(target=run_rank, args=(rank, world, init, shapes, tokens, dispatchers, args.iters))
            for rank in range(world.world_size)
        ]
        for process in ranks:
            process.start()
        for process in ranks:
            process.join()
    failed = [rank for rank, process in enumerate(ranks) if process.exitcode != 0]
    if failed:
        sys.exit(f"ranks {failed} failed")


if __name__ == "__main__":
    main()
