"""MoE layer benchmark on one CUDA GPU: the Triton backend per format and FlashInfer's CUTLASS MoE against ``torch._grouped_mm``.

Run from the repository root (any CUDA GPU)::

    python benchmarks/bench_moe.py [--shapes mixtral,qwen3,deepseek,gpt-oss-120b,qwen3-235b] [--tokens 1,16,64,256,1024,4096,8192]
        [--backends triton-dense,triton-fp8,triton-fp8-channel,triton-fp8-block,triton-nvfp4-w4a16,
                    triton-nvfp4-w4a16-paths,flashinfer-cutlass-bf16,flashinfer-cutlass-fp8]

The FlashInfer CUTLASS rows run where their backend is available (FlashInfer
installed, SM90 or later), autotuned at each token count before they are
timed. FP8 is W8A8 of the same weights: per tensor with static input scales
calibrated on a separate random batch of 64 tokens (``triton-fp8``,
``flashinfer-cutlass-fp8``), or per channel with dynamic per-token scales
(``triton-fp8-channel``), or per 128x128 block with per-token 1x128 groups
(``triton-fp8-block``). ``triton-nvfp4-w4a16-paths`` times both NVFP4 W4A16 paths at every token count, the
fused kernel and the weights dequantized into a 16-bit workspace (the runner picks one by
``configs.nvfp4_dequantizes``): their crossover. ``triton-fp8`` also runs with
``Fp8Accumulation.TENSOR_CORE`` (the FP8 MMAs never promoted to float32); its error is against the bf16 reference, so it
includes FP8's own quantization error.

It measures the device's copy bandwidth and bf16 and FP8 matmul rates first,
in the same run (FP8 rows' roofline uses the FP8 rate), then prints one table per shape: per backend and token count the
median time (CUDA-graph replay for T <= 64, else ``triton.testing.do_bench``),
TFLOP/s, GB/s of the weight bytes actually read (the experts the routing hit),
the fraction of the roofline ``max(bytes / copy bandwidth, flops / matmul
rate) / time``, the ratio of ``torch._grouped_mm``'s time to this one's, and a verdict against the issue's bar
(:data:`VLLM_H200_MS`, :func:`verdict`).
The reference backend runs at T <= 16 only. ``--host-overhead`` adds the
eager per-call time at T=1 minus the graph-replay time. Results go to stdout
and, with ``--json PATH``, to a file (rewritten after each shape); ``--markdown PATH`` prints such a file
as a Markdown table (``--pivot``: a line per shape and token count, a column per backend, verdicts as +1.12x/-0.87x).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from collections.abc import Callable
from typing import TypeVar
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from moe_core import (  # noqa: E402
    DENSE,
    BoundRunner,
    FP8,
    DenseMoeWeights,
    DeviceSpec,
    DispatchOutput,
    ExpertQuantizeGlobalScales,
    Fp8BlockExpertWeights,
    Fp8BlockMoeWeights,
    Fp8ChannelExpertWeights,
    Fp8ChannelMoeWeights,
    Fp8MoeWeights,
    LayerSpec,
    LinearBlockScales,
    Nvfp4MoeWeights,
    QuantizeGlobalScale,
    MoeForward,
    MoeRunnerConfig,
    StandardDispatchOutput,
    TopKOutput,
    create_runner,
    select_experts,
)
from moe_core.backends._flashinfer import autotuning  # noqa: E402
from moe_core.backends.flashinfer_cutlass import FLASHINFER_CUTLASS_BF16, FLASHINFER_CUTLASS_FP8  # noqa: E402
from moe_core.backends.flashinfer_cutlass.quant_info import CutlassBf16Weights, CutlassFp8Weights  # noqa: E402
from moe_core.backends.reference import REFERENCE_DENSE  # noqa: E402
from moe_core.backends.triton import (  # noqa: E402
    TRITON_DENSE, TRITON_FP8, TRITON_FP8_BLOCK, TRITON_MXFP4_W4A16, TRITON_NVFP4_W4A16,
)
from moe_core.backends.triton.quant_info import (  # noqa: E402
    Fp8Accumulation,
    TritonDenseWeights,
    TritonFp8BlockWeights,
    TritonFp8Weights,
    TritonMxfp4W4A16Weights,
    TritonNvfp4W4A16Weights,
)
from moe_core.backends.triton.plans import DensePlan, Mxfp4W4A16Plan, Nvfp4W4A16Plan, W4A16Path  # noqa: E402
from moe_core.backends.triton.runner import TritonRunner  # noqa: E402
from moe_core.formats.fp8_block.weights import fp8_block_size_refusal  # noqa: E402
from moe_core.formats.mxfp4 import Mxfp4MoeWeights  # noqa: E402
from moe_core.mxfp4 import E8M0Scales, Mxfp4ExpertWeights  # noqa: E402
from moe_core.nvfp4 import Nvfp4ExpertWeights, Nvfp4GateUpWeights  # noqa: E402
from moe_core.synthetic import quantize_fp8_layer  # noqa: E402

SHAPES = {
    "mixtral": (8, 2, 4096, 14336),
    "qwen3": (128, 8, 2048, 768),
    "deepseek": (256, 8, 7168, 2048),
    "gpt-oss-120b": (128, 4, 2880, 2880),
    "qwen3-235b": (128, 8, 4096, 1536),
}
"""name -> (experts, top_k, hidden, intermediate)."""

VLLM_H200_MS: dict[tuple[str, int, str], float] = {
    **{("mixtral", t, "bf16"): ms for t, ms in ((1, 0.193), (16, 0.599), (64, 0.673), (256, 0.748), (1024, 1.658), (4096, 5.57), (8192, 10.33))},
    **{("mixtral", t, "fp8"): ms for t, ms in ((1, 0.130), (16, 0.328), (64, 0.373), (256, 0.427), (1024, 0.903), (4096, 2.99), (8192, 5.69))},
    **{("qwen3", t, "bf16"): ms for t, ms in ((1, 0.041), (16, 0.210), (64, 0.309), (256, 0.344), (1024, 0.406), (4096, 0.832), (8192, 1.537))},
    **{("qwen3", t, "fp8"): ms for t, ms in ((1, 0.041), (16, 0.131), (64, 0.185), (256, 0.210), (1024, 0.272), (4096, 0.595), (8192, 1.059))},
    **{("deepseek", t, "bf16"): ms for t, ms in ((1, 0.201), (64, 4.21), (1024, 5.89))},
    **{("deepseek", t, "fp8"): ms for t, ms in ((1, 0.118), (64, 2.15), (1024, 3.11))},
}
"""The bar: vLLM 0.33.0's fused_moe Triton kernel with its shipped H200 configs, ms per layer call, from the issue
"Faster than vLLM's tuned Triton MoE on every shape" (an H200 run side by side with ddcdf60; bf16, and FP8 with
per-tensor weights and dynamic per-tensor activations). Not re-measured here: vLLM is not installed on the lent GPU."""

NVFP4_DECODE_TARGET_MS = {"mixtral": 0.07, "qwen3": 0.025}
"""The issue's NVFP4 W4A16 decode targets at T=1 (weight streaming at >= 85% of copy bandwidth on the FP4 bytes)."""
NVFP4_PREFILL_SHARE = 0.85
"""The issue's NVFP4 W4A16 prefill target: within 0.85x of vLLM bf16's speed."""


