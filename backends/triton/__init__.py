"""The Triton fused MoE backend: bf16/fp16 weights, FP8 W8A8, and NVFP4 weights with bf16/fp16 activations (W4A16).

Token sorting (:mod:`.sorting`), the grouped GEMMs with the gated activation
and the top-k weights fused, and the combine (:mod:`.kernels`) are Triton,
with block sizes from :mod:`.configs`; :mod:`.runner` runs them with no
host synchronization (CUDA-graph capturable) and expert parallelism (local
experts with an offset; pairs routed elsewhere contribute nothing); the FP8
runner quantizes each GEMM input first (:mod:`.quantize`).

Importing this module registers the keys without importing Triton, so a
machine without it lists the backends as unavailable with the reason.
Available on CUDA devices of compute capability 8.0 or newer (NVFP4: 8.9,
for the E4M3 scale conversion; FP8: 8.9, for FP8 dot products), and on the CPU under Triton's interpreter
(``TRITON_INTERPRET=1``: slow, for tests).
"""

from __future__ import annotations

import importlib.util
import os

import torch

from moe_core import (
    DENSE,
    FP8,
    FP8_BLOCK_SCALED,
    FP8_CHANNEL,
    NVFP4_W4A16,
    Availability,
    BackendKey,
    Conversion,
    MoeRunnerConfig,
    Runner,
    register_backend,
)
from moe_core.backends.triton.quant_info import (
    TritonDenseWeights,
    TritonFp8BlockWeights,
    TritonFp8Weights,
    TritonNvfp4W4A16Weights,
)


def interpreted() -> bool:
    """True under Triton's CPU interpreter (``TRITON_INTERPRET=1``): the kernels then upcast their dot products and
    round before E4M3 casts."""
    return os.environ.get("TRITON_INTERPRET") == "1"


def _availability(device: torch.device, capability: tuple[int, int]) -> Availability:
    if importlib.util.find_spec("triton") is None:
        return Availability.unavailable("triton is not installed (pip install 'moe-core[triton]')")
    if device.type == "cpu":
        if interpreted():
            return Availability.available()
        return Availability.unavailable("needs a CUDA device (or TRITON_INTERPRET=1 for Triton's slow CPU interpreter)")
    if device.type != "cuda":
        return Availability.unavailable(f"needs a CUDA device, not {device.type}")
    if not torch.cuda.is_available():
        return Availability.unavailable("torch sees no CUDA device")
    found = torch.cuda.get_device_capability(device)
    if found < capability:
        return Availability.unavailable(f"needs compute capability {capability[0]}.{capability[1]}+, found {found[0]}.{found[1]}")
    return Availability.available()


def dense_availability(device: torch.device) -> Availability:
    """Triton present, and a CUDA device of compute capability 8.0+ (bf16 dot products), or the CPU interpreter."""
    return _availability(device, (8, 0))


def nvfp4_availability(device: torch.device) -> Availability:
    """Triton present, and a CUDA device of compute capability 8.9+ (E4M3 scales), or the CPU interpreter."""
    return _availability(device, (8, 9))


def fp8_availability(device: torch.device) -> Availability:
    """Triton present, and a CUDA device of compute capability 8.9+ (FP8 dot products), or the CPU interpreter."""
    return _availability(device, (8, 9))


def _dense_runner(config: MoeRunnerConfig) -> Runner[TritonDenseWeights]:
    """The bf16/fp16 runner, imported on first use so that registering needs no Triton."""
    from moe_core.backends.triton.runner import TritonDenseRunner

    return TritonDenseRunner(config)


def _nvfp4_w4a16_runner(config: MoeRunnerConfig) -> Runner[TritonNvfp4W4A16Weights]:
    """The NVFP4 W4A16 runner, imported on first use so that registering needs no Triton."""
    from moe_core.backends.triton.runner import TritonNvfp4W4A16Runner

    return TritonNvfp4W4A16Runner(config)


def _fp8_runner(config: MoeRunnerConfig) -> Runner[TritonFp8Weights]:
    """The FP8 W8A8 runner, imported on first use so that registering needs no Triton."""
    from moe_core.backends.triton.runner import TritonFp8Runner

    return TritonFp8Runner(config)


def _fp8_block_runner(config: MoeRunnerConfig) -> Runner[TritonFp8BlockWeights]:
    """The block-scaled FP8 runner, imported on first use so that registering needs no Triton."""
    from moe_core.backends.triton.runner import TritonFp8BlockRunner

    return TritonFp8BlockRunner(config)


TRITON_DENSE: BackendKey[TritonDenseWeights] = register_backend(
    "triton-dense",
    description="Triton fused MoE, bf16/fp16 weights (float32 canonical weights rounded to bf16)",
    factory=_dense_runner,
    availability=dense_availability,
    conversions=[Conversion(DENSE, TritonDenseWeights.from_dense)],
)
"""bf16/fp16 experts."""

TRITON_NVFP4_W4A16: BackendKey[TritonNvfp4W4A16Weights] = register_backend(
    "triton-nvfp4-w4a16",
    description="Triton fused MoE, NVFP4 weights dequantized in the kernel, bf16/fp16 activations",
    factory=_nvfp4_w4a16_runner,
    availability=nvfp4_availability,
    conversions=[Conversion(NVFP4_W4A16, TritonNvfp4W4A16Weights.from_nvfp4)],
)
"""NVFP4 W4A16 experts (the Hopper fallback for NVFP4 checkpoints)."""

TRITON_FP8: BackendKey[TritonFp8Weights] = register_backend(
    "triton-fp8",
    description="Triton fused MoE, FP8 W8A8: per-tensor weights with static input scales, or per-channel with per-token",
    factory=_fp8_runner,
    availability=fp8_availability,
    conversions=[
        Conversion(FP8, TritonFp8Weights.from_fp8),
        Conversion(FP8_CHANNEL, TritonFp8Weights.from_fp8_channel),
    ],
)
"""FP8 E4M3 W8A8 experts."""

TRITON_FP8_BLOCK: BackendKey[TritonFp8BlockWeights] = register_backend(
    "triton-fp8-block",
    description="Triton fused MoE, FP8 W8A8 with 128x128 block weight scales and 1x128 activation groups",
    factory=_fp8_block_runner,
    availability=fp8_availability,
    conversions=[Conversion(FP8_BLOCK_SCALED, TritonFp8BlockWeights.from_fp8_block)],
)
"""Block-scaled FP8 experts (DeepSeek-V3, Qwen3 FP8 checkpoints)."""
