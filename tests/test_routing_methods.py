"""Each routing method against a direct formula, the router, and the input-side weights of Llama 4's routing."""

from __future__ import annotations

import math

import attrs
import pytest
import torch

from moe_core.config import (
    GroupedTopK,
    GroupScore,
    Llama4Sigmoid,
    MoeRunnerConfig,
    RoutingMethod,
    Scoring,
    SigmoidTopK,
    SparseMixer,
)
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


def _softmax(row: list[float]) -> list[float]:
    top = max(row)
    exps = [math.exp(v - top) for v in row]
    return [e / sum(exps) for e in exps]


@pytest.mark.parametrize("group_score", list(GroupScore))
@pytest.mark.parametrize("renormalize", [False, True])
def test_softmax_grouped_topk_against_its_formula(gen: torch.Generator, renormalize: bool, group_score: GroupScore) -> None:
    """Mistral 4 (top-2 sums of softmax scores) and DeepSeek-V2's group-limited greedy (each group's best softmax
    score), written out per token; a correction bias moves the choice only."""
    method = GroupedTopK(n_group=4, topk_group=2, renormalize=renormalize, scoring=Scoring.SOFTMAX, group_score=group_score)
    logits, bias = torch.randn(12, E, generator=gen) * 2, torch.rand(E, generator=gen) * 0.1
    topk = select_experts(logits, _config(method), score_correction_bias=bias)
    want = []
    for row in logits.tolist():
        scores = _softmax(row)
        choice = [s + float(b) for s, b in zip(scores, bias, strict=True)]
        groups = [list(range(g * 2, g * 2 + 2)) for g in range(4)]
        width = 2 if group_score is GroupScore.TOP2_SUM else 1
        ranked = sorted(groups, key=lambda members: -sum(sorted((choice[e] for e in members), reverse=True)[:width]))
        kept = [e for members in ranked[:2] for e in members]
        best = sorted(kept, key=lambda e: -choice[e])[:3]
        total = sum(scores[e] for e in best) + 1e-20 if renormalize else 1.0
        want.append({e: scores[e] / total for e in best})
    _assert_same(_by_id(topk.topk_ids, topk.topk_weights), want)


def test_a_sum_floor_bounds_the_renormalizing_sum(gen: torch.Generator) -> None:
    """ERNIE 4.5: softmax scores chosen with a correction bias, weights divided by max(sum, moe_norm_min): a bias
    that picks three nearly-zero experts leaves their weights below 1 in total, where sum + 1e-20 would blow them up."""
    logits = torch.randn(12, E, generator=gen)
    logits[:, :3] = -40.0  # softmax scores near 4e-18
    bias = torch.zeros(E)
    bias[:3] = 10.0
    floor = 1e-12
    method = GroupedTopK(n_group=1, topk_group=1, renormalize=True, scoring=Scoring.SOFTMAX, sum_floor=floor)
    topk = select_experts(logits, _config(method), score_correction_bias=bias)
    assert (topk.topk_ids.sort(dim=1).values == torch.tensor([0, 1, 2], dtype=torch.int32)).all()
    scores = logits.softmax(dim=-1)[:, :3]
    assert _near(topk.topk_weights.sort(dim=1).values, (scores / scores.sum(dim=1, keepdim=True).clamp(min=floor)).sort(dim=1).values)
    assert float(topk.topk_weights.sum(dim=1).max()) < 1e-4
    unfloored = select_experts(logits, _config(attrs.evolve(method, sum_floor=None)), score_correction_bias=bias)
    assert _near(unfloored.topk_weights.sum(dim=1), scores.sum(dim=1) / (scores.sum(dim=1) + 1e-20))
    assert float(unfloored.topk_weights.sum(dim=1).min()) > 0.9


def test_grouped_topk_keeps_only_experts_of_the_best_groups(gen: torch.Generator) -> None:
    logits = torch.full((1, E), -5.0)
    logits[0, 0] = 5.0  # group 0 holds the best expert, group 3 the next two
    logits[0, 6:] = 4.0
    topk = select_experts(logits, _config(GroupedTopK(n_group=4, topk_group=2, renormalize=False)), score_correction_bias=None)
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
        (lambda: GroupedTopK(n_group=2, topk_group=1, renormalize=True, scoring="softmax"),  # type: ignore[arg-type]
         "GroupedTopK.scoring: expected a Scoring"),
        (lambda: GroupedTopK(n_group=2, topk_group=1, renormalize=False, sum_floor=1e-12), "needs renormalize=True"),
        (lambda: GroupedTopK(n_group=2, topk_group=1, renormalize=True, sum_floor=0.0), "sum_floor: expected a finite value > 0"),
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
    with pytest.raises(ValueError, match=r"Router\.bias: grouped_topk routing chooses on scores plus a correction bias"):
        route(torch.randn(3, 16, generator=gen), misplaced, config)
    placed = Router(weight=misplaced.weight, score_correction_bias=correction)
    assert route(torch.randn(3, 16, generator=gen), placed, config).topk_ids.shape == (3, config.top_k)


def test_a_grouped_router_names_its_correction_bias_or_none(gen: torch.Generator) -> None:
    """``Router(weight=...)`` for DeepSeek-V3's routing left its correction bias out silently (a quarter of the tokens
    to other experts, 0.67 off: an adversarial pass); a grouped router now says it has one, or None."""
    config = _config(GroupedTopK(n_group=4, topk_group=2, renormalize=True))
    weight, x = torch.randn(E, 16, generator=gen), torch.randn(3, 16, generator=gen)
    with pytest.raises(ValueError, match=r"Router\.score_correction_bias: grouped_topk routing chooses with the "
                                         r"router's correction bias .* or score_correction_bias=None"):
        route(x, Router(weight=weight), config)
    assert route(x, Router(weight=weight, score_correction_bias=None), config).topk_ids.shape == (3, config.top_k)
    assert route(x, Router(weight=weight), _config(RoutingMethod.SOFTMAX_TOPK)).topk_ids.shape == (3, config.top_k)
