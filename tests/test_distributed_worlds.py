"""Expert parallelism over real worlds of processes: every dispatcher, every reference format.

By default gloo worlds of 2, 3 and 4 CPU processes. ``MOE_CORE_DIST_BACKEND=nccl``
runs NCCL with one GPU per rank and CUDA tensors on the wire (the experts'
arithmetic stays on the CPU, so the expected bits are the same), at the world
sizes ``MOE_CORE_DIST_WORLD_SIZES`` lists (``benchmarks/ep_multi_gpu.sh``).
Each world starts once (``torch.multiprocessing`` spawn, a ``file://`` rendezvous
in a temporary folder) and runs every case inside it; each rank compares its
own output, bit for bit, with its rows of the single-rank layer (which it
computes itself on the whole batch) and writes its verdicts to a file the
tests read. Seven experts, so no world size divides them; tiny shapes.
"""

from __future__ import annotations

import json
import os
import time
import traceback
from datetime import timedelta
from pathlib import Path
from typing import TypeVar
from unittest import mock

import attrs
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from moe_core.dispatch import StandardDispatchOutput, TopKOutput
from moe_core.distributed import (
    AllGatherDispatcher,
    AllToAllDispatcher,
    ExpertParallelMoe,
    ExpertPlacement,
    TokenDispatcher,
    TokenSharding,
)
from tests.test_distributed import (
    FORMATS,
    NUM_EXPERTS,
    SCENARIOS,
    RandomLayer,
    Scenario,
    fresh_seed,
    rank_batch,
    rank_rows,
    same_bits,
    single_rank_output,
)

BACKEND = os.environ.get("MOE_CORE_DIST_BACKEND", "gloo")
"""``gloo`` (CPU tensors) or ``nccl`` (one GPU per rank, CUDA tensors)."""
WORLD_SIZES = tuple(int(size) for size in os.environ.get("MOE_CORE_DIST_WORLD_SIZES", "2,3,4").split(","))
WORLD_TIMEOUT_S = 90.0
"""A world's whole run, far above the ~10 s one takes on two cores: a hung collective hits gloo's 60 s timeout first."""
DISPATCHERS = ("all-to-all", "all-gather", "all-gather-reduce-scatter", "replicated")
"""``all-gather`` on gloo all-reduces (gloo lacks reduce_scatter in older torch); ``-reduce-scatter`` forces the other
branch."""
CASES = [(fmt, dispatcher, scenario) for fmt in FORMATS for dispatcher in DISPATCHERS for scenario in SCENARIOS]
HandleT = TypeVar("HandleT")


def case_id(fmt: str, dispatcher: str, scenario: Scenario) -> str:
    return f"{fmt}-{dispatcher}-{scenario.name}"


@attrs.frozen
class Verdict:
    """One rank's result for one case."""

    error: str | None
    """None where the rank's output has the single-rank layer's bits."""
    rows: int
    """Slot rows the rank's runner got."""


def on_device(dispatch: StandardDispatchOutput, device: torch.device) -> StandardDispatchOutput:
    """``dispatch`` with its tensors on ``device`` (values as delivered, not re-checked)."""
    topk = dispatch.topk
    moved = TopKOutput(
        topk.topk_ids.to(device), topk.topk_weights.to(device), num_experts=topk.num_experts, check_values=False
    )
    return StandardDispatchOutput(dispatch.hidden_states.to(device), moved)


def run_rank(
    dispatcher: TokenDispatcher[StandardDispatchOutput, HandleT],
    layer: RandomLayer,
    fmt: str,
    placement: ExpertPlacement,
    batch: tuple[torch.Tensor, TopKOutput],
    device: torch.device,
) -> tuple[torch.Tensor, int]:
    """This rank's layer output (on the CPU) and the slot rows its runner got; the tokens travel on ``device``."""
    rank, rows = dist.get_rank(), []

    def take(per_expert: torch.Tensor) -> torch.Tensor:
        return placement.local_slice(per_expert, rank)

    runner = FORMATS[fmt](layer, dispatcher.runner_config(layer.config), take)

    def forward(dispatch: StandardDispatchOutput) -> torch.Tensor:
        rows.append(dispatch.topk.num_tokens)
        return runner(on_device(dispatch, torch.device("cpu"))).to(device)

    x, topk = batch
    moved = on_device(StandardDispatchOutput(x, topk), device)
    return ExpertParallelMoe(dispatcher, forward)(moved.hidden_states, moved.topk).cpu(), rows[0]


