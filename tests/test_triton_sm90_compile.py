"""Every kernel variant the Triton backend launches, compiled for sm90 (Hopper) here, without a GPU, and never launched.

Triton's CPU interpreter (what ``tests/test_triton.py`` runs on a machine
without CUDA) is numpy: it takes code that the GPU compiler refuses (a
constexpr branch that does not type, inline PTX, a layout that does not
lower), so the kernels are also compiled ahead of time for sm90 with the
bundled ``ptxas``. The variants are the runners' own: in a subprocess
without ``TRITON_INTERPRET`` (under the interpreter ``@triton.jit`` makes
interpreted functions, which do not compile), each runner's forward runs on
meta tensors with every kernel replaced by a recorder, and each distinct
launch (its argument types, the integer specializations Triton's launcher
makes, its constexprs, warps and stages) is compiled once. Block sizes are
the ones the runners pick on an H200 (the tuned tables, the heuristic for
untuned shapes), for decode (T=1) and prefill (T=4096, where NVFP4 and
MXFP4 W4A16 dequantize into a workspace and the sort takes three launches),
and a table's K tiles that leave a tail (MXFP4: the heuristic's always divide).

Each compiled kernel must also fit the shared memory an sm90 block may use,
which Triton checks only at launch. Registers and spills are not judged:
they cost speed, not correctness.

The driver is this module run from the repository root: ``python -m
tests.test_triton_sm90_compile`` prints one JSON line per variant (add
``--list`` to record without compiling). 97 variants compile in about 60 s
on two cores with Triton's cache cold (most of that is ``ptxas``); a warm
cache (``~/.triton/cache``) makes a rerun a few seconds.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any, cast

import attrs
import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent
"""The repository root: the driver runs as ``python -m tests.test_triton_sm90_compile`` from it (the same
``moe_core`` as the tests import)."""

SM90_MAX_SHARED = 232448
"""Bytes of shared memory one block may use on sm90 (227 KiB: ``cudaDevAttrMaxSharedMemoryPerBlockOptin``)."""

META = torch.device("meta")

POINTER_TYPES = {
    torch.bfloat16: "*bf16", torch.float16: "*fp16", torch.float32: "*fp32", torch.float8_e4m3fn: "*fp8e4nv",
    torch.uint8: "*u8", torch.int32: "*i32", torch.int64: "*i64",
}
"""Triton's signature type of a tensor argument, by dtype."""


class Launch:
    """One recorded kernel launch: the kernel, its arguments by name, and its launch options."""

    def __init__(self, kernel: Any, args: tuple[object, ...], kwargs: dict[str, object]) -> None:
        names = list(kernel.arg_names)
        values = dict(zip(names, args))
        values.update({name: value for name, value in kwargs.items() if name in names})
        missing = [name for name in names if name not in values]
        if missing:
            raise TypeError(f"{kernel.__name__}: launched without {missing}")
        self.kernel = kernel
        self.options = {name: int(cast(int, kwargs[name])) for name in ("num_warps", "num_stages") if name in kwargs}
        self.signature: dict[str, str] = {}
        self.constexprs: dict[str, object] = {}
        self.attrs: dict[tuple[int, ...], list[list[object]]] = {}
        for index, name in enumerate(names):
            value = values[name]
            if kernel.params[index].is_constexpr:
                self.signature[name], self.constexprs[name] = "constexpr", value
            elif isinstance(value, torch.Tensor):
                # the caching allocator's blocks are 16-byte aligned: Triton's launcher specializes them so
                self.signature[name] = POINTER_TYPES[value.dtype]
                self.attrs[(index,)] = [["tt.divisibility", 16]]
            elif isinstance(value, bool):
                raise TypeError(f"{kernel.__name__}.{name}: a bool that is not a constexpr")
            elif isinstance(value, float):
                self.signature[name] = "fp32"
            elif isinstance(value, int):
                if value == 1:  # as the launcher does: a 1 becomes a constant
                    self.signature[name], self.constexprs[name] = "constexpr", 1
                else:
                    self.signature[name] = "i32" if -(2**31) <= value < 2**31 else "i64"
                    if value % 16 == 0:
                        self.attrs[(index,)] = [["tt.divisibility", 16]]
            else:
                raise TypeError(f"{kernel.__name__}.{name}: unexpected argument {value!r}")

    def key(self) -> str:
        """What makes two launches one compiled kernel."""
        return json.dumps([self.kernel.__name__, self.signature, sorted(self.attrs), self.options],
                          default=str, sort_keys=True) + repr(sorted(self.constexprs.items()))

    def describe(self) -> str:
        """The kernel and its constexprs, for the report."""
        flags = ",".join(f"{name}={value}" for name, value in self.constexprs.items())
        types = ",".join(sorted({t for t in self.signature.values() if t.startswith("*")}))
        return f"{self.kernel.__name__}[{flags}][{types}][{self.options}]"

    def compile(self) -> Any:
        """The kernel compiled for sm90."""
        import triton
        from triton.backends.compiler import GPUTarget

        source = triton.compiler.ASTSource(
            fn=self.kernel, signature=self.signature, constexprs=self.constexprs, attrs=self.attrs
        )
        return triton.compile(source, target=GPUTarget("cuda", 90, 32), options=self.options)


