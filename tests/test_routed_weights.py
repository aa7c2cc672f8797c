"""Top-k weights routed outside moe-core must be what the layer's routing method gives, whichever backend runs.

A dispatch whose weights were already multiplied by ``routed_scaling_factor``
(the runner applies it again: the output scaled twice) or were not
renormalized under a renormalizing method computes another layer with no
shape, dtype or type to tell; the bound forward reads the values when the
top-k was built with ``check_values`` and refuses them by name. Kernels read
no values, so the check sits in :class:`~moe_core.registry.BoundRunner`, before
any backend runs: the test plugin below computes nothing from the weights.
"""

from __future__ import annotations

import math

import attrs
import pytest
import torch

from moe_core import (
    DenseMoeWeights,
    DispatchOutput,
    GroupedTopK,
    Llama4Sigmoid,
    MoeRunnerConfig,
    RoutedWeights,
    RoutingMethod,
    SigmoidTopK,
    SparseMixer,
    StandardDispatchOutput,
    TopKOutput,
    select_experts,
)
from moe_core.backends.reference import REFERENCE_DENSE
from moe_core.config import GroupScore, Routing, Scoring
from moe_core.registry import BoundRunner

E, H, I, T = 8, 16, 8, 11

METHODS: list[tuple[Routing, int]] = [
    (RoutingMethod.TOPK_RENORMALIZE, 3),
    (RoutingMethod.SOFTMAX_TOPK, 3),
    (SigmoidTopK(renormalize=True), 3),
    (SigmoidTopK(renormalize=False), 3),
    (GroupedTopK(n_group=4, topk_group=2, renormalize=True), 3),
    (GroupedTopK(n_group=4, topk_group=2, renormalize=False), 3),
    (Llama4Sigmoid(), 1),
    (SparseMixer(jitter_eps=0.01), 2),
]


def _layer(gen: torch.Generator, routing: Routing, top_k: int, scale: float) -> tuple[MoeRunnerConfig, DenseMoeWeights, torch.Tensor]:
    config = MoeRunnerConfig(
        num_experts=E, hidden_size=H, intermediate_size_per_partition=I, top_k=top_k, routing_method=routing,
        routed_scaling_factor=scale,
    )
    weights = DenseMoeWeights(
        w13=torch.randn(E, 2 * I, H, generator=gen) / math.sqrt(H), w2=torch.randn(E, H, I, generator=gen) / math.sqrt(I)
    )
    return config, weights, torch.randn(T, H, generator=gen)


@attrs.frozen
class _WeightBlindRunner:
    """A runner that reads no top-k weight (as kernels read no values): zeros of the right shape."""

    config: MoeRunnerConfig

    def run(self, dispatch: DispatchOutput, quant_info: DenseMoeWeights, /) -> torch.Tensor:
        return torch.zeros_like(dispatch.hidden_states)


@pytest.mark.parametrize(("routing", "top_k"), METHODS, ids=lambda m: getattr(m, "value", str(m)))
def test_every_method_gives_weights_its_bound_accepts(gen: torch.Generator, routing: Routing, top_k: int) -> None:
    """select_experts' own top-k passes for every method, with a scaling factor that the weights exclude."""
    config, weights, x = _layer(gen, routing, top_k, 2.5)
    topk = select_experts(torch.randn(T, E, generator=gen) * 3, config, score_correction_bias=None)
    out = REFERENCE_DENSE.bind(config, weights)(StandardDispatchOutput(x, topk))
    assert out.shape == x.shape and bool(out.isfinite().all())


@pytest.mark.parametrize(("routing", "top_k"), METHODS, ids=lambda m: getattr(m, "value", str(m)))
def test_weights_already_scaled_by_the_routed_scaling_factor_are_refused(
    gen: torch.Generator, routing: Routing, top_k: int
) -> None:
    config, weights, x = _layer(gen, routing, top_k, 2.5)
    topk = select_experts(torch.randn(T, E, generator=gen) * 3, config, score_correction_bias=None)
    if routing.routed_weights is RoutedWeights.EACH_AT_MOST_ONE:  # a weight near 1 shows it; small ones cannot
        topk = TopKOutput(topk.topk_ids, topk.topk_weights.clamp(min=0.5), num_experts=E)
    scaled = TopKOutput(topk.topk_ids, topk.topk_weights * 2.5, num_experts=E)
    bound = BoundRunner(_WeightBlindRunner(config), weights)
    with pytest.raises(ValueError, match=r"topk_weights: .* routed_scaling_factor=2\.5 is the runner's to apply"):
        bound(StandardDispatchOutput(x, scaled))
    with pytest.raises(ValueError, match=r"topk_weights: .*routing gives weights where"):
        REFERENCE_DENSE.bind(config, weights)(StandardDispatchOutput(x, scaled))


