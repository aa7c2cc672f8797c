"""Each routing method against a direct formula, the router, and the input-side weights of Llama 4's routing."""

from __future__ import annotations

import math

import pytest
import torch

from moe_core.config import GroupedTopK, Llama4Sigmoid, MoeRunnerConfig, RoutingMethod, SigmoidTopK, SparseMixer
from moe_core.dispatch import StandardDispatchOutput
from moe_core.formats.dense import DenseMoeWeights, DenseRecipe
from moe_core.formats.reference import ReferenceRunner
from moe_core.routing import Router, route, select_experts

E, H, I = 8, 16, 8


def _near(got: torch.Tensor, want: torch.Tensor, scale: torch.Tensor | None = None) -> bool:
    """Equal up to float32 rounding, relative to the largest magnitude of ``scale`` (default ``want``)."""
    return float((got - want).abs().max()) <= 1e-5 * float((want if scale is None else scale).abs().max())


def _config(routing: object, top_k: int = 3, **more: object) -> MoeRunnerConfig:
    return MoeRunnerConfig(E, H, I, top_k, routing_method=routing, **more)  # type: ignore[arg-type]  # test values


def _by_id(ids: torch.Tensor, weights: torch.Tensor) -> list[dict[int, float]]:
    """Each row's ``{expert: weight}``: methods that pick unsorted compare as sets."""
    return [{int(i): float(w) for i, w in zip(row_ids, row_w, strict=True)} for row_ids, row_w in zip(ids, weights, strict=True)]


def _assert_same(got: list[dict[int, float]], want: list[dict[int, float]]) -> None:
    for got_row, want_row in zip(got, want, strict=True):
        assert got_row.keys() == want_row.keys()
        for expert, weight in want_row.items():
            assert math.isclose(got_row[expert], weight, rel_tol=1e-6, abs_tol=1e-12)


def _sigmoid(x: float) -> float:
    return 1 / (1 + math.exp(-x))


@pytest.mark.parametrize("renormalize", [False, True])
def test_sigmoid_topk(gen: torch.Generator, renormalize: bool) -> None:
    logits = torch.randn(12, E, generator=gen)
    topk = select_experts(logits, _config(SigmoidTopK(renormalize=renormalize)))
    want = []
    for row in logits.tolist():
        best = sorted(range(E), key=lambda e: -row[e])[:3]
        scores = {e: _sigmoid(row[e]) for e in best}
        total = sum(scores.values()) if renormalize else 1.0
        want.append({e: s / total for e, s in scores.items()})
    _assert_same(_by_id(topk.topk_ids, topk.topk_weights), want)


@pytest.mark.parametrize("renormalize", [False, True])
def test_grouped_topk_against_the_deepseek_formula(gen: torch.Generator, renormalize: bool) -> None:
    method = GroupedTopK(n_group=4, topk_group=2, renormalize=renormalize)
    logits, bias = torch.randn(12, E, generator=gen), torch.randn(E, generator=gen) * 0.5
    topk = select_experts(logits, _config(method), score_correction_bias=bias)
    want = []
    for row in logits.tolist():
        scores = [_sigmoid(v) for v in row]
        choice = [s + float(b) for s, b in zip(scores, bias, strict=True)]
        groups = [list(range(g * 2, g * 2 + 2)) for g in range(4)]
        ranked = sorted(groups, key=lambda members: -sum(sorted((choice[e] for e in members), reverse=True)[:2]))
        kept = [e for members in ranked[:2] for e in members]
        best = sorted(kept, key=lambda e: -choice[e])[:3]
        total = sum(scores[e] for e in best) + 1e-20 if renormalize else 1.0
        want.append({e: scores[e] / total for e in best})
    _assert_same(_by_id(topk.topk_ids, topk.topk_weights), want)


def test_grouped_topk_keeps_only_experts_of_the_best_groups(gen: torch.Generator) -> None:
    logits = torch.full((1, E), -5.0)
    logits[0, 0] = 5.0  # group 0 holds the best expert, group 3 the next two
    logits[0, 6:] = 4.0
    topk = select_experts(logits, _config(GroupedTopK(n_group=4, topk_group=2, renormalize=False)))
    assert set(topk.topk_ids[0].tolist()) == {0, 6, 7}


