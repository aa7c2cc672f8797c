"""Tune the Triton MoE kernels' block sizes on this GPU and write ``backends/triton/configs/<device>.json``.

With ``$MOE_CORE_TRITON_CONFIGS`` set, the table goes to ``<device>.json`` in that directory, which the
runners then read instead.

Run from the repository root on a CUDA GPU::

    python benchmarks/tune_triton_moe.py [--shapes mixtral,qwen3,deepseek] [--tokens 1,16,64,256,1024,4096]
        [--formats bf16,fp8,fp8-block,nvfp4,mxfp4] [--out PATH]

For each layer shape, format and token count it sorts one random routing,
times every candidate config of each GEMM alone (``triton.testing.do_bench``,
median), keeps per row block the fastest of each GEMM and writes the row
block with the smallest sum, and times :func:`~moe_core.backends.triton.configs.heuristic`'s pair beside it (what an
untuned shape gets: ``heuristic_ms`` in the entry). FP8 is timed per tensor with static input
scales (the first GEMM writes E4M3); block-scaled FP8 with unit 1x128 group
scales (the first GEMM writes bf16). A candidate that fails to compile or run is
skipped. Entries for other shapes already in the file are kept.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import final

import attrs
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.bench_moe import SHAPES, fp8_block_layer, fp8_layer, mxfp4_layer, quantized, random_weights  # noqa: E402
from moe_core import MoeRunnerConfig, select_experts  # noqa: E402
from moe_core.backends.triton.configs import DECODE_ROWS, KernelConfig, device_file, heuristic, layer_key, widest_block_k  # noqa: E402
from moe_core.backends.triton.quant_info import (  # noqa: E402
    TritonDenseWeights,
    TritonFp8BlockWeights,
    TritonFp8Weights,
    TritonMxfp4W4A16Weights,
    TritonNvfp4W4A16Weights,
)
from moe_core.backends.triton.launch import Epilogue, Gemm, launch  # noqa: E402
from moe_core.backends.triton.plans import (  # noqa: E402
    dense_gemms,
    fp8_block_gemms,
    fp8_gemms,
    mxfp4_w4a16_gemms,
    nvfp4_w4a16_gemms,
)
from moe_core.backends.triton.sorting import SortedTokens  # noqa: E402
from moe_core.fp8 import FP8_BLOCK  # noqa: E402
from moe_core.backends.triton.sorting import sort_tokens  # noqa: E402
from moe_core.backends.triton.kernels import SILU  # noqa: E402

SILU_EPILOGUE = Epilogue(SILU)
"""The tuned layers' activation (gated SiLU): one epilogue variant, the block sizes' cost."""


def candidates(rows_per_expert: float, k: int, fmt: str) -> dict[int, list[KernelConfig]]:
    """Candidate configs by row block, narrowed to the regime (decode, middle, prefill)."""
    stages = [3, 4]
    if rows_per_expert <= DECODE_ROWS / 2:
        # NVFP4 and MXFP4 decode their weights with the ALUs: narrower tiles put more programs on the SMs (H200, T=1: 64 stayed best)
        block_ms, block_ns, block_ks, warps = [16], [32, 64, 128] if fmt in ("nvfp4", "mxfp4") else [64, 128], [128, 256], [4]
    elif rows_per_expert <= DECODE_ROWS:
        block_ms, block_ns, block_ks, warps = [16, 32], [64, 128], [128, 256], [4]
    elif rows_per_expert <= 128 and fmt in ("bf16", "fp16"):
        # weight-bound 16-bit tiles: 8 warps and deeper K tiles too (Mixtral T=256 ran at 60% of the copy rate)
        block_ms, block_ns, block_ks, warps, stages = [16, 64], [64, 128], [64, 128], [4, 8], [4]
    elif rows_per_expert <= 128:
        block_ms, block_ns, block_ks, warps = [16, 64], [64, 128], [128, 256] if fmt == "fp8" else [64, 128], [4]
    elif fmt == "fp8":
        block_ms, block_ns, block_ks, warps = [64, 128], [128, 256], [128], [4, 8]
    elif fmt == "fp8-block":
        block_ms, block_ns, block_ks, warps = [64, 128], [64, 128], [128], [4, 8]
    else:
        block_ms, block_ns, block_ks, warps = [64, 128], [64, 128], [64], [4, 8]
    if fmt == "fp8-block":
        block_ks = [min(block_k, FP8_BLOCK) for block_k in block_ks]  # a tile stays inside its 128 block
    # K off the power-of-two grid (gpt-oss's 2880): the widest tile that divides it
    block_ks = [block_k if k % block_k == 0 else widest_block_k(k, fmt, block_k) for block_k in block_ks]
    out: dict[int, list[KernelConfig]] = {}
    for block_m in block_ms:
        out[block_m] = [
            KernelConfig(block_m, block_n, block_k, 8 if block_m > 16 else 1, warp, stage)
            for block_n, block_k, warp, stage in itertools.product(block_ns, sorted(set(block_ks)), warps, stages)
        ]
    return out


def tune_gemm(run: Callable[[KernelConfig], float], configs: list[KernelConfig]) -> tuple[KernelConfig, float]:
    """The fastest of ``configs`` by ``run``'s time, and that time."""
    best: tuple[KernelConfig, float] | None = None
    for config in configs:
        try:
            ms = run(config)
        except Exception as error:  # a config may not compile or fit on this GPU: skip it
            print(f"    skip {config}: {type(error).__name__}", flush=True)
            continue
        if best is None or ms < best[1]:
            best = (config, ms)
    assert best is not None, "no candidate ran"
    return best


