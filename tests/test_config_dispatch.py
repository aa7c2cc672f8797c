"""Validation of the config, the routing and the dispatch output."""

from __future__ import annotations

import pytest
import torch

from moe_core import MoeRunnerConfig, RoutingMethod, StandardDispatchOutput, TopKOutput, select_experts

BASE = {"num_experts": 8, "hidden_size": 64, "intermediate_size_per_partition": 32, "top_k": 2}


@pytest.mark.parametrize(
    ("changes", "error", "message"),
    [
        ({"num_experts": 0}, ValueError, "num_experts: expected an int >= 1, got 0"),
        ({"hidden_size": 64.0}, TypeError, "hidden_size: expected an int, got float"),
        ({"top_k": 9}, ValueError, "top_k: expected at most num_experts=8, got 9"),
        ({"num_local_experts": 4, "local_expert_offset": 5}, ValueError, r"local experts \[5, 9\) exceed num_experts=8"),
        ({"local_expert_offset": -1}, ValueError, "local_expert_offset: expected an int >= 0"),
        ({"routed_scaling_factor": float("nan")}, ValueError, "routed_scaling_factor: expected a finite value > 0"),
        ({"activation": "silu"}, TypeError, "activation: expected an Activation"),
    ],
)
def test_config_rejects_bad_values(changes: dict[str, object], error: type[Exception], message: str) -> None:
    with pytest.raises(error, match=message):
        MoeRunnerConfig(**{**BASE, **changes})  # type: ignore[arg-type]  # bad values are the point


def test_config_defaults_to_all_experts_local() -> None:
    config = MoeRunnerConfig(**BASE)  # type: ignore[arg-type]  # a dict of ints
    assert (config.num_local_experts, config.local_expert_offset) == (8, 0)


@pytest.mark.parametrize("method", list(RoutingMethod))
def test_select_experts_against_plain_softmax(gen: torch.Generator, method: RoutingMethod) -> None:
    config = MoeRunnerConfig(**BASE, routing_method=method)  # type: ignore[arg-type]  # a dict of ints
    logits = torch.randn(10, 8, generator=gen)

    topk = select_experts(logits, config)

    probs = torch.exp(logits.double()) / torch.exp(logits.double()).sum(-1, keepdim=True)
    picked = probs.gather(1, topk.topk_ids.long())
    assert bool((picked.min(dim=1).values >= probs.sort(dim=1, descending=True).values[:, 1] - 1e-12).all())
    expected = picked if method is RoutingMethod.SOFTMAX_TOPK else picked / picked.sum(-1, keepdim=True)
    assert torch.allclose(topk.topk_weights.double(), expected, rtol=1e-6, atol=0)
    assert topk.router_logits is logits


def test_topk_rejects_bad_input() -> None:
    ids = torch.tensor([[0, 1], [2, 3], [1, 0], [7, 4]], dtype=torch.int32)
    weights = torch.rand(4, 2)
    with pytest.raises(TypeError, match="topk_ids: expected dtype torch.int32, got torch.int64"):
        TopKOutput(ids.long(), weights, num_experts=8)
    with pytest.raises(ValueError, match=r"topk_weights: expected shape \(4, 2\)"):
        TopKOutput(ids, weights[:3], num_experts=8)
    with pytest.raises(ValueError, match="topk_ids: expected ids >= 0, got -1"):
        TopKOutput(ids - 1, weights, num_experts=8)
    with pytest.raises(ValueError, match=r"topk_ids: expected ids < 8 \(num_experts\), got 8"):
        TopKOutput(ids + 1, weights, num_experts=8)
    with pytest.raises(ValueError, match=r"router_logits: expected shape \(4, 8\)"):
        TopKOutput(ids, weights, torch.randn(4, 6), num_experts=8, from_router_logits=False)
    unchecked = TopKOutput(ids - 1, weights, num_experts=8, check_values=False)
    assert int(unchecked.topk_ids.min()) == -1, "check_values=False skips only the value checks"
    with pytest.raises(TypeError, match="topk_weights: expected a torch.Tensor, got list"):
        TopKOutput(ids, [[0.5, 0.5]] * 4, num_experts=8)  # type: ignore[arg-type]  # the runtime check under test


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a second device")
def test_topk_rejects_tensors_on_two_devices() -> None:
    with pytest.raises(ValueError, match="expected all tensors on one device"):
        TopKOutput(torch.zeros(4, 2, dtype=torch.int32), torch.rand(4, 2).cuda(), num_experts=8)


def test_dispatch_rejects_bad_input() -> None:
    topk = TopKOutput(torch.tensor([[0, 1]] * 4, dtype=torch.int32), torch.rand(4, 2), num_experts=2)
    with pytest.raises(ValueError, match=r"hidden_states: expected 4 rows like topk_ids, got 3"):
        StandardDispatchOutput(torch.randn(3, 16), topk)
    with pytest.raises(TypeError, match="hidden_states: expected dtype"):
        StandardDispatchOutput(torch.zeros(4, 16, dtype=torch.int8), topk)
    with pytest.raises(ValueError, match=r"hidden_states: expected a 2-d tensor \[num_tokens, hidden_size\]"):
        StandardDispatchOutput(torch.randn(4), topk)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA graphs")
def test_topk_can_be_built_while_capturing_a_cuda_graph() -> None:
    ids = torch.tensor([[0, 1]] * 4, dtype=torch.int32, device="cuda")
    weights = torch.rand(4, 2, device="cuda")
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        topk = TopKOutput(ids, weights, num_experts=2)
        scaled = topk.topk_weights * 2
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(scaled, weights * 2)
