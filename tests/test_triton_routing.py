"""The fused Triton routing kernel against :func:`~moe_core.select_experts` (its float32 reference), and its refusals.

On the CPU the kernel runs under Triton's interpreter (``TRITON_INTERPRET=1``,
set in ``conftest.py``) at small shapes; on a CUDA device, compiled, at real
ones (DeepSeek-V3's 256 experts at T=4096 among them).

The ids of each row must be the reference's as a set (the kernel orders them
by its own arg-max passes). Each id's weight must match within ``rtol=1e-6``,
no ``atol``: both compute the same float32 expressions, but exp (numpy's
under the interpreter, libdevice's compiled, against torch's) may differ by
an ulp or two, and the sums over the experts (softmax) and over the k picked
(renormalization) are taken in another order, a few more ulps of 1.2e-7 at
most (seen on the CPU: 2.8e-7).

Logits have no ties, where torch.topk's order among equal scores would
decide: float32 logits are drawn from a normal, bf16 ones without
replacement from the bf16 numbers of magnitude in [1/16, 4) (a normal
rounded to bf16 ties often).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import attrs
import pytest
import torch

from moe_core import (
    GroupedTopK,
    GroupScore,
    Llama4Sigmoid,
    MoeRunnerConfig,
    Router,
    Routing,
    RoutingMethod,
    Scoring,
    SigmoidTopK,
    SparseMixer,
    StandardDispatchOutput,
    TopKOutput,
    dense_layer,
    route,
    select_experts,
)
from moe_core.backends.triton.routing import MAX_TOP_K, fused_routing_refusal, fused_select_experts
from moe_core.config import example_routings
from moe_core.formats import DenseMoeWeights
from moe_core.routing import routing_summary

CUDA = torch.cuda.is_available()
DEVICE = torch.device("cuda" if CUDA else "cpu")
RTOL = 1e-6
DTYPES = [torch.float32, torch.bfloat16]

SMALL = [
    # (tokens, experts, top_k): example_routings' grouped top-k has 8 groups (4 kept) but for 8 experts (4, 2 kept)
    (37, 8, 2),
    (37, 64, 6),
    (2, 256, 8),
    (1, 128, 8),
    (2, 160, 8),
]
REAL = [
    (1, 8, 2),
    (37, 64, 6),
    (1, 256, 8),
    (4096, 256, 8),
    (37, 128, 8),
    (1000, 160, 8),
]
SHAPES = REAL if CUDA else SMALL
COMBINATIONS_SHAPE = (4096, 256, 8, 8, 4) if CUDA else (9, 16, 3, 4, 2)
"""(tokens, experts, top_k, groups, kept groups) of the test of every grouped top-k."""


def shape_id(shape: tuple[int, ...]) -> str:
    """A shape's test id."""
    return "T{}-E{}-k{}".format(*shape)


def random_logits(gen: torch.Generator, tokens: int, experts: int, dtype: torch.dtype) -> torch.Tensor:
    """``[tokens, experts]`` logits without ties in a row, on the test's device (see the module docstring)."""
    if dtype == torch.float32:
        return torch.randn(tokens, experts, generator=gen).to(DEVICE)
    # the bf16 bit patterns from 1/16 (0x3D80) up to 4 (0x4080), and their negatives
    pool = torch.arange(0x3D80, 0x4080, dtype=torch.int16).view(torch.bfloat16)
    pool = torch.cat((pool, -pool))
    picks = torch.rand(tokens, pool.numel(), generator=gen).argsort(dim=1)[:, :experts]
    return pool[picks].to(dtype).to(DEVICE)


def random_bias(gen: torch.Generator, method: GroupedTopK, experts: int) -> torch.Tensor:
    """A correction bias on the scale of the scores' spread (sigmoid: about 0.2, softmax: about 1 / experts), so it
    moves the choice."""
    scale = 0.1 if method.scoring is Scoring.SIGMOID else 1.0 / experts
    return (torch.randn(experts, generator=gen) * scale).to(DEVICE)


def layer(method: Routing, experts: int, top_k: int) -> MoeRunnerConfig:
    """A layer of ``experts`` routed by ``method`` (its sizes other than the routing's do not matter here)."""
    return MoeRunnerConfig(num_experts=experts, hidden_size=64, intermediate_size_per_partition=32, top_k=top_k,
                           routing_method=method)


def fused_routings(experts: int, top_k: int) -> list[Routing]:
    """Every method of :func:`example_routings` the kernel fuses (all but sparsemixer)."""
    return [method for method in example_routings(experts, top_k) if not isinstance(method, SparseMixer)]


