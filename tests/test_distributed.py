"""Expert parallelism without a process group: the placement, the wire format, the slot sum, and every dispatcher's
pack/unpack logic run for simulated ranks in one process, each rank's output compared bit for bit with the
single-rank layer's rows. ``test_distributed_worlds.py`` runs the same layers over real gloo worlds and imports the
layer builders from here.
"""

from __future__ import annotations

import enum
import inspect
import os
import secrets
from collections.abc import Callable, Iterator
from typing import TypeVar

import attrs
import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F

import moe_core.backends.reference  # noqa: F401  # registers the reference backends (spawned ranks skip conftest)
from moe_core import (
    DenseMoeWeights,
    ExpertFp8Scales,
    ExpertQuantizeGlobalScales,
    Fp8ExpertWeights,
    Fp8GateUpWeights,
    Fp8MoeWeights,
    LinearBlockScales,
    MoeRunnerConfig,
    Nvfp4ExpertWeights,
    Nvfp4GateUpWeights,
    Nvfp4MoeWeights,
    QuantInfo,
    Runner,
    StandardDispatchOutput,
    TopKOutput,
    create_runner,
)
from moe_core.backends.reference import REFERENCE_DENSE, REFERENCE_FP8, REFERENCE_NVFP4, REFERENCE_NVFP4_W4A16
from moe_core import distributed
from moe_core.distributed import (
    AllGatherDispatcher,
    AllToAllDispatcher,
    ExpertParallelMoe,
    ExpertPlacement,
    GraphCaptureError,
    LocalDispatcher,
    RedundantExpertsError,
    TokenDispatcher,
    TokenSharding,
    slot_config,
    sum_slots,
)
from moe_core.distributed.all_gather import AllGatherHandle, gathered_slots, slot_buffer, token_layout
from moe_core.distributed.all_to_all import AllToAllHandle, Outbox, received_slots, returned_slots
from moe_core.distributed.collectives import backend_name
from moe_core.distributed.slots import slot_rows
from moe_core.distributed.wire import RowLayout, as_bytes, from_bytes
from moe_core.routing import select_experts
from moe_core.synthetic import quantize_fp8_layer, quantize_nvfp4_layer, random_dense_layer

NUM_EXPERTS, HIDDEN, INTER = 7, 32, 32
"""Seven experts: divisible by none of the world sizes 2, 3 and 4."""

Q = TypeVar("Q", bound=QuantInfo)
HandleT = TypeVar("HandleT")
Forward = Callable[[StandardDispatchOutput], torch.Tensor]
Take = Callable[[torch.Tensor], torch.Tensor]
"""A per-expert tensor ``[E, ...]`` cut to the experts a runner holds: the identity for the whole layer."""


def whole(per_expert: torch.Tensor) -> torch.Tensor:
    return per_expert


def bind(runner: Runner[Q], quant_info: Q) -> Forward:
    def forward(dispatch: StandardDispatchOutput) -> torch.Tensor:
        return runner.run(dispatch, quant_info)

    return forward


def fresh_seed() -> int:
    """``MOE_CORE_SEED`` or a random seed, printed for replay."""
    seed = int(os.environ.get("MOE_CORE_SEED", secrets.randbits(31)))
    print(f"seed {seed} (replay with MOE_CORE_SEED={seed})")
    return seed


@attrs.frozen(eq=False)
class RandomLayer:
    """A random layer of all experts, and the batch its static input scales are calibrated on (the same on every rank)."""

    config: MoeRunnerConfig
    dense: DenseMoeWeights
    calibration: StandardDispatchOutput

    @classmethod
    def make(cls, top_k: int, seed: int) -> RandomLayer:
        config = MoeRunnerConfig(
            num_experts=NUM_EXPERTS, hidden_size=HIDDEN, intermediate_size_per_partition=INTER, top_k=top_k,
            routed_scaling_factor=1.5,
        )
        dense, calibration = random_dense_layer(config, 16, torch.bfloat16, torch.device("cpu"), seed)
        return cls(config, dense, calibration)


