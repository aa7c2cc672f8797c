"""Is the first GEMM faster gated (gate and up in one tile: two accumulators, N = I) or split (one accumulator over
both halves, N = 2I, bf16 out, then a separate activation pass)? vLLM splits; the Triton runner gates.

Run from the repository root on a CUDA GPU::

    python benchmarks/gemm1_split.py

For each format, layer and token count it times both variants of the first
GEMM over the tuner's candidate tiles (``tune_triton_moe.candidates``, each
GEMM alone, ``do_bench`` median) and keeps each variant's best. Beside them:
the group quantization of the gated output ``[pairs, I]`` (what block-scaled
FP8 runs after the gated GEMM) and a fused SiLU-and-group-quantize of the
split output ``[pairs, 2I]`` (what a split path would run instead), so that
the last column compares whole first halves. Prints one line per row.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
import triton
import triton.language as tl
import triton.testing

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.bench_moe import SHAPES, fp8_block_layer, fp8_layer, random_weights  # noqa: E402
from benchmarks.tune_triton_moe import candidates, gemm_case, gemm_for  # noqa: E402
from moe_core import MoeRunnerConfig  # noqa: E402
from moe_core.backends.triton.configs import KernelConfig  # noqa: E402
from moe_core.backends.triton.kernels import SILU  # noqa: E402
from moe_core.backends.triton.launch import DenseOperand, Epilogue, Fp8BlockOperand, Fp8ChannelOperand, Gemm, launch  # noqa: E402
from moe_core.backends.triton.quant_info import TritonFp8BlockWeights, TritonFp8Weights  # noqa: E402
from moe_core.backends.triton.quantize import quantize_fp8_groups  # noqa: E402
from moe_core.backends.triton.sorting import sort_tokens  # noqa: E402

UNGATED = Epilogue(SILU, relu2=True)
"""The kernel's non-gated first GEMM (rows from tokens, N = 2I); its ReLU^2 epilogue costs what a plain store does."""

ROWS = [
    ("fp8-block", "mixtral", (1024, 4096)), ("fp8-block", "qwen3", (1024, 4096)),
    ("bf16", "mixtral", (256, 1024)), ("bf16", "qwen3", (1024, 4096)),
    ("fp8", "mixtral", (1024, 4096)),
]


@triton.jit
def silu_and_quantize_groups(x_ptr, codes_ptr, scales_ptr, inter, stride_x, stride_c, stride_s, GROUP: tl.constexpr):
    """``silu(gate) * up`` of one row's 128-column group of ``[pairs, 2I]``, as E4M3 codes and the group's scale."""
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * GROUP + tl.arange(0, GROUP)
    gate = tl.load(x_ptr + row * stride_x + cols).to(tl.float32)
    up = tl.load(x_ptr + row * stride_x + inter + cols).to(tl.float32)
    h = (gate / (1.0 + tl.exp(-gate))) * up
    scale = tl.maximum(tl.max(tl.abs(h)) / 448.0, 1e-12)
    tl.store(codes_ptr + row * stride_c + cols, (h / scale).to(tl.float8e4nv))
    tl.store(scales_ptr + row * stride_s + tl.program_id(1), scale)


def silu_and_quantize(wide: torch.Tensor, inter: int) -> None:
    """:func:`silu_and_quantize_groups` over every row and group of ``wide [pairs, 2I]``."""
    rows = wide.shape[0]
    codes = torch.empty(rows, inter, device=wide.device, dtype=torch.float8_e4m3fn)
    scales = torch.empty(rows, inter // 128, device=wide.device, dtype=torch.float32)
    silu_and_quantize_groups[(rows, inter // 128)](
        wide, codes, scales, inter, wide.stride(0), codes.stride(0), scales.stride(0), GROUP=128
    )


def median_ms(fn: Callable[[], object]) -> float:
    return float(triton.testing.do_bench(fn, warmup=5, rep=25, return_mode="median"))


def split_gemm(fmt: str, config: MoeRunnerConfig, w13: torch.Tensor, w2: torch.Tensor) -> Callable[[KernelConfig], Gemm]:
    """The first GEMM over both halves (N = 2I) of the layer in format ``fmt``."""
    inter, hidden = config.intermediate_size_per_partition, config.hidden_size
    if fmt == "fp8-block":
        block = TritonFp8BlockWeights.from_fp8_block(fp8_block_layer(w13, w2))
        return lambda c: Gemm(Fp8BlockOperand(block.w13, block.w13_scales.value), 2 * inter, hidden, c)
    if fmt == "fp8":
        fp8 = TritonFp8Weights.from_fp8(fp8_layer(config, w13, w2))
        return lambda c: Gemm(Fp8ChannelOperand(fp8.w13, fp8.w13_scales.value, True), 2 * inter, hidden, c)
    return lambda c: Gemm(DenseOperand(w13), 2 * inter, hidden, c)


def main() -> None:
    gen = torch.Generator().manual_seed(0)
    weights: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
    start = time.time()
    for fmt, name, token_counts in ROWS:
        experts, top_k, hidden, inter = SHAPES[name]
        config = MoeRunnerConfig(num_experts=experts, hidden_size=hidden, intermediate_size_per_partition=inter, top_k=top_k)
        if name not in weights:
            weights.clear()
            torch.cuda.empty_cache()
            weights[name] = random_weights(name, gen)
        w13, w2 = weights[name]
        gated_gemm, whole = gemm_for(fmt, config, w13, w2), split_gemm(fmt, config, w13, w2)
        for tokens in token_counts:
            case = gemm_case(fmt, gated_gemm, config, tokens, gen, "cuda")
            pairs = tokens * top_k
            wide = torch.empty(pairs, 2 * inter, device="cuda", dtype=torch.bfloat16)
            best: dict[str, tuple[float, KernelConfig | None]] = {"gated": (float("inf"), None), "split": (float("inf"), None)}
            for block_m, configs in candidates(pairs / experts, hidden, fmt).items():
                sorted_tokens = sort_tokens(case.topk_ids, experts, 0, block_m)
                for c in configs:
                    runs: dict[str, Callable[[], object]] = {
                        "gated": lambda: case.first(c, sorted_tokens),  # noqa: B023
                        "split": lambda: launch(case.x, whole(c), wide, case.weights, sorted_tokens, top_k, True, UNGATED, case.x_scales),  # noqa: B023
                    }
                    for variant, run in runs.items():
                        try:
                            ms = median_ms(run)
                        except Exception as error:  # a tile may not fit this GPU's shared memory: skip it
                            print(f"  skip {variant} {c}: {type(error).__name__}", flush=True)
                            continue
                        if ms < best[variant][0]:
                            best[variant] = (ms, c)
            gated_out = torch.randn(pairs, inter, device="cuda", dtype=torch.bfloat16)
            quantize = median_ms(lambda: quantize_fp8_groups(gated_out))  # noqa: B023
            activate = median_ms(lambda: silu_and_quantize(wide, inter))  # noqa: B023
            (gated, gated_tile), (split, split_tile) = best["gated"], best["split"]
            print(
                f"{fmt:9s} {name:8s} T={tokens:5d}: gated {gated:.4f} ms {gated_tile}; split {split:.4f} ms {split_tile}; "
                f"gated/split {gated / split:.2f}x; group quantize [pairs, I] {quantize:.4f} ms, SiLU and group quantize "
                f"[pairs, 2I] {activate:.4f} ms; with them {(gated + quantize) / (split + activate):.2f}x "
                f"({time.time() - start:.0f} s)",
                flush=True,
            )


if __name__ == "__main__":
    main()