def test_weights_not_renormalized_under_a_renormalizing_method_are_refused(gen: torch.Generator) -> None:
    """Softmax top-k probabilities (sums below 1) handed to a layer that renormalizes."""
    config, weights, x = _layer(gen, RoutingMethod.TOPK_RENORMALIZE, 3, 1.0)
    unnormalized = select_experts(torch.randn(T, E, generator=gen), attrs.evolve(config, routing_method=RoutingMethod.SOFTMAX_TOPK))
    assert float(unnormalized.topk_weights.sum(dim=1).max()) < 0.99
    with pytest.raises(ValueError, match=r"topk_renormalize routing gives weights where each token's weights sum to 1, but a token's"):
        BoundRunner(_WeightBlindRunner(config), weights)(StandardDispatchOutput(x, unnormalized))


def test_bf16_rounded_weights_pass_and_unchecked_top_k_is_not_read(gen: torch.Generator) -> None:
    """Weights computed in bf16 (k = 8 summing to 1 within a few bf16 epsilons) pass; ``check_values=False`` (a
    serving loop's per-forward top-k) skips the value checks, the check's documented cost."""
    config, weights, x = _layer(gen, RoutingMethod.TOPK_RENORMALIZE, 8, 1.0)
    topk = select_experts(torch.randn(T, E, generator=gen), config)
    rounded = TopKOutput(topk.topk_ids, topk.topk_weights.bfloat16().float(), num_experts=E)
    BoundRunner(_WeightBlindRunner(config), weights)(StandardDispatchOutput(x, rounded))
    unchecked = TopKOutput(topk.topk_ids, topk.topk_weights * 2.5, num_experts=E, check_values=False)
    BoundRunner(_WeightBlindRunner(config), weights)(StandardDispatchOutput(x, unchecked))


@pytest.mark.parametrize("router", ["saturated", "masked"])
@pytest.mark.parametrize(
    ("routing", "top_k"),
    [(RoutingMethod.SOFTMAX_TOPK, 2), (Llama4Sigmoid(), 1),
     (GroupedTopK(n_group=4, topk_group=2, renormalize=False, scoring=Scoring.SOFTMAX, group_score=GroupScore.MAX), 2)],
    ids=lambda value: getattr(value, "value", str(value)),
)
def test_a_confident_routers_own_top_k_runs_though_its_weights_sum_to_one(
    gen: torch.Generator, routing: Routing, top_k: int, router: str
) -> None:
    """A saturated router (one logit far above the rest) or one whose other experts are masked to -inf gives
    weights that sum to 1 under a method that does not renormalize; ``select_experts``' own top-k carries the logits,
    against which the weights are checked exactly, so it runs (adversarial pass 16, c09: refused as renormalized)."""
    config, weights, x = _layer(gen, routing, top_k, 1.0)
    logits = torch.randn(T, E, generator=gen)
    if router == "saturated":
        logits[:, 3] += 40.0
    else:
        logits[:, top_k:] = float("-inf") if not isinstance(routing, Llama4Sigmoid) else -200.0
        logits[:, :top_k] += 30.0 if isinstance(routing, Llama4Sigmoid) else 0.0
    topk = select_experts(logits, config, score_correction_bias=None)
    assert float((topk.topk_weights.sum(dim=1) - 1).abs().max()) < 1e-6
    forward = REFERENCE_DENSE.bind(config, weights)
    out = forward(StandardDispatchOutput(x, topk))
    expected = forward(StandardDispatchOutput(x, TopKOutput(topk.topk_ids, topk.topk_weights, num_experts=E, check_values=False)))
    torch.testing.assert_close(out, expected, rtol=0, atol=0)


@pytest.mark.parametrize("routing", [RoutingMethod.SOFTMAX_TOPK, Llama4Sigmoid()], ids=lambda value: getattr(value, "value", str(value)))
def test_an_engines_own_saturated_top_k_without_logits_runs(gen: torch.Generator, routing: Routing) -> None:
    """Adversarial pass 16, c17: an engine's own top-k (ids and weights, no router logits) of a saturated router sums
    to 1 on every token; such tokens are no evidence of renormalization, so it runs. Renormalized weights of an
    ordinary router are still refused (the test above)."""
    top_k = 1 if isinstance(routing, Llama4Sigmoid) else 2
    config, weights, x = _layer(gen, routing, top_k, 1.0)
    logits = torch.randn(T, E, generator=gen)
    if top_k == 2:
        logits[:, 5] += 40.0
    else:
        logits[:, 5] = 15.5 + torch.rand(T, generator=gen) / 2  # sigmoid 0.9999998..., within rounding of 1, not 1
    own = select_experts(logits, config, score_correction_bias=None)
    assert float((own.topk_weights.sum(dim=1) - 1).abs().max()) < 1e-6
    forward = REFERENCE_DENSE.bind(config, weights)
    out = forward(StandardDispatchOutput(x, TopKOutput(own.topk_ids, own.topk_weights, num_experts=E)))
    expected = forward(StandardDispatchOutput(x, own))
    torch.testing.assert_close(out, expected, rtol=0, atol=0)