def dense_forward(layer: RandomLayer, config: MoeRunnerConfig, take: Take) -> Forward:
    weights = DenseMoeWeights(w13=take(layer.dense.w13.to(torch.bfloat16)), w2=take(layer.dense.w2.to(torch.bfloat16)))
    return bind(create_runner(REFERENCE_DENSE, config), weights)


def _nvfp4_experts(weights: Nvfp4ExpertWeights, take: Take) -> Nvfp4ExpertWeights:
    return Nvfp4ExpertWeights(
        take(weights.packed),
        LinearBlockScales.from_checkpoint(take(weights.block_scales.data)),
        ExpertQuantizeGlobalScales.from_checkpoint(take(weights.global_scales.value)),
    )


def nvfp4_weights(layer: RandomLayer, take: Take) -> Nvfp4MoeWeights:
    """The layer in NVFP4, its input scales calibrated over all experts, then cut to a rank's experts."""
    full = quantize_nvfp4_layer(layer.config, layer.dense, layer.calibration)
    return Nvfp4MoeWeights(
        w13=Nvfp4GateUpWeights(gate=_nvfp4_experts(full.w13.gate, take), up=_nvfp4_experts(full.w13.up, take)),
        w2=_nvfp4_experts(full.w2, take),
        w13_input_scale=full.w13_input_scale,
        w2_input_scale=full.w2_input_scale,
    )


def nvfp4_forward(layer: RandomLayer, config: MoeRunnerConfig, take: Take) -> Forward:
    return bind(create_runner(REFERENCE_NVFP4, config), nvfp4_weights(layer, take))


def nvfp4_w4a16_forward(layer: RandomLayer, config: MoeRunnerConfig, take: Take) -> Forward:
    return bind(create_runner(REFERENCE_NVFP4_W4A16, config), nvfp4_weights(layer, take).without_activation_quantization())


def _fp8_experts(weights: Fp8ExpertWeights, take: Take) -> Fp8ExpertWeights:
    return Fp8ExpertWeights(take(weights.codes), ExpertFp8Scales.from_checkpoint(take(weights.scales.value)))


def fp8_forward(layer: RandomLayer, config: MoeRunnerConfig, take: Take) -> Forward:
    full = quantize_fp8_layer(layer.config, layer.dense, layer.calibration)
    weights = Fp8MoeWeights(
        w13=Fp8GateUpWeights(gate=_fp8_experts(full.w13.gate, take), up=_fp8_experts(full.w13.up, take)),
        w2=_fp8_experts(full.w2, take),
        w13_input_scale=full.w13_input_scale,
        w2_input_scale=full.w2_input_scale,
    )
    return bind(create_runner(REFERENCE_FP8, config), weights)


FORMATS: dict[str, Callable[[RandomLayer, MoeRunnerConfig, Take], Forward]] = {
    "dense": dense_forward,
    "nvfp4": nvfp4_forward,
    "nvfp4-w4a16": nvfp4_w4a16_forward,
    "fp8": fp8_forward,
}


@attrs.frozen
class Scenario:
    """A batch: tokens per rank (the first ``world_size`` entries), top-k and how the router leans."""

    name: str
    tokens: tuple[int, int, int, int]
    top_k: int = 2
    skewed: bool = False
    """Low expert ids far more popular (rank 0 receives most)."""
    starve_last_rank: bool = False
    """No token picks an expert of the last rank (it receives nothing)."""
    dtype: torch.dtype = torch.bfloat16
    """Of the activations. Float32 slot outputs make the sum's order show: bf16 ones mostly add exactly in float32."""

    def token_counts(self, world_size: int) -> tuple[int, ...]:
        return self.tokens[:world_size]

    def batch(self, world_size: int, seed: int) -> tuple[torch.Tensor, TopKOutput]:
        """The layer's whole batch, rank 0's tokens first: ``[sum(token_counts), H]`` and its routing."""
        gen = torch.Generator().manual_seed(seed + 1)
        num_tokens = sum(self.token_counts(world_size))
        x = torch.randn(num_tokens, HIDDEN, generator=gen).to(self.dtype)
        logits = torch.randn(num_tokens, NUM_EXPERTS, generator=gen)
        if self.skewed:
            logits += torch.linspace(4.0, 0.0, NUM_EXPERTS)
        if self.starve_last_rank:
            starved = ExpertPlacement(NUM_EXPERTS, world_size).experts_of(world_size - 1)
            logits[:, starved.start : starved.stop] = -1e4
        config = MoeRunnerConfig(
            num_experts=NUM_EXPERTS, hidden_size=HIDDEN, intermediate_size_per_partition=INTER, top_k=self.top_k
        )
        return x, select_experts(logits, config)