def time_gemm(launch_one: Callable[[KernelConfig, SortedTokens], None], config: KernelConfig, sorted_tokens: SortedTokens) -> float:
    """Median ms of one GEMM launch under ``config`` (``do_bench``, short: a tuning sweep times hundreds)."""
    import triton.testing

    return float(triton.testing.do_bench(lambda: launch_one(config, sorted_tokens), warmup=5, rep=25, return_mode="median"))


GemmFor = Callable[[int, KernelConfig], Gemm]
"""GEMM ``index`` (0: w13, 1: w2) of one quant info under a config."""


def gemm_for(fmt: str, config: MoeRunnerConfig, w13: torch.Tensor, w2: torch.Tensor) -> GemmFor:
    """The layer's bf16 weights ``w13``/``w2`` in format ``fmt``, as the runner's GEMM launches."""
    if fmt == "bf16":
        dense = TritonDenseWeights(w13=w13, w2=w2)
        return lambda index, c: dense_gemms(dense, c, c)[index]
    if fmt == "fp8":
        fp8 = TritonFp8Weights.from_fp8(fp8_layer(config, w13, w2))
        return lambda index, c: fp8_gemms(fp8, c, c)[index]
    if fmt == "fp8-block":
        block = TritonFp8BlockWeights.from_fp8_block(fp8_block_layer(w13, w2))
        return lambda index, c: fp8_block_gemms(block, c, c)[index]
    if fmt == "nvfp4":
        nvfp4 = TritonNvfp4W4A16Weights.from_nvfp4(quantized(w13, w2).without_activation_quantization())
        return lambda index, c: nvfp4_w4a16_gemms(nvfp4, c, c)[index]
    if fmt == "mxfp4":
        mxfp4 = TritonMxfp4W4A16Weights.from_mxfp4(mxfp4_layer(w13, w2))
        return lambda index, c: mxfp4_w4a16_gemms(mxfp4, c, c)[index]
    raise ValueError(f"--formats: unknown {fmt!r}; choose from bf16, fp8, fp8-block, nvfp4, mxfp4")


@final
@attrs.frozen(eq=False)
class GemmCase:
    """One token count's operands for timing each GEMM of one format alone, as the runner would launch it."""

    gemm: GemmFor
    x: torch.Tensor
    inter_in: torch.Tensor
    inter_out: torch.Tensor
    down: torch.Tensor
    weights: torch.Tensor
    topk_ids: torch.Tensor
    x_scales: torch.Tensor | None
    out_scale: torch.Tensor | None
    inter_scales: torch.Tensor | None

    def first(self, c: KernelConfig, sorted_tokens: SortedTokens) -> None:
        """The gated w13 GEMM."""
        top_k = self.topk_ids.shape[1]
        launch(self.x, self.gemm(0, c), self.inter_out, self.weights, sorted_tokens, top_k, True, SILU_EPILOGUE, self.x_scales, self.out_scale)

    def second(self, c: KernelConfig, sorted_tokens: SortedTokens) -> None:
        """The w2 GEMM weighted by the top-k weights."""
        top_k = self.topk_ids.shape[1]
        launch(self.inter_in, self.gemm(1, c), self.down, self.weights, sorted_tokens, top_k, False, SILU_EPILOGUE, self.inter_scales)