class Recorder:
    """Stands in for a ``@triton.jit`` kernel: ``kernel[grid](...)`` records the launch instead of running it."""

    def __init__(self, kernel: Any, launches: list[Launch]) -> None:
        self.kernel, self.launches = kernel, launches

    def __getitem__(self, grid: object) -> Callable[..., None]:
        def record(*args: object, **kwargs: object) -> None:
            self.launches.append(Launch(self.kernel, args, kwargs))

        return record


def _record_kernels(modules: list[ModuleType], launches: list[Launch]) -> None:
    from triton.runtime.jit import JITFunction

    for module in modules:
        for name, value in list(vars(module).items()):
            if isinstance(value, JITFunction):
                setattr(module, name, Recorder(value, launches))


MIXTRAL = (8, 4096, 14336, 2)
"""(experts, hidden, intermediate, top_k): tuned on the H200 for every format."""
GPT_OSS = (32, 2880, 2880, 4)
"""gpt-oss-20b's experts: untuned (the heuristic's block sizes)."""
UNEVEN = (8, 1000, 336, 2)
"""K not a multiple of 16: the masked loads (``EVEN_K`` off)."""
MXFP4_ODD = (8, 1056, 352, 2)
"""H and I odd multiples of 32: the heuristic's MXFP4 K tiles are 32 (one scale block), a 64 tile leaves a tail."""
TOKENS = (1, 4096)
"""Decode and prefill."""


def _dispatch(shape: tuple[int, int, int, int], tokens: int, dtype: torch.dtype) -> Any:
    from moe_core import StandardDispatchOutput, TopKOutput

    experts, hidden, _, top_k = shape
    ids = torch.empty(tokens, top_k, dtype=torch.int32, device=META)
    topk = TopKOutput(ids, torch.empty(tokens, top_k, device=META), num_experts=experts, check_values=False)
    return StandardDispatchOutput(torch.empty(tokens, hidden, dtype=dtype, device=META), topk)


def _config(shape: tuple[int, int, int, int], activation: object, biases: bool) -> Any:
    from moe_core import MoeRunnerConfig

    experts, hidden, inter, top_k = shape
    return MoeRunnerConfig(
        num_experts=experts, hidden_size=hidden, intermediate_size_per_partition=inter, top_k=top_k,
        activation=cast(Any, activation), expert_biases=biases,
    )


def _common(shape: tuple[int, int, int, int]) -> dict[str, object]:
    experts, hidden, inter, _ = shape
    return {"num_experts": experts, "hidden_size": hidden, "intermediate_size": inter, "device": META}