def verdict(entry: dict[str, object]) -> str:
    """One row against its bar: ``ahead 1.12x`` / ``behind 0.87x`` (the bar's time over ours), or ``-`` without one.

    bf16 rows (``triton-dense``, ``flashinfer-cutlass-bf16``) meet vLLM bf16; FP8 rows vLLM FP8; NVFP4 W4A16 rows the
    decode target at T=1 where the issue sets one, else (and MXFP4 W4A16 rows) 0.85x of vLLM bf16's speed.
    """
    backend, shape, tokens, ms = str(entry["backend"]), str(entry["shape"]), int(str(entry["tokens"])), float(str(entry["ms"]))
    if backend.startswith("reference"):
        target = None
    elif "nvfp4" in backend or "mxfp4" in backend:
        target = NVFP4_DECODE_TARGET_MS.get(shape) if tokens == 1 and "nvfp4" in backend else None
        bar = VLLM_H200_MS.get((shape, tokens, "bf16"))
        if target is None and bar is not None:
            target = bar / NVFP4_PREFILL_SHARE
    elif "fp8" in backend:
        target = VLLM_H200_MS.get((shape, tokens, "fp8"))
    elif "dense" in backend or "bf16" in backend:
        target = VLLM_H200_MS.get((shape, tokens, "bf16"))
    else:
        target = None
    if target is None:
        return "-"
    ratio = target / ms
    return f"{'ahead' if ratio >= 1 else 'behind'} {ratio:.2f}x"