SCENARIOS = (
    Scenario("uneven_routing", (5, 2, 7, 3), top_k=3, skewed=True),
    Scenario("rank_sends_none", (3, 0, 4, 2)),
    Scenario("rank_receives_none", (4, 3, 5, 2), starve_last_rank=True),
    Scenario("no_tokens", (0, 0, 0, 0)),
    Scenario("float32_four_slots", (6, 3, 0, 5), top_k=4, skewed=True, dtype=torch.float32),
)


def rank_rows(scenario: Scenario, world_size: int, rank: int) -> slice:
    """Rank ``rank``'s rows of the layer's batch."""
    counts = scenario.token_counts(world_size)
    return slice(sum(counts[:rank]), sum(counts[: rank + 1]))


def rank_batch(x: torch.Tensor, topk: TopKOutput, rows: slice) -> tuple[torch.Tensor, TopKOutput]:
    return x[rows], TopKOutput(topk.topk_ids[rows], topk.topk_weights[rows], num_experts=topk.num_experts)


def layer_output(
    dispatcher: TokenDispatcher[StandardDispatchOutput, HandleT], layer: RandomLayer, fmt: str, x: torch.Tensor, topk: TopKOutput
) -> torch.Tensor:
    """The layer in ``fmt`` through ``dispatcher``, every expert in this process (a world of one)."""
    return ExpertParallelMoe(dispatcher, FORMATS[fmt](layer, dispatcher.runner_config(layer.config), whole))(x, topk)


def single_rank_output(layer: RandomLayer, fmt: str, x: torch.Tensor, topk: TopKOutput) -> torch.Tensor:
    """The single-rank layer (local dispatcher, every expert) on the whole batch."""
    return layer_output(LocalDispatcher(), layer, fmt, x, topk)


def rank_forward(layer: RandomLayer, fmt: str, placement: ExpertPlacement, rank: int) -> Forward:
    """Rank ``rank``'s runner over slot rows, on its slice of the layer."""

    def take(per_expert: torch.Tensor) -> torch.Tensor:
        return placement.local_slice(per_expert, rank)

    return FORMATS[fmt](layer, slot_config(placement.runner_config(layer.config, rank)), take)


def same_bits(actual: torch.Tensor, expected: torch.Tensor) -> bool:
    return actual.dtype == expected.dtype and actual.shape == expected.shape and torch.equal(as_bytes(actual), as_bytes(expected))