def with_median_floor(logits: torch.Tensor, method: GroupedTopK, top_k: int, bias: torch.Tensor | None) -> GroupedTopK:
    """``method`` renormalized with a ``sum_floor`` at the median of the rows' sums, so that it binds on some."""
    raw = attrs.evolve(method, renormalize=False, sum_floor=None)
    sums = select_experts(logits, layer(raw, logits.shape[1], top_k), score_correction_bias=bias).topk_weights.sum(dim=1)
    return attrs.evolve(method, renormalize=True, sum_floor=float(sums.median()))


def assert_routes_as_select_experts(
    logits: torch.Tensor, config: MoeRunnerConfig, bias: torch.Tensor | None
) -> TopKOutput:
    """The fused top-k of ``logits`` has select_experts' ids per row (as sets) and weights per id; returns it."""
    expected = select_experts(logits, config, score_correction_bias=bias)
    fused = fused_select_experts(logits, config, score_correction_bias=bias)
    shape = (logits.shape[0], config.top_k)
    assert fused.topk_ids.dtype == torch.int32 and fused.topk_weights.dtype == torch.float32
    assert tuple(fused.topk_ids.shape) == tuple(fused.topk_weights.shape) == shape
    assert fused.router_logits is logits and fused.from_router_logits and fused.num_experts == config.num_experts
    TopKOutput(fused.topk_ids, fused.topk_weights, num_experts=config.num_experts)  # in range, distinct, finite >= 0
    ids, order = fused.topk_ids.sort(dim=1)
    expected_ids, expected_order = expected.topk_ids.sort(dim=1)
    differ = (ids != expected_ids).any(dim=1).nonzero()
    name = config.routing_method.value
    assert not differ.numel(), f"{name}: row {int(differ[0, 0])} picks {ids[differ[0, 0]].tolist()}, " \
                               f"select_experts {expected_ids[differ[0, 0]].tolist()}"
    torch.testing.assert_close(fused.topk_weights.gather(1, order), expected.topk_weights.gather(1, expected_order),
                               rtol=RTOL, atol=0, msg=lambda text: f"{name}: {text}")
    return fused


MINIMAX_M2 = GroupedTopK(n_group=1, topk_group=1, renormalize=True)
"""Sigmoid scores chosen with a correction bias, one group (MiniMax-M2, AFMoE, LFM2)."""
ERNIE = GroupedTopK(n_group=1, topk_group=1, renormalize=True, scoring=Scoring.SOFTMAX)
"""Softmax scores chosen with a correction bias, one group; ERNIE 4.5 floors the sum (``moe_norm_min``)."""


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", SHAPES, ids=shape_id)
def test_every_method_routes_as_select_experts(gen: torch.Generator, shape: tuple[int, int, int],
                                               dtype: torch.dtype) -> None:
    tokens, experts, top_k = shape
    logits = random_logits(gen, tokens, experts, dtype)
    methods = fused_routings(experts, top_k)
    assert {type(method) for method in methods} == {RoutingMethod, SigmoidTopK, GroupedTopK, Llama4Sigmoid}
    for method in [*methods, MINIMAX_M2]:
        config = layer(method, experts, top_k)
        if isinstance(method, GroupedTopK):
            assert_routes_as_select_experts(logits, config, random_bias(gen, method, experts))
            assert_routes_as_select_experts(logits, config, None)
        else:
            assert_routes_as_select_experts(logits, config, None)
    bias = random_bias(gen, ERNIE, experts)
    assert_routes_as_select_experts(logits, layer(with_median_floor(logits, ERNIE, top_k, bias), experts, top_k), bias)


