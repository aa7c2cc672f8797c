"""The fused Triton routing kernel against ``select_experts`` on one CUDA GPU: the routing alone, then a whole eager bf16
layer at small token counts, where host time and launches dominate.

Two tables: per routing layer and token count, ms per call (``do_bench`` medians) of each, whether the ids agree and
the largest weight difference; per layer, the forward with the fused routing (what ``MoeLayer`` runs on CUDA) against
the same layer's experts fed ``select_experts``' top-k, in ms, eager microseconds per call, and the outputs' relative
difference.

    python3 benchmarks/bench_routing.py
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch
import triton.testing

from moe_core import GroupedTopK, MoeRunnerConfig, Router, StandardDispatchOutput, dense_layer, select_experts
from moe_core.backends.triton.routing import fused_select_experts
from moe_core.formats import DenseMoeWeights

LAYERS = {
    "deepseek-v3 grouped E256 k8": MoeRunnerConfig(
        256, 7168, 2048, 8, routing_method=GroupedTopK(n_group=8, topk_group=4, renormalize=True)
    ),
    "qwen3 topk_renormalize E128 k8": MoeRunnerConfig(128, 2048, 768, 8),
    "mixtral topk_renormalize E8 k2": MoeRunnerConfig(8, 4096, 14336, 2),
}
"""The routing layers timed; the grouped one takes a correction bias."""


def median_ms(call: Callable[[], object]) -> float:
    """``do_bench``'s median of ``call`` in ms."""
    return float(triton.testing.do_bench(call, warmup=20, rep=200, return_mode="median"))


def eager_us(call: Callable[[], object], calls: int = 200) -> float:
    """Microseconds per call of ``calls`` back-to-back eager calls, synchronized at both ends."""
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        call()
    torch.cuda.synchronize()
    return (time.perf_counter() - start) / calls * 1e6


def routing_table() -> None:
    """The routing alone, at 1, 64 and 4096 tokens of bf16 logits."""
    print("| layer | T | select_experts ms | fused ms | speedup | ids equal | max weight diff |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for name, config in LAYERS.items():
        grouped = isinstance(config.routing_method, GroupedTopK)
        for tokens in (1, 64, 4096):
            logits = torch.randn(tokens, config.num_experts, device="cuda", dtype=torch.bfloat16)
            bias = torch.randn(config.num_experts, device="cuda") * 0.1 if grouped else None
            ref = select_experts(logits, config, score_correction_bias=bias)
            got = fused_select_experts(logits, config, score_correction_bias=bias)
            ref_order, got_order = ref.topk_ids.sort(dim=1), got.topk_ids.sort(dim=1)
            same = bool(torch.equal(ref_order.values, got_order.values))
            diff = float(
                (ref.topk_weights.gather(1, ref_order.indices) - got.topk_weights.gather(1, got_order.indices)).abs().max()
            )
            slow = median_ms(lambda: select_experts(logits, config, score_correction_bias=bias))  # noqa: B023
            fast = median_ms(lambda: fused_select_experts(logits, config, score_correction_bias=bias))  # noqa: B023
            print(f"| {name} | {tokens} | {slow:.4f} | {fast:.4f} | {slow / fast:.2f}x | {same} | {diff:.1e} |", flush=True)


def layer_table() -> None:
    """A whole eager bf16 layer at 1, 16 and 256 tokens (DeepSeek-V3's routing on smaller experts)."""
    print("\n| layer | T | forward, fused routing ms | forward, select_experts ms | ratio | eager us/call fused "
          "| eager us/call select_experts | rel diff |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for name, routed in LAYERS.items():
        config = routed
        if config.num_experts > 128:
            config = MoeRunnerConfig(config.num_experts, 2048, 512, 8, routing_method=config.routing_method)
        grouped = isinstance(config.routing_method, GroupedTopK)
        e, h, i = config.num_experts, config.hidden_size, config.intermediate_size_per_partition
        weights = DenseMoeWeights(
            w13=torch.randn(e, 2 * i, h, device="cuda", dtype=torch.bfloat16) / h**0.5,
            w2=torch.randn(e, h, i, device="cuda", dtype=torch.bfloat16) / i**0.5,
        )
        router = Router(
            weight=torch.randn(e, h, device="cuda", dtype=torch.bfloat16) / h**0.5,
            score_correction_bias=torch.randn(e, device="cuda") * 0.1 if grouped else None,
        )
        layer = dense_layer(config, router, weights, dtype=torch.bfloat16)
        if layer.routing != "routing: fused Triton kernel":
            raise RuntimeError(f"{name}: the layer does not route with the fused kernel ({layer.routing})")

        def plain(x: torch.Tensor, config: MoeRunnerConfig = config, router: Router = router) -> torch.Tensor:
            topk = select_experts(router.logits(x), config, score_correction_bias=router.score_correction_bias)
            return layer.experts(StandardDispatchOutput(x, topk))  # noqa: B023

        for tokens in (1, 16, 256):
            x = torch.randn(tokens, h, device="cuda", dtype=torch.bfloat16)
            reference = plain(x).float()
            diff = float((layer(x).float() - reference).norm() / reference.norm())
            fused_ms, plain_ms = median_ms(lambda: layer(x)), median_ms(lambda: plain(x))  # noqa: B023
            fused_us, plain_us = eager_us(lambda: layer(x)), eager_us(lambda: plain(x))  # noqa: B023
            print(f"| {name} | {tokens} | {fused_ms:.4f} | {plain_ms:.4f} | {plain_ms / fused_ms:.2f}x | {fused_us:.0f} | "
                  f"{plain_us:.0f} | {diff:.1e} |", flush=True)


def main() -> None:
    if not torch.cuda.is_available():
        raise SystemExit("bench_routing.py times CUDA kernels: no CUDA device here")
    print(torch.cuda.get_device_name())
    routing_table()
    layer_table()


if __name__ == "__main__":
    main()
