"""FlashInfer's TRT-LLM-gen FP4 MoE: NVFP4 W4A4 experts on Blackwell (SM100/SM103).

:mod:`.quant_info` holds what the kernel takes, built once from the canonical
NVFP4 weights; :mod:`.runner` quantizes the hidden states and calls the
kernel; :mod:`.kernel` is the one module that touches FlashInfer.

Registering imports no FlashInfer. The backend is available with FlashInfer
installed, on an SM100/SM103 GPU, with the kernels' cubins at hand: TRT-LLM-gen
loads precompiled cubins at run time, from ``FLASHINFER_CUBIN_DIR``, the
``flashinfer-cubin`` package, or a download into FlashInfer's cache (which an
offline machine cannot do).
"""

from __future__ import annotations

import importlib.util
import os
import pathlib

import torch

from moe_core import NVFP4, BackendKey, Conversion, MoeRunnerConfig, Runner, register_backend
from moe_core.backends._flashinfer import device_reasons, require_available, row_alignment_reasons, swiglu_only
from moe_core.capability import DeviceSpec, LayerSpec, Priority, Support, Tier
from moe_core.backends.flashinfer_trtllm_fp4.kernel import load_kernels
from moe_core.backends.flashinfer_trtllm_fp4.quant_info import TrtllmFp4Weights
from moe_core.backends.flashinfer_trtllm_fp4.runner import KERNEL_ROUTING, TrtllmFp4Runner

CAPABILITIES = ((10, 0), (10, 3))
"""The compute capabilities FlashInfer builds its TRT-LLM-gen MoE for."""


def cubin_reason() -> str | None:
    """Why the TRT-LLM-gen cubins cannot be loaded here, or None.

    Checks what needs no import of FlashInfer: ``FLASHINFER_CUBIN_DIR`` names an
    existing, non-empty folder, or the ``flashinfer-cubin`` package is installed.
    """
    configured = os.environ.get("FLASHINFER_CUBIN_DIR")
    if configured:
        folder = pathlib.Path(configured)
        if folder.is_dir() and any(folder.iterdir()):
            return None
        return f"FLASHINFER_CUBIN_DIR={configured} is not a folder of cubins"
    if importlib.util.find_spec("flashinfer_cubin") is not None:
        return None
    return (
        "no TRT-LLM-gen cubins: FLASHINFER_CUBIN_DIR is unset and the flashinfer-cubin package is absent, "
        "so FlashInfer would download them at first use (impossible offline)"
    )


def trtllm_fp4_device_support(device: DeviceSpec) -> Support:
    """FlashInfer installed, an SM100/SM103 GPU, and the cubins at hand; every reason that fails."""
    reasons = device_reasons(device, CAPABILITIES, minimum=False)
    cubins = cubin_reason()
    if cubins is not None:
        reasons.append(cubins)
    return Support.of(reasons)


def trtllm_fp4_supports(device: DeviceSpec, layer: LayerSpec) -> Support:
    """:func:`trtllm_fp4_device_support`, and a SwiGLU layer whose sizes fit the 128-row tiles and whose routing
    method the kernel computes."""
    reasons = swiglu_only(layer) + row_alignment_reasons(layer)
    if layer.config.routing_method not in KERNEL_ROUTING:
        reasons.append(f"the kernel computes no {layer.config.routing_method.value} routing")
    return trtllm_fp4_device_support(device).combine(Support.of(reasons))


def _runner(config: MoeRunnerConfig) -> Runner[TrtllmFp4Weights]:
    """The runner over FlashInfer's kernels (imported now); refuses where the backend cannot run."""
    require_available("flashinfer-trtllm-fp4", trtllm_fp4_device_support)
    return TrtllmFp4Runner(config, kernels=load_kernels())


FLASHINFER_TRTLLM_FP4: BackendKey[TrtllmFp4Weights] = register_backend(
    "flashinfer-trtllm-fp4",
    description="FlashInfer TRT-LLM-gen fused MoE, NVFP4 W4A4, separate gate/up scalars (SM100/SM103)",
    factory=_runner,
    supports=trtllm_fp4_supports,
    priority=Priority(Tier.KERNEL, order=0),
    conversions=[Conversion(NVFP4, TrtllmFp4Weights.from_nvfp4)],
)
"""NVFP4 W4A4 experts through ``trtllm_fp4_block_scale_routed_moe`` / ``trtllm_fp4_block_scale_moe``."""
