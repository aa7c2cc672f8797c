"""FlashInfer's CUTLASS fused MoE: bf16/fp16 and FP8 W8A8 experts on SM90 and later, NVFP4 W4A4 on SM100/SM110/SM120.

:mod:`.quant_info` holds one quant info per format, built once from the
canonical weights; :mod:`.runner` calls the kernel; :mod:`.kernel` is the one
module that touches FlashInfer. Registering imports no FlashInfer.

On SM90 FlashInfer compiles the kernel's module at first use (just-in-time,
with nvcc; about 35 minutes for the stock module on 16 cores) unless a
prebuilt one is installed; the FP4 kernels need Blackwell.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import torch

from moe_core import DENSE, FP8, NVFP4, BackendKey, Conversion, MoeRunnerConfig, Runner, register_backend
from moe_core.backends._flashinfer import device_reasons, require_available, row_alignment_reasons, swiglu_only
from moe_core.capability import DeviceSpec, LayerSpec, Priority, Support, Tier
from moe_core.backends.flashinfer_cutlass.kernel import load_kernels
from moe_core.backends.flashinfer_cutlass.quant_info import CutlassBf16Weights, CutlassFp8Weights, CutlassNvfp4Weights
from moe_core.backends.flashinfer_cutlass.runner import CutlassQuantInfo, CutlassRunner, expert_parallel_rank

DENSE_CAPABILITY = (9, 0)
"""The bf16 grouped GEMMs run on SM90 and later."""

NVFP4_CAPABILITIES = ((10, 0), (10, 3), (11, 0), (12, 0), (12, 1))
"""The compute capabilities FlashInfer builds the CUTLASS FP4 MoE for."""


KERNEL_AFTER_TRITON = Priority(Tier.KERNEL, order=10)
"""Ranked after the Triton kernels: on SM90 FlashInfer compiles this module at first use (minutes) unless prebuilt."""


def bf16_device_support(device: DeviceSpec) -> Support:
    """FlashInfer installed and a CUDA GPU of SM90 or later (bf16/fp16 and FP8)."""
    return Support.of(device_reasons(device, (DENSE_CAPABILITY,), minimum=True))


def nvfp4_device_support(device: DeviceSpec) -> Support:
    """FlashInfer installed and a Blackwell GPU (SM100/SM103/SM110/SM120/SM121)."""
    return Support.of(device_reasons(device, NVFP4_CAPABILITIES, minimum=False))


def expert_slice_reasons(layer: LayerSpec) -> list[str]:
    """Why the kernel cannot take ``layer``'s local experts: it takes expert parallelism as ``ep_size``/``ep_rank``,
    so they must be one of ``num_experts / num_local_experts`` equal slices (empty when they are)."""
    config = layer.config
    try:
        expert_parallel_rank(config)
    except ValueError as error:
        return [str(error)]
    return []


def bf16_supports(device: DeviceSpec, layer: LayerSpec) -> Support:
    """:func:`bf16_device_support`, and a SwiGLU layer whose local experts are an equal slice."""
    return bf16_device_support(device).combine(Support.of(swiglu_only(layer) + expert_slice_reasons(layer)))


def nvfp4_supports(device: DeviceSpec, layer: LayerSpec) -> Support:
    """:func:`nvfp4_device_support`, and a SwiGLU layer of equal expert slices whose sizes fit the FP4 kernels'
    128-row tiles."""
    reasons = swiglu_only(layer) + expert_slice_reasons(layer) + row_alignment_reasons(layer)
    return nvfp4_device_support(device).combine(Support.of(reasons))


Q = TypeVar("Q", bound=CutlassQuantInfo)


def _factory(name: str, device_support: Callable[[DeviceSpec], Support]) -> Callable[[MoeRunnerConfig], Runner[Q]]:
    """A runner factory over FlashInfer's kernel that refuses where backend ``name`` cannot run."""

    def runner(config: MoeRunnerConfig) -> Runner[Q]:
        require_available(name, device_support)
        return CutlassRunner[Q](config, kernels=load_kernels())

    return runner


FLASHINFER_CUTLASS_BF16: BackendKey[CutlassBf16Weights] = register_backend(
    "flashinfer-cutlass-bf16",
    description="FlashInfer CUTLASS fused MoE, bf16/fp16 weights (SM90+)",
    factory=_factory("flashinfer-cutlass-bf16", bf16_device_support),
    supports=bf16_supports,
    priority=KERNEL_AFTER_TRITON,
    conversions=[Conversion(DENSE, CutlassBf16Weights.from_dense)],
)
"""bf16/fp16 experts through ``cutlass_fused_moe``."""

FLASHINFER_CUTLASS_FP8: BackendKey[CutlassFp8Weights] = register_backend(
    "flashinfer-cutlass-fp8",
    description="FlashInfer CUTLASS fused MoE, FP8 per-tensor W8A8, w1/w3 on one scale per expert (SM90+)",
    factory=_factory("flashinfer-cutlass-fp8", bf16_device_support),
    supports=bf16_supports,
    priority=KERNEL_AFTER_TRITON,
    conversions=[Conversion(FP8, CutlassFp8Weights.from_fp8)],
)
"""FP8 per-tensor W8A8 experts through ``cutlass_fused_moe``."""

FLASHINFER_CUTLASS_NVFP4: BackendKey[CutlassNvfp4Weights] = register_backend(
    "flashinfer-cutlass-nvfp4",
    description="FlashInfer CUTLASS fused MoE, NVFP4 W4A4, one FC1 alpha (w3/w1 ratio folded into FC2) (SM100/SM110/SM120)",
    factory=_factory("flashinfer-cutlass-nvfp4", nvfp4_device_support),
    supports=nvfp4_supports,
    priority=Priority(Tier.KERNEL, order=1),
    conversions=[Conversion(NVFP4, CutlassNvfp4Weights.from_nvfp4_folded)],
)
"""NVFP4 W4A4 experts through ``cutlass_fused_moe``."""