def run_case(
    group: dist.ProcessGroup, fmt: str, dispatcher: str, scenario: Scenario, seed: int, device: torch.device
) -> Verdict:
    world_size, rank = group.size(), group.rank()
    placement = ExpertPlacement(NUM_EXPERTS, world_size)
    layer = RandomLayer.make(scenario.top_k, seed)
    x, topk = scenario.batch(world_size, seed)
    expected = single_rank_output(layer, fmt, x, topk)
    if dispatcher == "replicated":
        replicated = AllGatherDispatcher(group, placement, TokenSharding.REPLICATED)
        out, rows = run_rank(replicated, layer, fmt, placement, (x, topk), device)
    else:
        mine = rank_rows(scenario, world_size, rank)
        expected = expected[mine]
        batch = rank_batch(x, topk, mine)
        if dispatcher == "all-to-all":
            out, rows = run_rank(AllToAllDispatcher(group, placement), layer, fmt, placement, batch, device)
        elif dispatcher == "all-gather":
            out, rows = run_rank(AllGatherDispatcher(group, placement), layer, fmt, placement, batch, device)
        else:  # NCCL's branch, reduce_scatter itself: gloo has it in the torch pinned here
            with mock.patch("moe_core.distributed.collectives.backend_name", return_value="nccl"):
                out, rows = run_rank(AllGatherDispatcher(group, placement), layer, fmt, placement, batch, device)
    if same_bits(out, expected):
        return Verdict(None, rows)
    differ = (out.float() - expected.float()).abs().max() if out.shape == expected.shape else "-"
    return Verdict(f"rank {rank}: {tuple(out.shape)} {out.dtype}, max |difference| {differ}", rows)


def run_world(rank: int, world_size: int, folder: str, seed: int) -> None:
    """One rank: every case, its verdicts written to ``folder/rank<rank>.json``."""
    torch.set_num_threads(1)  # tiny tensors: threads would only spin against the other ranks on two cores
    init = f"file://{Path(folder) / 'rendezvous'}"
    device = torch.device("cpu")
    if BACKEND == "nccl":
        device = torch.device("cuda", rank)
        torch.cuda.set_device(device)
    dist.init_process_group(BACKEND, init_method=init, rank=rank, world_size=world_size, timeout=timedelta(seconds=60))
    group = dist.group.WORLD
    assert group is not None
    verdicts: dict[str, object] = {}
    try:
        for index, (fmt, dispatcher, scenario) in enumerate(CASES):
            verdict = run_case(group, fmt, dispatcher, scenario, seed + index, device)
            verdicts[case_id(fmt, dispatcher, scenario)] = attrs.asdict(verdict)
    except Exception:  # a rank that stops leaves the others in a collective until the timeout: report, do not hide
        verdicts["crash"] = traceback.format_exc()
    finally:
        (Path(folder) / f"rank{rank}.json").write_text(json.dumps(verdicts))
        dist.destroy_process_group()


@pytest.fixture(scope="module", params=WORLD_SIZES, ids=[f"world{size}" for size in WORLD_SIZES])
def world(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Verdict]]:
    """Each rank's verdicts, by case, from one world of ``request.param`` processes."""
    world_size = int(request.param)
    folder = tmp_path_factory.mktemp(f"world{world_size}")
    seed, context = fresh_seed(), mp.get_context("spawn")
    ranks = [context.Process(target=run_world, args=(rank, world_size, str(folder), seed)) for rank in range(world_size)]
    for process in ranks:
        process.start()
    deadline = time.monotonic() + WORLD_TIMEOUT_S
    for process in ranks:
        process.join(max(0.0, deadline - time.monotonic()))
    hung = [rank for rank, process in enumerate(ranks) if process.is_alive()]
    for rank in hung:
        ranks[rank].kill()
        ranks[rank].join()
    assert not hung, f"world of {world_size}: ranks {hung} still running after {WORLD_TIMEOUT_S} s"
    assert [process.exitcode for process in ranks] == [0] * world_size
    results = [json.loads((folder / f"rank{rank}.json").read_text()) for rank in range(world_size)]
    crashes = [f"rank {rank}:\n{verdicts['crash']}" for rank, verdicts in enumerate(results) if "crash" in verdicts]
    assert not crashes, "\n".join(crashes)
    return [{name: Verdict(**verdict) for name, verdict in verdicts.items()} for verdicts in results]


@pytest.mark.distributed
@pytest.mark.parametrize(
    ("fmt", "dispatcher", "scenario"), [pytest.param(*case, id=case_id(*case)) for case in CASES]
)
def test_every_rank_equals_the_single_rank_layer(
    world: list[dict[str, Verdict]], fmt: str, dispatcher: str, scenario: Scenario
) -> None:
    verdicts = [ranks[case_id(fmt, dispatcher, scenario)] for ranks in world]
    assert [verdict.error for verdict in verdicts] == [None] * len(world)
    if scenario.starve_last_rank and len(world) > 1:  # a world of one holds every expert: nothing can starve it
        assert verdicts[-1].rows == 0, "the last rank's experts were routed nothing, yet its runner got rows"