Forward = Callable[[], torch.Tensor]


def median_ms(fn: Forward, graph: bool) -> float:
    """Median time of ``fn``: CUDA-graph replays (decode sizes) or do_bench."""
    import triton.testing

    if not graph:
        return float(triton.testing.do_bench(fn, warmup=25, rep=200, return_mode="median"))
    fn()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    for _ in range(5):
        g.replay()
    times: list[float] = []
    for _ in range(30):
        start = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]  # torch leaves Event.__init__ unannotated
        end = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]  # as above
        start.record()
        for _ in range(10):
            g.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 10)
    return statistics.median(times)


Ceilings = tuple[float, float, float]
"""Copy GB/s, bf16 matmul TFLOP/s, FP8 matmul TFLOP/s."""


def device_ceilings() -> Ceilings:
    """Copy bandwidth (bytes read + written, GB/s) and 8192^3 bf16 and FP8 (``torch._scaled_mm``) matmul rates, measured now."""
    src = torch.randn(2**30, device="cuda", dtype=torch.float32)  # 4 GiB
    dst = torch.empty_like(src)
    copy = median_ms(lambda: dst.copy_(src), graph=False)
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    mm = median_ms(lambda: a @ b, graph=False)
    a8, b8 = a.to(torch.float8_e4m3fn), b.to(torch.float8_e4m3fn)
    one = torch.ones((), device="cuda")
    mm8 = median_ms(lambda: torch._scaled_mm(a8, b8.t(), scale_a=one, scale_b=one, out_dtype=torch.bfloat16), graph=False)
    del src, dst
    return 2 * 4 * 2**30 / copy / 1e6, 2 * 8192**3 / mm / 1e9, 2 * 8192**3 / mm8 / 1e9