@pytest.fixture(autouse=True, scope="module")
def one_thread() -> Iterator[None]:
    """Tiny tensors: torch's thread pool only spins against the other processes on a shared CI machine."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def test_every_public_name_is_documented() -> None:
    missing = [name for name in distributed.__all__ if not inspect.getdoc(getattr(distributed, name))]
    for name in distributed.__all__:
        cls = getattr(distributed, name)
        if inspect.isclass(cls) and not issubclass(cls, enum.Enum):
            for member, value in vars(cls).items():
                if not member.startswith("_") and (callable(value) or isinstance(value, property)) and not inspect.getdoc(value):
                    missing.append(f"{name}.{member}")
    assert missing == []


# ---- the placement ------------------------------------------------------------------------------------------------


def test_placement_deals_contiguous_ranges_remainder_first() -> None:
    assert ExpertPlacement(7, 3).counts == (3, 2, 2) and ExpertPlacement(7, 3).offsets == (0, 3, 5)
    assert ExpertPlacement(256, 3).counts == (86, 85, 85)
    assert ExpertPlacement(8, 4).experts_of(3) == range(6, 8)


@pytest.mark.parametrize("num_experts", range(1, 13))
def test_rank_of_matches_experts_of(num_experts: int) -> None:
    for world_size in range(1, num_experts + 1):
        placement = ExpertPlacement(num_experts, world_size)
        expected = [rank for rank in range(world_size) for _ in placement.experts_of(rank)]
        ids = torch.arange(num_experts, dtype=torch.int32)
        assert placement.rank_of(ids).tolist() == expected, (num_experts, world_size)


def test_runner_config_and_local_slice_give_the_ranks_experts() -> None:
    placement = ExpertPlacement(7, 3)
    config = MoeRunnerConfig(num_experts=7, hidden_size=16, intermediate_size_per_partition=16, top_k=2)
    local = placement.runner_config(config, 1)
    assert (local.num_local_experts, local.local_expert_offset, local.top_k) == (2, 3, 2)
    per_expert = torch.arange(7 * 2).reshape(7, 2)
    assert placement.local_slice(per_expert, 2).tolist() == [[10, 11], [12, 13]]
    with pytest.raises(ValueError, match="num_local_experts == num_experts"):
        placement.runner_config(local, 0)
    with pytest.raises(ValueError, match=r"config.num_experts: expected 7"):
        placement.runner_config(attrs.evolve(config, num_experts=8, num_local_experts=8), 0)
    with pytest.raises(ValueError, match=r"per_expert: expected a tensor \[num_experts=7"):
        placement.local_slice(torch.zeros(6, 2), 0)
    with pytest.raises(ValueError, match="rank: expected a rank below world_size=3, got 3"):
        placement.experts_of(3)


def test_placement_refuses_redundant_experts_and_empty_ranks() -> None:
    with pytest.raises(RedundantExpertsError, match="num_physical_experts: 9 slots for 8 experts"):
        ExpertPlacement(8, 4, num_physical_experts=9)
    with pytest.raises(ValueError, match="num_physical_experts: expected num_experts=8"):
        ExpertPlacement(8, 4, num_physical_experts=7)
    with pytest.raises(ValueError, match="world_size: expected at most num_experts=3 ranks"):
        ExpertPlacement(3, 4)


# ---- wire format and the slot sum ---------------------------------------------------------------------------------


@pytest.mark.parametrize("num_rows", [0, 1, 5])
def test_row_layout_round_trips_every_dtype(num_rows: int) -> None:
    layout = RowLayout(((torch.bfloat16, 3), (torch.float8_e4m3fn, 2), (torch.int32, 1), (torch.float32, 2)))
    tensors = (
        torch.randn(num_rows, 3).to(torch.bfloat16),
        torch.randn(num_rows, 2).to(torch.float8_e4m3fn),
        torch.arange(num_rows, dtype=torch.int32),
        torch.randn(num_rows, 2),
    )
    rows = layout.pack(*tensors)
    assert rows.dtype == torch.uint8 and rows.shape == (num_rows, layout.row_bytes) and layout.row_bytes == 6 + 2 + 4 + 8
    for before, after in zip(tensors, layout.unpack(rows)):
        assert same_bits(after, before.reshape(after.shape))
    with pytest.raises(ValueError, match=r"tensors\[2\]: expected 1 torch.int32 columns per row"):
        layout.pack(tensors[0], tensors[1], tensors[3], tensors[3])
    with pytest.raises(ValueError, match=r"data: expected uint8 \[rows, 20\]"):
        layout.unpack(rows[:, 1:])


def test_sum_slots_adds_each_tokens_slots_in_slot_order_in_float32() -> None:
    slots = torch.tensor([[2.0**24], [1.0], [1.0], [1.0], [-(2.0**24)], [1.0]])
    # (2^24 + 1) + 1 rounds to 2^24 at each add; another order, (1 + 1) + 2^24, would give 2^24 + 2
    expected = torch.tensor([[2.0**24], [2.0 - 2.0**24]])
    assert torch.equal(sum_slots(slots, 3), expected)
    bf16 = torch.tensor([[1.0], [2.0**-8], [2.0**-8]], dtype=torch.bfloat16)
    assert sum_slots(bf16, 3).item() == 1.0078125  # 1 + 2^-7 in float32, then bf16: not 1 (bf16 adds would lose both)
    with pytest.raises(ValueError, match=r"slot_outputs: expected \[num_tokens \* top_k, hidden_size\] with top_k=2"):
        sum_slots(torch.zeros(3, 4), 2)


# ---- the single-rank layer ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("fmt", FORMATS)
def test_single_rank_layer_is_the_runner_at_top_k_one(fmt: str) -> None:
    """With one slot per token the slot rows are the tokens, and nothing is summed: the runner's own bits."""
    layer = RandomLayer.make(top_k=1, seed=fresh_seed())
    x, topk = Scenario("one_slot", (9, 0, 0, 0), top_k=1, skewed=True).batch(1, seed=3)
    expected = FORMATS[fmt](layer, layer.config, whole)(StandardDispatchOutput(x, topk))
    assert same_bits(single_rank_output(layer, fmt, x, topk), expected)