def _dense(shape: tuple[int, int, int, int], dtype: torch.dtype, gated: bool, biases: bool) -> SimpleNamespace:
    experts, hidden, inter, _ = shape
    rows = 2 * inter if gated else inter
    bias = None
    if biases:
        bias = SimpleNamespace(w13=torch.empty(experts, rows, dtype=dtype, device=META),
                               w2=torch.empty(experts, hidden, dtype=dtype, device=META))
    return SimpleNamespace(
        w13=torch.empty(experts, rows, hidden, dtype=dtype, device=META),
        w2=torch.empty(experts, hidden, inter, dtype=dtype, device=META), biases=bias, gated=gated, **_common(shape),
    )


def _scale(*shape: int) -> SimpleNamespace:
    return SimpleNamespace(value=torch.empty(*shape, dtype=torch.float32, device=META), data=None)


def _fp8(shape: tuple[int, int, int, int], static: bool, promote: bool) -> SimpleNamespace:
    from moe_core.backends.triton.quant_info import DynamicFp8Activations, Fp8Accumulation

    experts, hidden, inter, _ = shape
    fp8 = torch.float8_e4m3fn
    activations: object = DynamicFp8Activations()
    if static:
        from moe_core.backends.triton.quant_info import StaticFp8Activations

        activations = object.__new__(StaticFp8Activations)  # its scales' values are never read here
        object.__setattr__(activations, "w13_input_scale", _scale(1))
        object.__setattr__(activations, "w2_input_scale", _scale(1))
    return SimpleNamespace(
        w13=torch.empty(experts, 2 * inter, hidden, dtype=fp8, device=META), w13_scales=_scale(experts, 2 * inter),
        w2=torch.empty(experts, hidden, inter, dtype=fp8, device=META), w2_scales=_scale(experts, hidden),
        activations=activations,
        accumulation=Fp8Accumulation.FLOAT32_EVERY_TILE if promote else Fp8Accumulation.TENSOR_CORE,
        **_common(shape),
    )