def gemm_case(fmt: str, gemm: GemmFor, config: MoeRunnerConfig, tokens: int, gen: torch.Generator, device: str) -> GemmCase:
    """Random inputs for ``tokens`` tokens: FP8 inputs with unit scales (static per tensor, or per 1x128 group)."""
    hidden, inter, pairs = config.hidden_size, config.intermediate_size_per_partition, tokens * config.top_k
    act = torch.float8_e4m3fn if fmt in ("fp8", "fp8-block") else torch.bfloat16
    topk = select_experts(torch.randn(tokens, config.num_experts, generator=gen).to(device), config)
    unit = torch.ones(1, device=device)
    x_scales = out_scale = inter_scales = None
    if fmt == "fp8":
        x_scales = out_scale = inter_scales = unit
    elif fmt == "fp8-block":
        x_scales = torch.ones(tokens, hidden // FP8_BLOCK, device=device)
        inter_scales = torch.ones(pairs, inter // FP8_BLOCK, device=device)
    return GemmCase(
        gemm=gemm,
        x=torch.randn(tokens, hidden, generator=gen).to(device, act),
        inter_in=torch.randn(pairs, inter, generator=gen).to(device, act),
        inter_out=torch.empty(pairs, inter, device=device, dtype=act if fmt == "fp8" else torch.bfloat16),
        down=torch.empty(pairs, hidden, device=device, dtype=torch.bfloat16),
        weights=topk.topk_weights.contiguous(),
        topk_ids=topk.topk_ids,
        x_scales=x_scales,
        out_scale=out_scale,
        inter_scales=inter_scales,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default="mixtral,qwen3,deepseek")
    parser.add_argument("--tokens", default="1,16,64,1024,4096")
    parser.add_argument("--formats", default="bf16,nvfp4")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    out_path = args.out or device_file(torch.cuda.get_device_name())
    table = json.loads(out_path.read_text()) if out_path.exists() else {}
    gen = torch.Generator().manual_seed(0)
    for name in args.shapes.split(","):
        experts, top_k, hidden, inter = SHAPES[name]
        config = MoeRunnerConfig(num_experts=experts, hidden_size=hidden, intermediate_size_per_partition=inter, top_k=top_k)
        w13, w2 = random_weights(name, gen)
        for fmt in args.formats.split(","):
            gemm = gemm_for(fmt, config, w13, w2)
            entries = table.setdefault(layer_key(experts, hidden, inter, top_k, fmt), {})
            for tokens in (int(t) for t in args.tokens.split(",")):
                case = gemm_case(fmt, gemm, config, tokens, gen, "cuda")
                best_total: tuple[float, KernelConfig, KernelConfig] | None = None
                for block_m, configs13 in candidates(tokens * top_k / experts, hidden, fmt).items():
                    sorted_tokens = sort_tokens(case.topk_ids, experts, 0, block_m)
                    configs2 = candidates(tokens * top_k / experts, inter, fmt)[block_m]
                    c13, ms13 = tune_gemm(lambda c: time_gemm(case.first, c, sorted_tokens), configs13)  # noqa: B023
                    c2, ms2 = tune_gemm(lambda c: time_gemm(case.second, c, sorted_tokens), configs2)  # noqa: B023
                    if best_total is None or ms13 + ms2 < best_total[0]:
                        best_total = (ms13 + ms2, c13, c2)
                assert best_total is not None
                total, c13, c2 = best_total
                h13, h2 = heuristic(tokens, top_k, experts, hidden, inter, fmt, False)
                sorted_tokens = sort_tokens(case.topk_ids, experts, 0, h13.block_m)
                guess = time_gemm(case.first, h13, sorted_tokens) + time_gemm(case.second, h2, sorted_tokens)
                entries[str(tokens)] = {"w13": c13.as_dict(), "w2": c2.as_dict(), "ms": round(total, 5), "heuristic_ms": round(guess, 5)}
                print(
                    f"  {name} {fmt} T={tokens}: {total:.4f} ms  w13 {c13}  w2 {c2}; heuristic {guess:.4f} ms "
                    f"(the heuristic at {total / guess:.0%} of the tuned speed)", flush=True,
                )
                out_path.write_text(json.dumps(table, indent=1, sort_keys=True))
    print(f"wrote {out_path}")


if __name__ == "__main__":
    main()