@pytest.mark.parametrize("fmt", FORMATS)
def test_single_rank_layer_is_near_the_runner(fmt: str) -> None:
    """Slots are rounded to bf16 before their float32 sum (vLLM's moe_sum); the runner sums experts in float32 first.

    One rounding per slot and one of the sum: a few bf16 ulps of the largest output (seen up to 0.94 * 2^-7 of it).
    """
    layer = RandomLayer.make(top_k=3, seed=fresh_seed())
    x, topk = SCENARIOS[0].batch(1, seed=5)
    expected = FORMATS[fmt](layer, layer.config, whole)(StandardDispatchOutput(x, topk)).float()
    actual = single_rank_output(layer, fmt, x, topk).float()
    assert (actual - expected).abs().max() <= 2.0**-6 * expected.abs().max()


def test_local_dispatcher_refuses_a_ranks_config_and_misshaped_outputs() -> None:
    dispatcher = LocalDispatcher()
    layer = RandomLayer.make(top_k=2, seed=0)
    with pytest.raises(ValueError, match="num_local_experts == num_experts"):
        dispatcher.runner_config(ExpertPlacement(NUM_EXPERTS, 2).runner_config(layer.config, 1))
    x, topk = SCENARIOS[1].batch(1, seed=0)
    dispatched = dispatcher.dispatch(x, topk)
    assert dispatched.dispatch.topk.top_k == 1 and dispatched.dispatch.hidden_states.shape == (2 * x.shape[0], HIDDEN)
    with pytest.raises(ValueError, match=r"out: expected the runner's output \[6, hidden_size\]"):
        dispatcher.combine(x, dispatched.handle)


# ---- simulated ranks: the dispatchers' pack and unpack, exchanges done by hand --------------------------------------


Parts = list[tuple[torch.Tensor, TopKOutput]]
"""Each rank's tokens and routing."""