def _fp8_block(shape: tuple[int, int, int, int]) -> SimpleNamespace:
    experts, hidden, inter, _ = shape
    fp8 = torch.float8_e4m3fn
    return SimpleNamespace(
        w13=torch.empty(experts, 2 * inter, hidden, dtype=fp8, device=META),
        w13_scales=_scale(experts, 2 * inter // 128, hidden // 128),
        w2=torch.empty(experts, hidden, inter, dtype=fp8, device=META), w2_scales=_scale(experts, hidden // 128, inter // 128),
        **_common(shape),
    )


def _nvfp4(shape: tuple[int, int, int, int]) -> SimpleNamespace:
    experts, hidden, inter, _ = shape

    def block_scales(rows: int, cols: int) -> SimpleNamespace:
        return SimpleNamespace(data=torch.empty(experts, rows, cols // 16, dtype=torch.float8_e4m3fn, device=META))

    return SimpleNamespace(
        w13_packed=torch.empty(experts, 2 * inter, hidden // 2, dtype=torch.uint8, device=META),
        w13_block_scales=block_scales(2 * inter, hidden), gate_up_dequant=torch.empty(experts, 2, device=META),
        w2_packed=torch.empty(experts, hidden, inter // 2, dtype=torch.uint8, device=META),
        w2_block_scales=block_scales(hidden, inter), w2_scales=_scale(experts), **_common(shape),
    )


def _mxfp4(shape: tuple[int, int, int, int], biases: bool) -> SimpleNamespace:
    experts, hidden, inter, _ = shape

    def exponents(rows: int, cols: int) -> SimpleNamespace:
        return SimpleNamespace(codes=torch.empty(experts, rows, cols // 32, dtype=torch.uint8, device=META))

    bias = None
    if biases:
        bias = SimpleNamespace(w13=torch.empty(experts, 2 * inter, device=META), w2=torch.empty(experts, hidden, device=META))
    return SimpleNamespace(
        w13_packed=torch.empty(experts, 2 * inter, hidden // 2, dtype=torch.uint8, device=META),
        w13_scales=exponents(2 * inter, hidden), w2_packed=torch.empty(experts, hidden, inter // 2, dtype=torch.uint8, device=META),
        w2_scales=exponents(hidden, inter), biases=bias, **_common(shape),
    )


def _with_block_k(block_k: int, run: Callable[[], object]) -> Callable[[], object]:
    """``run`` with both GEMMs' K tiles ``block_k`` (as a tuned table may say), the heuristic's other sizes."""
    from moe_core.backends.triton import plans

    def patched() -> object:
        original = plans._configs

        def configs(*args: Any) -> tuple[Any, Any]:
            w13, w2 = original(*args)
            return attrs.evolve(w13, block_k=block_k), attrs.evolve(w2, block_k=block_k)

        plans._configs = configs  # type: ignore[assignment]
        try:
            result = run()
        finally:
            plans._configs = original
        return result

    return patched


def scenarios() -> Iterator[tuple[str, Callable[[], object]]]:
    """Each (name, forward): one runner's forward on meta weights and a meta batch (the recorded launches)."""
    from moe_core import Activation, ClampedSwiglu, GateClamp, LimitedSwiglu
    from moe_core.backends.triton import plans
    from moe_core.backends.triton.runner import TritonRunner

    clamped = ClampedSwiglu(alpha=1.702, limit=7.0)

    def forward(kind: str, shape: tuple[int, int, int, int], tokens: int, dtype: torch.dtype, activation: object,
                biases: bool = False, **options: bool) -> Callable[[], object]:
        def run() -> object:
            config, dispatch = _config(shape, activation, biases), _dispatch(shape, tokens, dtype)
            if kind == "dense":
                gated = cast(Any, activation).gated
                return TritonRunner(config, plans.DensePlan()).run(dispatch, cast(Any, _dense(shape, dtype, gated, biases)))
            if kind == "fp8":
                weights = _fp8(shape, options["static"], options.get("promote", True))
                return TritonRunner(config, plans.Fp8Plan()).run(dispatch, cast(Any, weights))
            if kind == "fp8-block":
                return TritonRunner(config, plans.Fp8BlockPlan()).run(dispatch, cast(Any, _fp8_block(shape)))
            if kind == "mxfp4":
                return TritonRunner(config, plans.Mxfp4W4A16Plan()).run(dispatch, cast(Any, _mxfp4(shape, biases)))
            return TritonRunner(config, plans.Nvfp4W4A16Plan()).run(dispatch, cast(Any, _nvfp4(shape)))

        return run

    bf16, fp16 = torch.bfloat16, torch.float16
    for tokens in TOKENS:
        for activation in (Activation.SILU_GATED, Activation.GELU_GATED, Activation.GELU_TANH_GATED, Activation.RELU2):
            yield f"dense bf16 {activation.value} T={tokens}", forward("dense", MIXTRAL, tokens, bf16, activation)
        yield f"dense bf16 clamped_swiglu+biases gpt-oss T={tokens}", forward("dense", GPT_OSS, tokens, bf16, clamped, True)
        yield f"dense bf16 relu2+biases T={tokens}", forward("dense", GPT_OSS, tokens, bf16, Activation.RELU2, True)
        yield f"dense fp16 silu T={tokens}", forward("dense", MIXTRAL, tokens, fp16, Activation.SILU_GATED)
        yield f"fp8 per-tensor static T={tokens}", forward("fp8", MIXTRAL, tokens, bf16, Activation.SILU_GATED, static=True)
        yield f"fp8 per-channel dynamic T={tokens}", forward("fp8", MIXTRAL, tokens, bf16, Activation.SILU_GATED, static=False)
        yield f"fp8-block T={tokens}", forward("fp8-block", MIXTRAL, tokens, bf16, Activation.SILU_GATED)
        yield f"nvfp4-w4a16 T={tokens}", forward("nvfp4", MIXTRAL, tokens, bf16, Activation.SILU_GATED)
        yield f"mxfp4-w4a16 clamped_swiglu+biases gpt-oss T={tokens}", forward("mxfp4", GPT_OSS, tokens, bf16, clamped, True)
        yield f"mxfp4-w4a16 fp16 silu T={tokens}", forward("mxfp4", MIXTRAL, tokens, fp16, Activation.SILU_GATED)
    yield "dense bf16 silu+biases T=1", forward("dense", MIXTRAL, 1, bf16, Activation.SILU_GATED, True)
    yield "dense fp16 clamped_swiglu+biases T=1", forward("dense", GPT_OSS, 1, fp16, clamped, True)
    yield "dense bf16 gelu uneven K T=1", forward("dense", UNEVEN, 1, bf16, Activation.GELU_GATED)
    yield "fp8 tensor-core accumulation T=4096", forward("fp8", MIXTRAL, 4096, bf16, Activation.SILU_GATED, static=False,
                                                         promote=False)
    yield "fp8 static clamped_swiglu T=1", forward("fp8", MIXTRAL, 1, bf16, clamped, static=True)
    yield "fp8-block clamped_swiglu T=1", forward("fp8-block", MIXTRAL, 1, bf16, clamped)
    yield "nvfp4-w4a16 clamped_swiglu T=1", forward("nvfp4", MIXTRAL, 1, bf16, clamped)
    yield "nvfp4-w4a16 fp16 clamped_swiglu T=4096", forward("nvfp4", MIXTRAL, 4096, fp16, clamped)
    for clamp in GateClamp:
        limited = LimitedSwiglu(limit=10.0, gate_clamp=clamp)
        yield f"dense bf16 {limited.value} T=1", forward("dense", MIXTRAL, 1, bf16, limited)
        yield f"fp8 static {limited.value} T=4096", forward("fp8", MIXTRAL, 4096, bf16, limited, static=True)
    yield "mxfp4-w4a16 one-block K tiles T=1", forward("mxfp4", MXFP4_ODD, 1, bf16, clamped, True)
    yield "mxfp4-w4a16 K tail (64-wide tiles) T=1", _with_block_k(64, forward("mxfp4", MXFP4_ODD, 1, bf16, clamped, True))
    yield from _routing_scenarios()


def _routing_scenarios() -> Iterator[tuple[str, Callable[[], object]]]:
    """The fused routing kernel's launches: DeepSeek-V3's grouped top-k (with its correction bias) and Qwen3's
    top-k softmax, from bf16 and float32 logits, for decode and prefill; a grouped softmax scoring by each group's
    best with a sum floor and no bias, over a number of experts that is not a power of two."""
    from moe_core import GroupedTopK, GroupScore, MoeRunnerConfig, Routing, RoutingMethod, Scoring
    from moe_core.backends.triton.routing import fused_select_experts

    def route(method: Routing, experts: int, top_k: int, tokens: int, dtype: torch.dtype,
              bias: bool) -> Callable[[], object]:
        def run() -> object:
            config = MoeRunnerConfig(num_experts=experts, hidden_size=7168, intermediate_size_per_partition=2048,
                                     top_k=top_k, routing_method=method)
            logits = torch.empty(tokens, experts, dtype=dtype, device=META)
            correction = torch.empty(experts, device=META) if bias else None
            return fused_select_experts(logits, config, score_correction_bias=correction)

        return run

    deepseek = GroupedTopK(n_group=8, topk_group=4, renormalize=True)
    for tokens in TOKENS:
        for dtype in (torch.bfloat16, torch.float32):
            name = str(dtype).removeprefix("torch.")
            yield f"routing grouped_topk DeepSeek-V3 {name} T={tokens}", route(deepseek, 256, 8, tokens, dtype, True)
            yield (f"routing topk_renormalize Qwen3 {name} T={tokens}",
                   route(RoutingMethod.TOPK_RENORMALIZE, 128, 8, tokens, dtype, False))
    floored = GroupedTopK(n_group=8, topk_group=4, renormalize=True, scoring=Scoring.SOFTMAX,
                          group_score=GroupScore.MAX, sum_floor=0.5)
    yield "routing grouped_topk_softmax_group_max sum_floor E=160 T=1", route(floored, 160, 6, 1, torch.bfloat16, False)


def record() -> dict[str, tuple[Launch, list[str]]]:
    """Every distinct launch of every scenario, with the scenarios that made it."""
    from moe_core.backends.triton import interpreted, plans, quantize, routing, sorting
    from moe_core.backends.triton import launch as launching

    if interpreted():
        raise RuntimeError("TRITON_INTERPRET is set: the kernels would be interpreted functions, which do not compile")
    launches: list[Launch] = []
    _record_kernels([launching, sorting, quantize, routing], launches)
    plans._device_name = lambda device: "NVIDIA H200"  # type: ignore[assignment]  # the tuned tables' device
    distinct: dict[str, tuple[Launch, list[str]]] = {}
    for name, forward in scenarios():
        launches.clear()
        forward()
        if not launches:
            raise RuntimeError(f"{name}: launched nothing")
        for launch in launches:
            names = distinct.setdefault(launch.key(), (launch, []))[1]
            if name not in names:
                names.append(name)
    return distinct


def main(argv: list[str]) -> int:
    """Record, then compile every distinct launch (unless ``--list``); one JSON line per variant."""
    distinct = record()
    failed = 0
    for launch, names in distinct.values():
        line: dict[str, object] = {"kernel": launch.describe(), "scenarios": names}
        if "--list" not in argv:
            start = time.perf_counter()
            try:
                compiled = launch.compile()
            except Exception as error:  # report every variant, then fail
                line["error"] = f"{type(error).__name__}: {error}"[:2000]
                failed += 1
            else:
                shared = int(compiled.metadata.shared)
                line.update(seconds=round(time.perf_counter() - start, 2), shared=shared, ptx_lines=compiled.asm["ptx"].count("\n"))
                if shared > SM90_MAX_SHARED:
                    line["error"] = f"uses {shared} bytes of shared memory, sm90 allows {SM90_MAX_SHARED}"
                    failed += 1
        print(json.dumps(line), flush=True)
    return 1 if failed else 0


def _has_nvidia_compiler() -> bool:
    try:
        import triton.backends.nvidia.compiler  # noqa: F401
    except ImportError:
        return False
    return True


@pytest.mark.skipif(not _has_nvidia_compiler(), reason="needs Triton with its NVIDIA backend (ptxas is bundled)")
def test_every_launched_variant_compiles_for_sm90() -> None:
    env = {name: value for name, value in os.environ.items() if name != "TRITON_INTERPRET"}
    start = time.perf_counter()
    result = subprocess.run(
        [sys.executable, "-m", "tests.test_triton_sm90_compile"], cwd=ROOT, env=env, capture_output=True, text=True,
        check=False, timeout=900,
    )
    lines = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]
    errors = [line for line in lines if "error" in line]
    print(f"{len(lines)} variants compiled for sm90 in {time.perf_counter() - start:.1f} s")
    assert result.returncode == 0 and not errors, (errors or result.stderr[-4000:])
    kernels = {line["kernel"].split("[")[0] for line in lines}
    assert kernels >= {
        "moe_gemm_kernel", "combine_kernel", "dequantize_nvfp4_kernel", "dequantize_mxfp4_kernel",
        "sort_one_program_kernel", "count_kernel",
        "scan_kernel", "scatter_kernel", "quantize_rows_kernel", "quantize_groups_kernel", "routing_kernel",
    }, kernels
    gemms = [line["kernel"] for line in lines if line["kernel"].startswith("moe_gemm_kernel")]
    for flags in ("BIAS=True", "RELU2=True", "ACTIVATION=3", "ACTIVATION=1", "ACTIVATION=2", "NVFP4=True",
                  "EXPERT_SCALES=True", "FP8_BLOCKS=True", "OUT_FP8=True", "PROMOTE=False", "EVEN_K=False",
                  "MXFP4=True"):
        assert any(flags in gemm for gemm in gemms), f"no compiled GEMM variant with {flags}"
    mxfp4 = [gemm for gemm in gemms if "MXFP4=True" in gemm]
    for flags in ("EVEN_K=False", "BIAS=True", "ACTIVATION=3", "BLOCK_K=32"):
        assert any(flags in gemm for gemm in mxfp4), f"no compiled MXFP4 GEMM variant with {flags}"


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