@pytest.mark.parametrize("renormalize", ["no", "sum", "sum_floor"])
@pytest.mark.parametrize("group_score", list(GroupScore), ids=lambda score: score.value)
@pytest.mark.parametrize("scoring", list(Scoring), ids=lambda scoring: scoring.value)
def test_every_grouped_top_k_routes_as_select_experts(
    gen: torch.Generator, scoring: Scoring, group_score: GroupScore, renormalize: str
) -> None:
    tokens, experts, top_k, groups, kept = COMBINATIONS_SHAPE
    per_group = experts // groups
    grouped = GroupedTopK(n_group=groups, topk_group=kept, renormalize=renormalize != "no", scoring=scoring,
                          group_score=group_score)
    for dtype in DTYPES:
        logits = random_logits(gen, tokens, experts, dtype)
        for bias in (random_bias(gen, grouped, experts), None):
            method = with_median_floor(logits, grouped, top_k, bias) if renormalize == "sum_floor" else grouped
            fused = assert_routes_as_select_experts(logits, layer(method, experts, top_k), bias)
            groups_used = [len(set(row)) for row in (fused.topk_ids // per_group).tolist()]
            assert max(groups_used) <= kept  # dropped groups' experts are never picked


GROUPED = GroupedTopK(n_group=4, topk_group=2, renormalize=True)


def test_strided_logits_and_no_tokens(gen: torch.Generator) -> None:
    """Logits are read through their strides (a transposed view here); zero tokens launch nothing."""
    logits = random_logits(gen, 16, 5, torch.float32).t()
    config = layer(GROUPED, 16, 3)
    assert_routes_as_select_experts(logits, config, random_bias(gen, GROUPED, 16))
    empty = fused_select_experts(logits[:0], config, score_correction_bias=None)
    assert tuple(empty.topk_ids.shape) == tuple(empty.topk_weights.shape) == (0, 3)


def test_refusals_name_sparsemixer_and_top_k() -> None:
    mixer = layer(SparseMixer(jitter_eps=0.01), 8, 2)
    reason = fused_routing_refusal(mixer)
    assert reason is not None and "sparsemixer" in reason and "select_experts" in reason
    logits = torch.zeros(2, 8, device=DEVICE)  # refused before any value is read
    with pytest.raises(ValueError, match="fused_select_experts: sparsemixer routing is not fused"):
        fused_select_experts(logits, mixer, score_correction_bias=None)
    wide = layer(RoutingMethod.TOPK_RENORMALIZE, 32, MAX_TOP_K + 1)
    reason = fused_routing_refusal(wide)
    assert reason is not None and f"top_k={MAX_TOP_K + 1}" in reason and f"at most {MAX_TOP_K}" in reason
    with pytest.raises(ValueError, match=f"top_k={MAX_TOP_K + 1}"):
        fused_select_experts(torch.zeros(2, 32, device=DEVICE), wide, score_correction_bias=None)
    for method in fused_routings(32, MAX_TOP_K):
        assert fused_routing_refusal(layer(method, 32, MAX_TOP_K)) is None, method


MISUSES: dict[str, tuple[Callable[[], Any], Routing, Any]] = {
    "1-d logits": (lambda: torch.zeros(8), RoutingMethod.SOFTMAX_TOPK, None),
    "wrong expert count": (lambda: torch.zeros(3, 7), RoutingMethod.SOFTMAX_TOPK, None),
    "integer logits": (lambda: torch.zeros(3, 8, dtype=torch.int32), RoutingMethod.SOFTMAX_TOPK, None),
    "logits not a tensor": (lambda: [[0.0] * 8], RoutingMethod.SOFTMAX_TOPK, None),
    "bias without grouped routing": (lambda: torch.zeros(3, 8), SigmoidTopK(renormalize=True), torch.zeros(8)),
    "bias of the wrong shape": (lambda: torch.zeros(3, 8), GROUPED, torch.zeros(9)),
    "bias not a tensor": (lambda: torch.zeros(3, 8), GROUPED, [0.0] * 8),
}


@pytest.mark.parametrize("misuse", MISUSES)
def test_misuses_are_refused_as_select_experts_refuses_them(misuse: str) -> None:
    logits, method, bias = MISUSES[misuse]
    config = layer(method, 8, 2)
    with pytest.raises((TypeError, ValueError)) as expected:
        select_experts(logits(), config, score_correction_bias=bias)
    with pytest.raises(expected.type) as fused:
        fused_select_experts(logits(), config, score_correction_bias=bias)
    assert str(fused.value) == str(expected.value)


def test_route_takes_the_fused_kernel_where_it_applies(gen: torch.Generator, monkeypatch: pytest.MonkeyPatch) -> None:
    """``route`` is the fused kernel's top-k on CUDA (bit for bit), ``select_experts``' elsewhere and for
    sparsemixer; ``fused=True`` runs the kernel (under the interpreter on the CPU) or says why not."""
    x = torch.randn(9, 64, generator=gen).to(DEVICE)
    for method in [*fused_routings(16, 2), SparseMixer(jitter_eps=0.01)]:
        config = layer(method, 16, 2)
        grouped = isinstance(method, GroupedTopK)
        bias = random_bias(gen, method, 16) if isinstance(method, GroupedTopK) else None
        router = Router(weight=torch.randn(16, 64, generator=gen).to(DEVICE) / 8, score_correction_bias=bias)  # logits ~ N(0, 1): no sigmoid ties at 1.0
        logits = router.logits(x)
        plain = select_experts(logits, config, score_correction_bias=bias)
        mixer = isinstance(method, SparseMixer)
        auto = route(x, router, config)
        expected = plain if mixer or not CUDA else fused_select_experts(logits, config, score_correction_bias=bias)
        assert torch.equal(auto.topk_ids, expected.topk_ids) and torch.equal(auto.topk_weights, expected.topk_weights)
        off = route(x, router, config, fused=False)
        assert torch.equal(off.topk_ids, plain.topk_ids) and torch.equal(off.topk_weights, plain.topk_weights)
        assert ("fused Triton kernel" in routing_summary(config, torch.device("cuda"))) is not mixer
        assert "select_experts (the fused routing kernel runs on CUDA devices" in routing_summary(config, torch.device("cpu"))
        if mixer:
            with pytest.raises(ValueError, match="route\\(fused=True\\): sparsemixer routing is not fused"):
                route(x, router, config, fused=True)
            continue
        forced = route(x, router, config, fused=True)
        assert forced.from_router_logits and not forced.check_values, grouped
        ids, order = forced.topk_ids.sort(dim=1)
        plain_ids, plain_order = plain.topk_ids.sort(dim=1)
        assert torch.equal(ids, plain_ids), method
        torch.testing.assert_close(forced.topk_weights.gather(1, order), plain.topk_weights.gather(1, plain_order),
                                   rtol=RTOL, atol=0)
    if not CUDA:
        monkeypatch.setenv("TRITON_INTERPRET", "0")
        with pytest.raises(ValueError, match=r"route\(fused=True\): the fused routing kernel runs on CUDA devices"):
            route(x, router, layer(RoutingMethod.SOFTMAX_TOPK, 16, 2), fused=True)
    with pytest.raises(TypeError, match="route: fused is True, False or None"):
        route(x, router, config, fused="yes")  # type: ignore[arg-type]  # the runtime check under test


@pytest.mark.skipif(not CUDA, reason="needs CUDA graphs")
def test_a_layer_routes_with_the_kernel_inside_a_cuda_graph(gen: torch.Generator) -> None:
    """DeepSeek-V3's routing (grouped top-k, correction bias) in a bf16 layer on the GPU: the forward, routing
    included, is captured and replayed; it matches the layer's experts run on select_experts' top-k within the
    bf16 output rounding (the two sum a token's experts in another order)."""
    method = GroupedTopK(n_group=8, topk_group=4, renormalize=True)
    config = MoeRunnerConfig(num_experts=64, hidden_size=256, intermediate_size_per_partition=128, top_k=8,
                             routing_method=method, routed_scaling_factor=2.5)
    weights = DenseMoeWeights(w13=torch.randn(64, 256, 256, generator=gen).cuda() / 16,
                              w2=torch.randn(64, 256, 128, generator=gen).cuda() / 11)
    router = Router(weight=torch.randn(64, 256, generator=gen).to("cuda", torch.bfloat16) / 16,
                    score_correction_bias=random_bias(gen, method, 64))
    built = dense_layer(config, router, weights, dtype=torch.bfloat16)
    assert built.routing == "routing: fused Triton kernel"
    static_x = torch.randn(33, 256, generator=gen).to("cuda", torch.bfloat16)
    built(static_x)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = built(static_x)
    fresh = torch.randn(33, 256, generator=gen).to("cuda", torch.bfloat16)
    static_x.copy_(fresh)
    graph.replay()
    torch.testing.assert_close(captured, built(fresh), rtol=0, atol=0)
    plain = select_experts(router.logits(fresh), config, score_correction_bias=router.score_correction_bias)  # its own
    expected = built.experts(StandardDispatchOutput(fresh, plain)).double()
    assert float((captured.double() - expected).norm() / expected.norm()) < 2.0**-8


def test_a_layer_says_what_routes_it_and_takes_fused_routing_as_route_does(gen: torch.Generator) -> None:
    config = layer(GROUPED, 16, 3)
    weights = DenseMoeWeights(w13=torch.randn(16, 64, 64, generator=gen).to(DEVICE) / 8,
                              w2=torch.randn(16, 64, 32, generator=gen).to(DEVICE) / 6)
    router = Router(weight=torch.randn(16, 64, generator=gen).to(DEVICE) / 8, score_correction_bias=random_bias(gen, GROUPED, 16))
    built = dense_layer(config, router, weights, dtype=torch.float32)
    forced, off = attrs.evolve(built, fused_routing=True), attrs.evolve(built, fused_routing=False)
    assert built.routing == ("routing: fused Triton kernel" if CUDA else
                             f"routing: select_experts (the fused routing kernel runs on CUDA devices (logits on {DEVICE}))")
    assert forced.routing == "routing: fused Triton kernel"
    assert off.routing == "routing: select_experts (fused=False)"
    x = torch.randn(5, 64, generator=gen).to(DEVICE)
    (fused_out, fused_topk), (plain_out, plain_topk) = forced.forward(x), off.forward(x)
    assert not fused_topk.check_values and plain_topk.check_values  # the kernel's top-k, and select_experts'
    torch.testing.assert_close(fused_out, plain_out, rtol=1e-5, atol=1e-6)  # float32: the same experts, summed apart
    with pytest.raises(TypeError, match="MoeLayer.fused_routing: expected True, False or None, got 'yes'"):
        attrs.evolve(built, fused_routing="yes")  # type: ignore[arg-type]  # the runtime check under test