def grouped_mm_moe(x: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor) -> torch.Tensor:
    """Sort, grouped mm, SiLU-and-mul, grouped mm, weighted combine: the plain-PyTorch MoE."""
    tokens, top_k = ids.shape
    experts = w13.shape[0]
    flat = ids.reshape(-1)
    order = torch.argsort(flat, stable=True)
    counts = torch.zeros(experts, dtype=torch.int64, device=x.device).index_add_(0, flat.long(), torch.ones_like(flat, dtype=torch.int64))
    offs = torch.cumsum(counts, 0).to(torch.int32)
    xs = x[order // top_k]
    h = torch._grouped_mm(xs, w13.transpose(-2, -1), offs=offs)
    gate, up = h.chunk(2, dim=-1)
    y = torch._grouped_mm(F.silu(gate) * up, w2.transpose(-2, -1), offs=offs)
    y = y * weights.reshape(-1)[order, None].to(y.dtype)
    out = torch.zeros(tokens * top_k, x.shape[1], dtype=y.dtype, device=x.device)
    out[order] = y
    return out.reshape(tokens, top_k, -1).sum(1)


def random_weights(name: str, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """bf16 ``w13 [E, 2I, H]`` and ``w2 [E, H, I]`` of shape ``name`` on the GPU, N(0, 1/fan_in)."""
    experts, _, hidden, inter = SHAPES[name]
    w13 = (torch.randn(experts, 2 * inter, hidden, generator=gen) / math.sqrt(hidden)).to("cuda", torch.bfloat16)
    w2 = (torch.randn(experts, hidden, inter, generator=gen) / math.sqrt(inter)).to("cuda", torch.bfloat16)
    return w13, w2


def _in_chunks(w: torch.Tensor, chunk: int = 16) -> Nvfp4ExpertWeights:
    """``Nvfp4ExpertWeights.quantize`` a few experts at a time (its float32 temporaries are 8x the bf16 weights)."""
    parts = [Nvfp4ExpertWeights.quantize(w[i : i + chunk]) for i in range(0, w.shape[0], chunk)]
    return Nvfp4ExpertWeights(
        torch.cat([p.packed for p in parts]),
        LinearBlockScales.from_checkpoint(torch.cat([p.block_scales.data for p in parts])),
        ExpertQuantizeGlobalScales.from_checkpoint(torch.cat([p.global_scales.value for p in parts])),
    )


Fp8Stack = TypeVar("Fp8Stack", Fp8ChannelExpertWeights, Fp8BlockExpertWeights)


def _fp8_in_chunks(kind: type[Fp8Stack], w: torch.Tensor, chunk: int = 16) -> Fp8Stack:
    """``kind.quantize(w)`` a few experts at a time (the quantizer's float32 temporaries are 2x the bf16 weights)."""
    parts = [kind.quantize(w[i : i + chunk]) for i in range(0, w.shape[0], chunk)]
    scales = type(parts[0].scales).from_checkpoint(torch.cat([p.scales.value for p in parts]))
    return kind(torch.cat([p.codes for p in parts]), scales)


def fp8_channel_layer(w13: torch.Tensor, w2: torch.Tensor) -> Fp8ChannelMoeWeights:
    """The layer in FP8 per channel."""
    return Fp8ChannelMoeWeights(w13=_fp8_in_chunks(Fp8ChannelExpertWeights, w13), w2=_fp8_in_chunks(Fp8ChannelExpertWeights, w2))


def fp8_block_layer(w13: torch.Tensor, w2: torch.Tensor) -> Fp8BlockMoeWeights:
    """The layer in FP8 per 128x128 block."""
    return Fp8BlockMoeWeights(w13=_fp8_in_chunks(Fp8BlockExpertWeights, w13), w2=_fp8_in_chunks(Fp8BlockExpertWeights, w2))


def _mxfp4_in_chunks(w: torch.Tensor, chunk: int = 16) -> Mxfp4ExpertWeights:
    """``Mxfp4ExpertWeights.quantize`` a few experts at a time (its float32 temporaries are 8x the bf16 weights)."""
    parts = [Mxfp4ExpertWeights.quantize(w[i : i + chunk]) for i in range(0, w.shape[0], chunk)]
    codes = E8M0Scales.from_checkpoint(torch.cat([p.scales.codes for p in parts]))
    return Mxfp4ExpertWeights(torch.cat([p.packed for p in parts]), codes)


def mxfp4_layer(w13: torch.Tensor, w2: torch.Tensor) -> Mxfp4MoeWeights:
    """The layer in MXFP4 (no biases: the same SiLU-gated layer as every other row)."""
    return Mxfp4MoeWeights(w13=_mxfp4_in_chunks(w13), w2=_mxfp4_in_chunks(w2))


def quantized(w13: torch.Tensor, w2: torch.Tensor) -> Nvfp4MoeWeights:
    """The layer in NVFP4, gate and up with their own scales; the input scales are unused by W4A16."""
    inter = w2.shape[2]
    unused = QuantizeGlobalScale.from_amax(1.0).to(w13.device)
    return Nvfp4MoeWeights(
        w13=Nvfp4GateUpWeights(gate=_in_chunks(w13[:, :inter]), up=_in_chunks(w13[:, inter:])),
        w2=_in_chunks(w2), w13_input_scale=unused, w2_input_scale=unused,
    )


def fp8_layer(config: MoeRunnerConfig, w13: torch.Tensor, w2: torch.Tensor) -> Fp8MoeWeights:
    """The layer in FP8 per tensor, input scales calibrated on a random batch of 64 tokens."""
    calibration = torch.randn(64, w13.shape[2], device=w13.device, dtype=w13.dtype)
    topk = select_experts(torch.randn(64, config.num_experts, device=w13.device), config)
    dispatch = StandardDispatchOutput(calibration, topk)
    return quantize_fp8_layer(config, DenseMoeWeights(w13=w13, w2=w2), dispatch)


def row(
    name: str, ms: float, flops: float, weight_bytes: float, ceilings: Ceilings, base: float | None, fp8: bool = False
) -> dict[str, object]:
    bw, rate = ceilings[0], ceilings[2] if fp8 else ceilings[1]
    floor = max(weight_bytes / bw / 1e6, flops / rate / 1e9)
    return {
        "backend": name, "ms": ms, "tflops": flops / ms / 1e9, "gbs": weight_bytes / ms / 1e6,
        "roofline": floor / ms, "vs_grouped_mm": None if base is None else base / ms,
    }


BACKENDS = (
    "triton-dense", "triton-fp8", "triton-fp8-channel", "triton-fp8-block", "triton-nvfp4-w4a16", "triton-nvfp4-w4a16-paths",
    "triton-mxfp4-w4a16", "triton-mxfp4-w4a16-paths", "flashinfer-cutlass-bf16", "flashinfer-cutlass-fp8",
)
"""What ``--backends`` chooses from; ``torch._grouped_mm`` always runs (it is the baseline)."""


Bench = tuple[MoeForward, float, bool, bool]
"""A bound runner, bytes per weight, whether to autotune first, whether its roofline uses the FP8 rate."""


def runners_for(config: MoeRunnerConfig, w13: torch.Tensor, w2: torch.Tensor, backends: list[str]) -> dict[str, Bench]:
    """label -> what to time, for each chosen backend that runs here."""
    runners: dict[str, Bench] = {}
    if "triton-dense" in backends:
        runners["triton bf16"] = (TRITON_DENSE.bind(config, TritonDenseWeights(w13=w13, w2=w2)), 2.0, False, False)
    if "triton-fp8" in backends:
        fp8_weights = TritonFp8Weights.from_fp8(fp8_layer(config, w13, w2))
        runners["triton fp8 static"] = (TRITON_FP8.bind(config, fp8_weights), 1.0, False, True)
        fast = fp8_weights.with_accumulation(Fp8Accumulation.TENSOR_CORE)
        runners["triton fp8 static, tensor-core acc"] = (TRITON_FP8.bind(config, fast), 1.0, False, True)
    if "triton-fp8-channel" in backends:
        channel = TritonFp8Weights.from_fp8_channel(fp8_channel_layer(w13, w2))
        runners["triton fp8 channel dynamic"] = (TRITON_FP8.bind(config, channel), 1.0, False, True)
    if "triton-fp8-block" in backends:
        refusal = fp8_block_size_refusal(config.hidden_size, config.intermediate_size_per_partition)
        if refusal is None:
            block = TritonFp8BlockWeights.from_fp8_block(fp8_block_layer(w13, w2))
            runners["triton fp8 block"] = (TRITON_FP8_BLOCK.bind(config, block), 1.0 + 1 / 128**2 * 4, False, True)
        else:
            print(f"  triton-fp8-block skipped: {refusal}", flush=True)
    if "triton-nvfp4-w4a16" in backends or "triton-nvfp4-w4a16-paths" in backends:
        nvfp4 = TritonNvfp4W4A16Weights.from_nvfp4(quantized(w13, w2).without_activation_quantization())
        if "triton-nvfp4-w4a16" in backends:
            runners["triton nvfp4 w4a16"] = (TRITON_NVFP4_W4A16.bind(config, nvfp4), 0.5 + 1 / 16, False, False)
        if "triton-nvfp4-w4a16-paths" in backends:
            for label, path in (("fused", W4A16Path.FUSED), ("dequantized", W4A16Path.WORKSPACE)):
                forced = BoundRunner(TritonRunner(config, Nvfp4W4A16Plan(path)), nvfp4)
                runners[f"triton nvfp4 w4a16 {label}"] = (forced, 0.5 + 1 / 16, False, False)
    if "triton-mxfp4-w4a16" in backends or "triton-mxfp4-w4a16-paths" in backends:
        mxfp4 = TritonMxfp4W4A16Weights.from_mxfp4(mxfp4_layer(w13, w2))
        if "triton-mxfp4-w4a16" in backends:
            runners["triton mxfp4 w4a16"] = (TRITON_MXFP4_W4A16.bind(config, mxfp4), 0.5 + 1 / 32, False, False)
        if "triton-mxfp4-w4a16-paths" in backends:
            for label, path in (("fused", W4A16Path.FUSED), ("dequantized", W4A16Path.WORKSPACE)):
                forced_mxfp4 = BoundRunner(TritonRunner(config, Mxfp4W4A16Plan(path)), mxfp4)
                runners[f"triton mxfp4 w4a16 {label}"] = (forced_mxfp4, 0.5 + 1 / 32, False, False)
    if "flashinfer-cutlass-bf16" in backends:
        verdict = FLASHINFER_CUTLASS_BF16.supports(DeviceSpec.of(w13.device), LayerSpec(config, DENSE))
        if verdict.ok:
            cutlass = CutlassBf16Weights.from_dense(DenseMoeWeights(w13=w13, w2=w2))
            runners["flashinfer cutlass bf16"] = (FLASHINFER_CUTLASS_BF16.bind(config, cutlass), 2.0, True, False)
        else:
            print(f"  flashinfer-cutlass-bf16 skipped: {'; '.join(verdict.reasons)}", flush=True)
    if "flashinfer-cutlass-fp8" in backends:
        verdict = FLASHINFER_CUTLASS_FP8.supports(DeviceSpec.of(w13.device), LayerSpec(config, FP8))
        if verdict.ok:
            fp8 = CutlassFp8Weights.from_fp8(fp8_layer(config, w13, w2))
            runners["flashinfer cutlass fp8"] = (FLASHINFER_CUTLASS_FP8.bind(config, fp8), 1.0, True, True)
        else:
            print(f"  flashinfer-cutlass-fp8 skipped: {'; '.join(verdict.reasons)}", flush=True)
    return runners


def bench_shape(
    name: str, token_counts: list[int], ceilings: Ceilings, gen: torch.Generator, backends: list[str]
) -> list[dict[str, object]]:
    experts, top_k, hidden, inter = SHAPES[name]
    config = MoeRunnerConfig(num_experts=experts, hidden_size=hidden, intermediate_size_per_partition=inter, top_k=top_k)
    w13, w2 = random_weights(name, gen)
    runners = runners_for(config, w13, w2, backends)
    reference_weights = DenseMoeWeights(w13=w13, w2=w2) if min(token_counts) <= 16 else None  # checked once, not timed
    rows = []
    for tokens in token_counts:
        x = torch.randn(tokens, hidden, generator=gen).to("cuda", torch.bfloat16)
        topk = select_experts(torch.randn(tokens, experts, generator=gen).to("cuda"), config)
        fast = TopKOutput(topk.topk_ids, topk.topk_weights, num_experts=experts, check_values=False)
        dispatch = StandardDispatchOutput(x, fast)
        hit = int(torch.unique(topk.topk_ids).numel())
        flops = 6.0 * tokens * top_k * hidden * inter
        graph = tokens <= 64
        base = median_ms(lambda: grouped_mm_moe(x, topk.topk_ids, topk.topk_weights, w13, w2), graph)
        table = [row("torch._grouped_mm", base, flops, hit * 3 * hidden * inter * 2.0, ceilings, base)]
        outputs = {}
        for label, (forward, bytes_per_weight, tune, fp8) in runners.items():
            if tune:
                with autotuning():
                    forward(dispatch)
            outputs[label] = forward(dispatch)
            try:
                ms = median_ms(lambda: forward(dispatch), graph)  # noqa: B023
            except RuntimeError as error:  # a kernel that cannot be captured is timed eagerly, and labelled so
                print(f"  {label} T={tokens}: no CUDA graph ({str(error).splitlines()[0][:120]}); timed eagerly", flush=True)
                ms, label = median_ms(lambda: forward(dispatch), False), f"{label} (eager)"  # noqa: B023
            table.append(row(label, ms, flops, hit * 3 * hidden * inter * bytes_per_weight, ceilings, base, fp8))
        if tokens <= 16 and reference_weights is not None:
            reference = create_runner(REFERENCE_DENSE, config)
            start = time.perf_counter()
            reference_out = reference.run(dispatch, reference_weights)
            torch.cuda.synchronize()
            ref_ms = (time.perf_counter() - start) * 1e3
            table.append(row("reference-dense", ref_ms, flops, hit * 3 * hidden * inter * 2.0, ceilings, base))
            for entry in table:
                out = outputs.get(str(entry["backend"]).removesuffix(" (eager)"))
                if out is not None and "fp4" not in str(entry["backend"]):
                    entry["rel_err_vs_reference"] = float((out.double() - reference_out.double()).norm() / reference_out.double().norm())
        for entry in table:
            entry.update(shape=name, tokens=tokens, experts_hit=hit)
        rows += table
        print(f"  {name} T={tokens}: " + ", ".join(f"{r['backend']} {r['ms']:.3f} ms" for r in table), flush=True)
    return rows


def issue_us(fn: Forward, calls: int = 100) -> float:
    """Host time per call to issue ``fn`` back to back (the GPU catches up afterwards), in us."""
    fn()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    issued = time.perf_counter() - start
    torch.cuda.synchronize()
    return issued / calls * 1e6


def host_overhead(gen: torch.Generator) -> dict[str, float]:
    """Eager wall time of one T=1 call minus its graph-replay time (Mixtral shape, bf16), and what the host spends,
    side by side: the runner (its memo launches the kept binaries directly) and the same launches bound by Triton.

    ``issue_us``: host time per ``runner.run`` issued back to back (``_through_triton``: the same forward with every
    launch bound by Triton); ``sort_issue_us``: the token sort's share; ``launch_issue_us``: one Triton launch (the
    combine kernel) bound by Triton.
    """
    from moe_core.backends.triton.kernels import combine_kernel
    from moe_core.backends.triton.launch import fused_moe
    from moe_core.backends.triton.sorting import sort_tokens

    experts, top_k, hidden, inter = SHAPES["mixtral"]
    config = MoeRunnerConfig(num_experts=experts, hidden_size=hidden, intermediate_size_per_partition=inter, top_k=top_k)
    w13, w2 = random_weights("mixtral", gen)
    dense, runner = TritonDenseWeights(w13=w13, w2=w2), create_runner(TRITON_DENSE, config)
    x = torch.randn(1, hidden, device="cuda", dtype=torch.bfloat16)
    topk = select_experts(torch.randn(1, experts, device="cuda"), config)
    dispatch = StandardDispatchOutput(x, TopKOutput(topk.topk_ids, topk.topk_weights, num_experts=experts, check_values=False))
    launches = DensePlan().launches(config, dispatch, dense)

    def through_triton() -> torch.Tensor:
        return fused_moe(config, dispatch, launches.w13, launches.w2, launches.inputs)

    def eager_ms(fn: Forward) -> float:
        times = []
        for _ in range(200):
            torch.cuda.synchronize()
            start = time.perf_counter()
            fn()
            torch.cuda.synchronize()
            times.append((time.perf_counter() - start) * 1e3)
        return statistics.median(times)

    replay = median_ms(lambda: runner.run(dispatch, dense), graph=True)
    median, median_triton = eager_ms(lambda: runner.run(dispatch, dense)), eager_ms(through_triton)
    down = torch.empty((top_k, hidden), device="cuda", dtype=torch.bfloat16)
    out = torch.empty_like(x)

    def one_launch() -> torch.Tensor:
        combine_kernel[(1, 4)](down, topk.topk_ids, out, hidden, top_k, 0, experts, 1.0, down.stride(0), out.stride(0), BLOCK_H=1024)
        return out

    return {
        "eager_ms": median, "graph_ms": replay, "host_us": (median - replay) * 1e3,
        "eager_ms_through_triton": median_triton, "host_us_through_triton": (median_triton - replay) * 1e3,
        "issue_us": issue_us(lambda: runner.run(dispatch, dense)),
        "issue_us_through_triton": issue_us(through_triton),
        "sort_issue_us": issue_us(lambda: sort_tokens(topk.topk_ids, experts, 0, 16).sorted_ids),
        "launch_issue_us": issue_us(one_launch),
    }


def print_table(rows: list[dict[str, object]], markdown: bool = False) -> None:
    """The rows as an aligned text table, or as a Markdown table (for ``benchmarks/RESULTS.md``)."""
    headers = ["shape", "T", "backend", "ms", "TFLOP/s", "GB/s", "roofline", "vs grouped_mm", "err vs reference", "verdict"]
    lines = [headers]
    for r in rows:
        ratio = r["vs_grouped_mm"]
        lines.append([
            str(r["shape"]), str(r["tokens"]), str(r["backend"]), f"{r['ms']:.4f}", f"{r['tflops']:.1f}",
            f"{r['gbs']:.0f}", f"{r['roofline']:.0%}", "-" if ratio is None else f"{ratio:.2f}x",
            f"{r['rel_err_vs_reference']:.1e}" if "rel_err_vs_reference" in r else "-",
            verdict(r),
        ])
    if markdown:
        lines.insert(1, ["---"] * len(headers))
        for line in lines:
            print("| " + " | ".join(line) + " |")
        return
    widths = [max(len(line[i]) for line in lines) for i in range(len(headers))]
    for index, line in enumerate(lines):
        print("  ".join(cell.ljust(width) for cell, width in zip(line, widths)).rstrip())
        if index == 0:
            print("  ".join("-" * width for width in widths))


def print_pivot(rows: list[dict[str, object]]) -> None:
    """The rows as one Markdown line per shape and token count, one column per backend: ms, then the verdict against
    the bar where there is one (the side-by-side view of a run, for ``benchmarks/RESULTS.md``)."""
    backends = list(dict.fromkeys(str(r["backend"]) for r in rows if r["backend"] != "reference-dense"))
    cells: dict[tuple[str, int], dict[str, str]] = {}
    for r in rows:
        judged = verdict(r)
        cell = f"{float(str(r['ms'])):.3f}" + ("" if judged == "-" else f" ({judged.replace('ahead ', '+').replace('behind ', '-')})")
        cells.setdefault((str(r["shape"]), int(str(r["tokens"]))), {})[str(r["backend"])] = cell
    print("| shape | T | " + " | ".join(backends) + " |")
    print("| --- | --- | " + " | ".join("---" for _ in backends) + " |")
    for (shape, tokens), line in cells.items():
        print(f"| {shape} | {tokens} | " + " | ".join(line.get(b, "-") for b in backends) + " |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default="mixtral,qwen3,deepseek")
    parser.add_argument("--tokens", default="1,16,64,256,1024,4096,8192")
    parser.add_argument("--backends", default=",".join(BACKENDS), help=f"comma-separated, from {', '.join(BACKENDS)}")
    parser.add_argument("--host-overhead", action="store_true")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--markdown", type=Path, metavar="JSON", help="print a saved --json result as Markdown, run nothing")
    parser.add_argument("--pivot", action="store_true", help="with --markdown: one line per shape and T, a column per backend")
    args = parser.parse_args()
    if args.markdown:
        saved = json.loads(args.markdown.read_text())
        if args.pivot:
            print_pivot(saved["rows"])
        else:
            print_table(saved["rows"], markdown=True)
        return
    backends = args.backends.split(",")
    unknown = sorted(set(backends) - set(BACKENDS))
    if unknown:
        parser.error(f"--backends: unknown {', '.join(unknown)}; choose from {', '.join(BACKENDS)}")
    gen = torch.Generator().manual_seed(0)
    ceilings = device_ceilings()
    print(
        f"{torch.cuda.get_device_name()}: copy {ceilings[0]:.0f} GB/s, bf16 matmul {ceilings[1]:.0f} TFLOP/s, "
        f"FP8 matmul {ceilings[2]:.0f} TFLOP/s", flush=True,
    )
    rows: list[dict[str, object]] = []
    result: dict[str, object] = {
        "device": torch.cuda.get_device_name(), "copy_gbs": ceilings[0], "matmul_tflops": ceilings[1],
        "fp8_matmul_tflops": ceilings[2], "rows": rows,
    }
    for name in args.shapes.split(","):
        rows += bench_shape(name, [int(t) for t in args.tokens.split(",")], ceilings, gen, backends)
        torch.cuda.empty_cache()
        if args.json:  # each finished shape kept, should a later one not finish
            args.json.write_text(json.dumps(result, indent=1))
    if args.host_overhead:
        result["host_overhead"] = host_overhead(gen)
        print(f"host overhead at T=1 (eager minus graph replay): {result['host_overhead']}")
    print_table(rows)
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