def simulate_all_to_all(layer: RandomLayer, fmt: str, placement: ExpertPlacement, parts: Parts) -> list[torch.Tensor]:
    """Each rank's output through :class:`AllToAllDispatcher`'s steps, the two all-to-alls done by slicing."""
    world, dtype = range(placement.world_size), parts[0][0].dtype
    outboxes = [Outbox.pack(x, topk, placement) for x, topk in parts]
    sent = [[int(count) for count in outbox.counts.tolist()] for outbox in outboxes]  # sent[source][destination]

    def rows_for(data: torch.Tensor, splits: list[int], rank: int) -> torch.Tensor:
        return data[sum(splits[:rank]) : sum(splits[: rank + 1])]

    outputs = []
    for rank in world:
        received = torch.cat([rows_for(outboxes[source].rows, sent[source], rank) for source in world])
        dispatch = received_slots(received, dtype, HIDDEN, NUM_EXPERTS)
        assert dispatch.topk.topk_ids.numel() == 0 or placement.rank_of(dispatch.topk.topk_ids).eq(rank).all()
        outputs.append(as_bytes(rank_forward(layer, fmt, placement, rank)(dispatch)))
    results = []
    for rank in world:
        received_from = [sent[source][rank] for source in world]
        returned = torch.cat([rows_for(outputs[holder], [sent[s][holder] for s in world], rank) for holder in world])
        handle = AllToAllHandle(outboxes[rank].inverse, tuple(sent[rank]), tuple(received_from), parts[rank][1].top_k)
        results.append(returned_slots(returned, handle, dtype, HIDDEN))
    return results


def simulate_all_gather(
    layer: RandomLayer, fmt: str, placement: ExpertPlacement, parts: Parts, tokens: TokenSharding
) -> list[torch.Tensor]:
    """Each rank's output through :class:`AllGatherDispatcher`'s steps, the gather and the byte sum done in place."""
    world, top_k, dtype = range(placement.world_size), parts[0][1].top_k, parts[0][0].dtype
    if tokens is TokenSharding.PER_RANK:
        counts = tuple(x.shape[0] for x, _ in parts)
        layout = token_layout(dtype, HIDDEN, top_k)
        padded = [F.pad(layout.pack(x, t.topk_ids, t.topk_weights), (0, 0, 0, max(counts) - x.shape[0])) for x, t in parts]
        hidden, ids, weights = layout.unpack(torch.cat(padded))
    else:
        x, topk = parts[0]
        counts, hidden, ids, weights = (x.shape[0],), x, topk.topk_ids, topk.topk_weights
    buffers = []
    for rank in world:
        slot_hidden, slot_ids, slot_weights, selected = gathered_slots(hidden, ids, weights, counts, placement.experts_of(rank))
        out = rank_forward(layer, fmt, placement, rank)(slot_rows(slot_hidden, slot_ids, slot_weights, NUM_EXPERTS))
        buffers.append(slot_buffer(out, AllGatherHandle(selected, counts, top_k)))
    stacked = torch.stack(buffers)
    assert bool(((stacked != 0).sum(dim=0) <= 1).all()), "a byte written by two ranks: the byte sum would not be exact"
    summed = stacked.sum(dim=0, dtype=torch.uint8)
    if tokens is TokenSharding.REPLICATED:
        return [sum_slots(from_bytes(summed, dtype, HIDDEN), top_k) for _ in world]
    blocks = summed.view(len(world), -1, summed.shape[1])
    return [sum_slots(from_bytes(blocks[rank][: counts[rank] * top_k], dtype, HIDDEN), top_k) for rank in world]


SIMULATED = [
    pytest.param(world_size, fmt, scenario, id=f"w{world_size}-{fmt}-{scenario.name}")
    for world_size in (1, 2, 3, 4)
    for fmt in FORMATS
    for scenario in SCENARIOS
]


@pytest.mark.parametrize(("world_size", "fmt", "scenario"), SIMULATED)
def test_simulated_ranks_equal_the_single_rank_layer(world_size: int, fmt: str, scenario: Scenario) -> None:
    seed = fresh_seed()
    layer, placement = RandomLayer.make(scenario.top_k, seed), ExpertPlacement(NUM_EXPERTS, world_size)
    x, topk = scenario.batch(world_size, seed)
    expected = single_rank_output(layer, fmt, x, topk)
    parts = [rank_batch(x, topk, rank_rows(scenario, world_size, rank)) for rank in range(world_size)]
    for name, outputs in (
        ("all-to-all", simulate_all_to_all(layer, fmt, placement, parts)),
        ("all-gather", simulate_all_gather(layer, fmt, placement, parts, TokenSharding.PER_RANK)),
        ("replicated", simulate_all_gather(layer, fmt, placement, [(x, topk)] * world_size, TokenSharding.REPLICATED)),
    ):
        for rank, out in enumerate(outputs):
            want = expected if name == "replicated" else expected[rank_rows(scenario, world_size, rank)]
            assert same_bits(out, want), f"{name}: rank {rank} differs from the single-rank layer's rows"


