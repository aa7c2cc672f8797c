"""Top-k routing from router logits, in plain PyTorch, per :class:`RoutingMethod`."""

from __future__ import annotations

import torch

from moe_core._checks import FLOAT_DTYPES, require_dtype, require_ndim, require_tensor
from moe_core.config import MoeRunnerConfig, RoutingMethod
from moe_core.dispatch import TopKOutput


def select_experts(router_logits: torch.Tensor, config: MoeRunnerConfig) -> TopKOutput:
    """The top-k ids and weights of ``router_logits [T, num_experts]`` under the config's method."""
    require_tensor("router_logits", router_logits)
    require_dtype("router_logits", router_logits, FLOAT_DTYPES)
    require_ndim("router_logits", router_logits, 2, "[num_tokens, num_experts]")
    if router_logits.shape[1] != config.num_experts:
        raise ValueError(
            f"router_logits: expected {config.num_experts} columns (num_experts), got {router_logits.shape[1]}"
        )
    logits = router_logits.float()
    if config.routing_method is RoutingMethod.SOFTMAX_TOPK:
        weights, ids = torch.softmax(logits, dim=-1).topk(config.top_k, dim=-1)
    else:
        top_logits, ids = logits.topk(config.top_k, dim=-1)
        weights = torch.softmax(top_logits, dim=-1)
    return TopKOutput(ids.to(torch.int32), weights, router_logits, num_experts=config.num_experts)
