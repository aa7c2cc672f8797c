"""The Triton fused MoE backend: bf16/fp16 weights, FP8 W8A8, and NVFP4 and MXFP4 weights with bf16/fp16 activations (W4A16).

Token sorting (:mod:`.sorting`), the grouped GEMMs with the gated activation
and the top-k weights fused, and the combine (:mod:`.kernels`) are Triton,
with block sizes from :mod:`.configs`. :mod:`.runner`'s one runner, generic
over a typed plan per format (:mod:`.plans`), launches them (:mod:`.launch`)
with no host synchronization (CUDA-graph capturable) and expert parallelism
(local experts with an offset; pairs routed elsewhere contribute nothing);
FP8 plans quantize each GEMM input first (:mod:`.quantize`).

Importing this module registers the keys (kernel tier, ahead of FlashInfer's
CUTLASS MoE) without importing Triton, so a machine without it lists the
backends as unsupported with the reason. They run layers of gated SiLU,
GELU (erf or tanh), gpt-oss's clamped SwiGLU or SiLU with limits (DeepSeek-V4,
GLM-5-Next, Step 3.7) with bf16/fp16 hidden states
on CUDA devices of compute capability 8.0 or newer (NVFP4 and FP8: 8.9, for
the E4M3 conversions and FP8 dot products); block-scaled FP8 needs sizes
that are multiples of 128. Dense weights may also be non-gated ReLU^2 and
carry per-expert biases (added in the GEMMs' epilogues); the quantized
formats hold gate and up halves and (but for MXFP4, gpt-oss's format) no
biases, so those layers are refused there. MXFP4 (compute capability 8.0:
bf16 dot products, no FP8) needs hidden and intermediate sizes that are
multiples of 32, whole E8M0 scale blocks. On the
CPU, Triton's interpreter (``TRITON_INTERPRET=1``: exact but slow, for
tests) runs them when chosen by name, never by rank.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from moe_core import (
    DENSE,
    FP8,
    FP8_BLOCK_SCALED,
    FP8_CHANNEL,
    MXFP4,
    NVFP4_W4A16,
    Activation,
    BackendKey,
    ClampedSwiglu,
    Conversion,
    LimitedSwiglu,
    MoeRunnerConfig,
    Runner,
    register_backend,
)
from moe_core.backends.triton.quant_info import (
    TritonDenseWeights,
    TritonFp8BlockWeights,
    TritonFp8Weights,
    TritonMxfp4W4A16Weights,
    TritonNvfp4W4A16Weights,
)
from moe_core.capability import DeviceSpec, LayerSpec, Priority, Support, Tier, interpreter_requested
from moe_core.formats import fp8_block_size_refusal
from moe_core.mxfp4 import MXFP4_BLOCK

ACTIVATIONS = (Activation.SILU_GATED, Activation.GELU_GATED, Activation.GELU_TANH_GATED, Activation.RELU2)
"""The parameterless activations the first GEMM's fused epilogue computes; and :class:`~moe_core.ClampedSwiglu`
(any ``alpha`` and ``limit``) and :class:`~moe_core.LimitedSwiglu` (any ``limit``, either gate clamp) (ReLU^2,
non-gated, only for dense weights: the quantized formats hold gate and up halves)."""

PARAMETRIZED_ACTIVATIONS = (ClampedSwiglu, LimitedSwiglu)
"""The activation classes the epilogue computes with any of their parameters."""

HIDDEN_DTYPES = (torch.bfloat16, torch.float16)
"""Hidden-state dtypes the kernels read and write."""

BIASED_FORMATS = (DENSE, MXFP4)
"""Formats whose weights may carry per-expert biases (gpt-oss's): the kernels add them in the epilogues."""

INTERPRETER = "Triton's CPU interpreter (TRITON_INTERPRET=1): exact but slow, for tests"


def interpreted() -> bool:
    """True under Triton's CPU interpreter (``TRITON_INTERPRET=1``): the kernels then upcast their dot products and
    round before E4M3 casts."""
    return interpreter_requested()


def _device_support(device: DeviceSpec, capability: tuple[int, int]) -> Support:
    if not device.has("triton"):
        return Support.no("triton is not installed (pip install 'moe-core[triton]')")
    if device.kind == "cpu":
        if device.triton_interpreter:
            return Support(by_name_only=INTERPRETER)
        return Support.no("needs a CUDA GPU (or TRITON_INTERPRET=1 for Triton's slow CPU interpreter, by name)")
    if device.kind != "cuda":
        return Support.no(f"needs a CUDA GPU, not {device.kind}")
    if device.capability is None:
        return Support.no("torch sees no CUDA device")
    if device.capability < capability:
        return Support.no(f"needs compute capability {capability[0]}.{capability[1]}+, found {device.capability_text()}")
    return Support.yes()


def _layer_reasons(layer: LayerSpec) -> list[str]:
    reasons = []
    config = layer.config
    activation = config.activation
    if not isinstance(activation, PARAMETRIZED_ACTIVATIONS) and activation not in ACTIVATIONS:
        names = ", ".join([*(a.value for a in ACTIVATIONS), ClampedSwiglu().value, "swiglu_limit (either gate clamp)"])
        reasons.append(f"its fused epilogue computes {names}, not {activation.value}")
    elif not activation.gated and layer.format is not DENSE:
        reasons.append(f"the {layer.format.name} weights are gated (w13 [E, 2I, H]), not {activation.value}")
    if config.routing_method.scales_input:
        reasons.append(f"its kernels weight each expert's output, not its input ({config.routing_method.value} routing)")
    if config.expert_biases and layer.format not in BIASED_FORMATS:
        reasons.append(f"the {layer.format.name} weights hold no expert biases")
    if layer.dtype not in HIDDEN_DTYPES:
        reasons.append(f"takes bf16/fp16 hidden states, not {layer.dtype}")
    if layer.format is FP8_BLOCK_SCALED:
        refusal = fp8_block_size_refusal(config.hidden_size, config.intermediate_size_per_partition)
        if refusal is not None:
            reasons.append(refusal)
    if layer.format is MXFP4:
        sizes = (config.hidden_size, config.intermediate_size_per_partition)
        if any(size % MXFP4_BLOCK for size in sizes):
            reasons.append(f"its MXFP4 tiles hold whole {MXFP4_BLOCK}-element scale blocks: hidden and intermediate sizes "
                           f"must be multiples of {MXFP4_BLOCK}, got {sizes}")
    return reasons


def _supports(capability: tuple[int, int]) -> Callable[[DeviceSpec, LayerSpec], Support]:
    def supports(device: DeviceSpec, layer: LayerSpec) -> Support:
        return _device_support(device, capability).combine(Support.of(_layer_reasons(layer)))

    return supports


dense_supports = _supports((8, 0))
"""Triton present, a CUDA GPU of compute capability 8.0+ (bf16 dot products) or the CPU interpreter (by name only),
and a layer the kernels compute."""

fp8_supports = _supports((8, 9))
"""As :data:`dense_supports`, on compute capability 8.9+ (FP8 dot products, E4M3 scale conversion)."""


def _dense_runner(config: MoeRunnerConfig) -> Runner[TritonDenseWeights]:
    """The bf16/fp16 runner, imported on first use so that registering needs no Triton."""
    from moe_core.backends.triton.plans import DensePlan
    from moe_core.backends.triton.runner import TritonRunner

    return TritonRunner(config, DensePlan())


def _nvfp4_w4a16_runner(config: MoeRunnerConfig) -> Runner[TritonNvfp4W4A16Weights]:
    """The NVFP4 W4A16 runner, imported on first use so that registering needs no Triton."""
    from moe_core.backends.triton.plans import Nvfp4W4A16Plan
    from moe_core.backends.triton.runner import TritonRunner

    return TritonRunner(config, Nvfp4W4A16Plan())


def _mxfp4_w4a16_runner(config: MoeRunnerConfig) -> Runner[TritonMxfp4W4A16Weights]:
    """The MXFP4 W4A16 runner, imported on first use so that registering needs no Triton."""
    from moe_core.backends.triton.plans import Mxfp4W4A16Plan
    from moe_core.backends.triton.runner import TritonRunner

    return TritonRunner(config, Mxfp4W4A16Plan())


def _fp8_runner(config: MoeRunnerConfig) -> Runner[TritonFp8Weights]:
    """The FP8 W8A8 runner, imported on first use so that registering needs no Triton."""
    from moe_core.backends.triton.plans import Fp8Plan
    from moe_core.backends.triton.runner import TritonRunner

    return TritonRunner(config, Fp8Plan())


def _fp8_block_runner(config: MoeRunnerConfig) -> Runner[TritonFp8BlockWeights]:
    """The block-scaled FP8 runner, imported on first use so that registering needs no Triton."""
    from moe_core.backends.triton.plans import Fp8BlockPlan
    from moe_core.backends.triton.runner import TritonRunner

    return TritonRunner(config, Fp8BlockPlan())


TRITON_DENSE: BackendKey[TritonDenseWeights] = register_backend(
    "triton-dense",
    description="Triton fused MoE, bf16/fp16 weights (float32 canonical weights rounded to bf16)",
    factory=_dense_runner,
    supports=dense_supports,
    priority=Priority(Tier.KERNEL, order=0),
    conversions=[Conversion(DENSE, TritonDenseWeights.from_dense)],
)
"""bf16/fp16 experts."""

TRITON_NVFP4_W4A16: BackendKey[TritonNvfp4W4A16Weights] = register_backend(
    "triton-nvfp4-w4a16",
    description="Triton fused MoE, NVFP4 weights dequantized in the kernel, bf16/fp16 activations",
    factory=_nvfp4_w4a16_runner,
    supports=fp8_supports,
    priority=Priority(Tier.KERNEL, order=0),
    conversions=[Conversion(NVFP4_W4A16, TritonNvfp4W4A16Weights.from_nvfp4)],
)
"""NVFP4 W4A16 experts (the Hopper fallback for NVFP4 checkpoints)."""

TRITON_MXFP4_W4A16: BackendKey[TritonMxfp4W4A16Weights] = register_backend(
    "triton-mxfp4-w4a16",
    description="Triton fused MoE, MXFP4 weights (E8M0 scales per 32) dequantized in the kernel, bf16/fp16 activations, "
    "expert biases",
    factory=_mxfp4_w4a16_runner,
    supports=dense_supports,
    priority=Priority(Tier.KERNEL, order=0),
    conversions=[Conversion(MXFP4, TritonMxfp4W4A16Weights.from_mxfp4)],
)
"""MXFP4 W4A16 experts (gpt-oss: clamped SwiGLU and biases), Hopper's path for MXFP4 checkpoints (ahead of their
degradation to dense bf16)."""

TRITON_FP8: BackendKey[TritonFp8Weights] = register_backend(
    "triton-fp8",
    description="Triton fused MoE, FP8 W8A8: per-tensor weights with static input scales, or per-channel with per-token",
    factory=_fp8_runner,
    supports=fp8_supports,
    priority=Priority(Tier.KERNEL, order=0),
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
    supports=fp8_supports,
    priority=Priority(Tier.KERNEL, order=0),
    conversions=[Conversion(FP8_BLOCK_SCALED, TritonFp8BlockWeights.from_fp8_block)],
)
"""Block-scaled FP8 experts (DeepSeek-V3, Qwen3 FP8 checkpoints)."""
