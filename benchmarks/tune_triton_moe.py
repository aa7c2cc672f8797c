"""Tune the Triton MoE kernels' block sizes on this GPU and write ``backends/triton/configs/<device>.json``.

Run from the repository root on a CUDA GPU::

    python benchmarks/tune_triton_moe.py [--shapes mixtral,qwen3,deepseek] [--tokens 1,16,64,256,1024,4096]
        [--formats bf16,fp8,nvfp4] [--out PATH]

For each layer shape, format and token count it sorts one random routing,
times every candidate config of each GEMM alone (``triton.testing.do_bench``,
median), keeps per row block the fastest of each GEMM and writes the row
block with the smallest sum. FP8 is timed per tensor with static input
scales (the first GEMM writes E4M3). A candidate that fails to compile or run is
skipped. Entries for other shapes already in the file are kept.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.bench_moe import SHAPES, fp8_layer, quantized, random_weights  # noqa: E402
from moe_core import MoeRunnerConfig, select_experts  # noqa: E402
from moe_core.backends.triton.configs import KernelConfig, device_file, layer_key  # noqa: E402
from moe_core.backends.triton.quant_info import TritonDenseWeights, TritonFp8Weights, TritonNvfp4W4A16Weights  # noqa: E402
from moe_core.backends.triton.runner import Gemm, dense_gemms, fp8_gemms, launch, nvfp4_w4a16_gemms  # noqa: E402
from moe_core.backends.triton.sorting import sort_tokens  # noqa: E402


def candidates(rows_per_expert: float, k: int, fmt: str) -> dict[int, list[KernelConfig]]:
    """Candidate configs by row block, narrowed to the regime (decode, middle, prefill)."""
    if rows_per_expert <= 16:
        block_ms, block_ns, block_ks, warps = [16], [64, 128], [128, 256], [4]
    elif rows_per_expert <= 128:
        block_ms, block_ns, block_ks, warps = [16, 64], [64, 128], [128, 256] if fmt == "fp8" else [64, 128], [4]
    elif fmt == "fp8":
        block_ms, block_ns, block_ks, warps = [64, 128], [128, 256], [128], [4, 8]
    else:
        block_ms, block_ns, block_ks, warps = [64, 128], [128], [64], [4, 8]
    out: dict[int, list[KernelConfig]] = {}
    for block_m in block_ms:
        out[block_m] = [
            KernelConfig(block_m, block_n, block_k, 8 if block_m > 16 else 1, warp, stage)
            for block_n, block_k, warp, stage in itertools.product(block_ns, block_ks, warps, [3, 4])
            if k % block_k == 0
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


def main() -> None:
    import triton.testing

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
            quant_info: TritonDenseWeights | TritonFp8Weights | TritonNvfp4W4A16Weights
            if fmt == "bf16":
                quant_info = TritonDenseWeights(w13=w13, w2=w2)
            elif fmt == "fp8":
                quant_info = TritonFp8Weights.from_fp8(fp8_layer(config, w13, w2))
            else:
                quant_info = TritonNvfp4W4A16Weights.from_nvfp4(quantized(w13, w2))
            unit = torch.ones(1, device="cuda") if fmt == "fp8" else None  # one static FP8 scale for both inputs
            act_dtype = torch.float8_e4m3fn if fmt == "fp8" else torch.bfloat16

            def gemm(index: int, c: KernelConfig) -> Gemm:
                if isinstance(quant_info, TritonDenseWeights):
                    return dense_gemms(quant_info, c, c)[index]
                if isinstance(quant_info, TritonFp8Weights):
                    return fp8_gemms(quant_info, c, c)[index]
                return nvfp4_w4a16_gemms(quant_info, c, c)[index]

            entries = table.setdefault(layer_key(experts, hidden, inter, top_k, fmt), {})
            for tokens in (int(t) for t in args.tokens.split(",")):
                x = torch.randn(tokens, hidden, generator=gen).to("cuda", act_dtype)
                topk = select_experts(torch.randn(tokens, experts, generator=gen).to("cuda"), config)
                weights = topk.topk_weights.contiguous()
                inter_out = torch.randn(tokens * top_k, inter, device="cuda").to(act_dtype)
                down = torch.empty(tokens * top_k, hidden, device="cuda", dtype=torch.bfloat16)
                best_total: tuple[float, KernelConfig, KernelConfig] | None = None
                for block_m, configs13 in candidates(tokens * top_k / experts, hidden, fmt).items():
                    sorted_tokens = sort_tokens(topk.topk_ids, experts, 0, block_m)
                    configs2 = candidates(tokens * top_k / experts, inter, fmt)[block_m]

                    def time13(c: KernelConfig) -> float:
                        fn = lambda: launch(x, gemm(0, c), inter_out, weights, sorted_tokens, top_k, True, 0, unit, unit)  # noqa: E731
                        return float(triton.testing.do_bench(fn, warmup=5, rep=25, return_mode="median"))

                    def time2(c: KernelConfig) -> float:
                        fn = lambda: launch(inter_out, gemm(1, c), down, weights, sorted_tokens, top_k, False, 0, unit)  # noqa: E731
                        return float(triton.testing.do_bench(fn, warmup=5, rep=25, return_mode="median"))

                    c13, ms13 = tune_gemm(time13, configs13)
                    c2, ms2 = tune_gemm(time2, configs2)
                    if best_total is None or ms13 + ms2 < best_total[0]:
                        best_total = (ms13 + ms2, c13, c2)
                assert best_total is not None
                total, c13, c2 = best_total
                entries[str(tokens)] = {"w13": c13.as_dict(), "w2": c2.as_dict(), "ms": round(total, 5)}
                print(f"  {name} {fmt} T={tokens}: {total:.4f} ms  w13 {c13}  w2 {c2}", flush=True)
                out_path.write_text(json.dumps(table, indent=1, sort_keys=True))
    print(f"wrote {out_path}")


if __name__ == "__main__":
    main()