def test_llama4_sigmoid_weights_and_input_scaling(gen: torch.Generator) -> None:
    config = _config(Llama4Sigmoid(), top_k=2)
    logits = torch.randn(6, E, generator=gen)
    topk = select_experts(logits, config)
    want = [{e: _sigmoid(row[e]) for e in sorted(range(E), key=lambda e: -row[e])[:2]} for row in logits.tolist()]
    _assert_same(_by_id(topk.topk_ids, topk.topk_weights), want)

    weights = DenseMoeWeights(w13=torch.randn(E, 2 * I, H, generator=gen), w2=torch.randn(E, H, I, generator=gen))
    x = torch.randn(6, H, generator=gen)
    got = ReferenceRunner(config, DenseRecipe()).run(StandardDispatchOutput(x, topk), weights)

    def mlp(e: int, v: torch.Tensor) -> torch.Tensor:
        gate, up = (weights.w13[e] @ v).chunk(2)
        return weights.w2[e] @ (torch.nn.functional.silu(gate) * up)

    for t in range(6):
        expected = torch.stack([mlp(e, w * x[t]) for e, w in want[t].items()]).sum(0)
        assert _near(got[t], expected)
    output_scaled = torch.stack([w * mlp(e, x[0]) for e, w in want[0].items()]).sum(0)
    assert not torch.allclose(got[0], output_scaled, rtol=1e-3)


def _mixer_formula(row: list[float], eps: float) -> dict[int, float]:
    first = max(range(E), key=lambda e: row[e])
    picks = {}
    candidates = list(range(E))
    for pick in (first, max((e for e in range(E) if e != first), key=lambda e: row[e])):
        top = row[pick]
        near = [e for e in candidates if (top - row[e]) / max(abs(row[e]), top) <= 2 * eps]
        picks[pick] = math.exp(row[pick]) / sum(math.exp(row[e]) for e in near)
        candidates = [e for e in candidates if e != first]
    return picks


def test_sparsemixer_against_its_formula(gen: torch.Generator) -> None:
    eps = 0.2
    logits = torch.randn(16, E, generator=gen)
    topk = select_experts(logits, _config(SparseMixer(jitter_eps=eps), top_k=2))
    _assert_same(_by_id(topk.topk_ids, topk.topk_weights), [_mixer_formula(row, eps) for row in logits.tolist()])


def test_router_computes_logits_with_its_bias(gen: torch.Generator) -> None:
    bias = torch.randn(E, generator=gen)
    router = Router(weight=torch.randn(E, H, generator=gen), bias=bias)
    x = torch.randn(5, H, generator=gen)
    assert _near(router.logits(x), x @ router.weight.T + bias)
    config = _config(RoutingMethod.TOPK_RENORMALIZE)
    assert torch.equal(route(x, router, config).topk_ids, select_experts(router.logits(x), config).topk_ids)


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda: _config(SparseMixer(jitter_eps=0.01), top_k=3), "sparsemixer routing picks exactly 2 experts"),
        (lambda: _config(GroupedTopK(n_group=3, topk_group=1, renormalize=True)), "must divide num_experts=8"),
        (lambda: _config(GroupedTopK(n_group=8, topk_group=1, renormalize=True)), "best two experts, got 1 per group"),
        (lambda: _config(GroupedTopK(n_group=4, topk_group=1, renormalize=True)), "at most the 2 experts"),
        (lambda: GroupedTopK(n_group=2, topk_group=3, renormalize=True), "topk_group: expected at most n_group=2"),
        (lambda: SparseMixer(jitter_eps=-0.1), "jitter_eps: expected a finite value >= 0"),
        (lambda: _config("grouped"), "routing_method: expected a RoutingMethod, SigmoidTopK"),
        (lambda: Router(weight=torch.zeros(E, H), bias=torch.zeros(E + 1)), r"Router.bias: expected shape"),
    ],
)
def test_bad_routing_values_are_refused(build: object, message: str) -> None:
    with pytest.raises((ValueError, TypeError), match=message):
        build()  # type: ignore[operator]  # each case a zero-argument callable


def test_score_correction_bias_belongs_to_grouped_topk_only() -> None:
    with pytest.raises(ValueError, match="score_correction_bias: only GroupedTopK routing takes one"):
        select_experts(torch.zeros(2, E), _config(RoutingMethod.SOFTMAX_TOPK), score_correction_bias=torch.zeros(E))


def test_a_correction_bias_passed_as_the_logit_bias_is_refused(gen: torch.Generator) -> None:
    """Under grouped top-k a logit bias moves every weight (sigmoid of the biased logit), a correction bias only the
    choice: DeepSeek-V3's ``e_score_correction_bias`` in ``Router(bias=...)`` computes another layer."""
    config = _config(GroupedTopK(n_group=4, topk_group=2, renormalize=True))
    correction = torch.randn(E, generator=gen)
    misplaced = Router(weight=torch.randn(E, 16, generator=gen), bias=correction)
    with pytest.raises(ValueError, match=r"Router\.bias: grouped_topk routing chooses on sigmoid scores plus a correction bias"):
        route(torch.randn(3, 16, generator=gen), misplaced, config)
    placed = Router(weight=misplaced.weight, score_correction_bias=correction)
    assert route(torch.randn(3, 16, generator=gen), placed, config).topk_ids.shape == (3, config.top_k)