# ---- one real process group of one rank, in this process ------------------------------------------------------------


@pytest.fixture(scope="module")
def world_of_one(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dist.ProcessGroup]:
    init = tmp_path_factory.mktemp("world_of_one") / "init"
    dist.init_process_group("gloo", init_method=f"file://{init}", rank=0, world_size=1)
    group = dist.group.WORLD
    assert group is not None
    yield group
    dist.destroy_process_group()


@pytest.mark.distributed
@pytest.mark.parametrize("fmt", ["dense", "nvfp4"])
def test_dispatchers_on_a_world_of_one_are_the_single_rank_layer(world_of_one: dist.ProcessGroup, fmt: str) -> None:
    layer, placement = RandomLayer.make(3, fresh_seed()), ExpertPlacement(NUM_EXPERTS, 1)
    x, topk = SCENARIOS[0].batch(1, seed=11)
    expected = single_rank_output(layer, fmt, x, topk)
    assert same_bits(layer_output(AllToAllDispatcher(world_of_one, placement), layer, fmt, x, topk), expected)
    assert same_bits(layer_output(AllGatherDispatcher(world_of_one, placement), layer, fmt, x, topk), expected)
    replicated = AllGatherDispatcher(world_of_one, placement, TokenSharding.REPLICATED)
    assert same_bits(layer_output(replicated, layer, fmt, x, topk), expected)


@pytest.mark.distributed
def test_backend_name_resolves_a_per_device_backend(world_of_one: dist.ProcessGroup, monkeypatch: pytest.MonkeyPatch) -> None:
    assert backend_name(world_of_one, torch.device("cpu")) == "gloo"
    monkeypatch.setattr(dist, "get_backend", lambda group: "cpu:gloo,cuda:nccl")
    assert backend_name(world_of_one, torch.device("cpu")) == "gloo"
    assert backend_name(world_of_one, torch.device("cuda", 1)) == "nccl"


@pytest.mark.distributed
def test_dispatchers_refuse_a_placement_of_another_world(world_of_one: dist.ProcessGroup) -> None:
    for make in (AllToAllDispatcher, AllGatherDispatcher):
        with pytest.raises(ValueError, match="placement: expected world_size=1 like the group, got 2"):
            make(world_of_one, ExpertPlacement(NUM_EXPERTS, 2))


@pytest.mark.distributed
def test_dispatchers_that_read_sizes_back_refuse_cuda_graph_capture(
    world_of_one: dist.ProcessGroup, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    x, topk = SCENARIOS[1].batch(1, seed=0)
    placement = ExpertPlacement(NUM_EXPERTS, 1)
    with pytest.raises(GraphCaptureError, match="AllToAllDispatcher.dispatch: reads its split sizes back"):
        AllToAllDispatcher(world_of_one, placement).dispatch(x, topk)
    with pytest.raises(GraphCaptureError, match="AllGatherDispatcher.dispatch"):
        AllGatherDispatcher(world_of_one, placement).dispatch(x, topk)
    LocalDispatcher().dispatch(x, topk)  # no host sync: capturable where its runner is


def test_dispatch_checks_the_routing_against_the_placement() -> None:
    x, topk = SCENARIOS[1].batch(1, seed=0)
    with pytest.raises(ValueError, match="topk.num_experts: expected 8 like the placement, got 7"):
        ExpertPlacement(8, 2).check_routing(x, topk)
    with pytest.raises(ValueError, match="hidden_states: expected 3 rows like topk_ids, got 2"):
        ExpertPlacement(NUM_EXPERTS, 2).check_routing(x[:2], topk)
