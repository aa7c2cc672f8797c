"""The Triton backend's runners: sort the tokens, two grouped GEMMs, the combine (and for FP8 the inputs' quantization).

``run`` checks the dispatch and quant info from metadata only, allocates its
buffers from the caching allocator and reads nothing back to the host, so a
forward can be captured in a CUDA graph and replayed.
"""

from __future__ import annotations

import functools
from typing import final

import attrs
import torch

from moe_core import Activation, ClampedSwiglu, DispatchFormat, DispatchOutput, MoeRunnerConfig, check_run_inputs
from moe_core.backends.triton import interpreted
from moe_core.backends.triton.configs import KernelConfig, choose, mxfp4_dequantizes, nvfp4_dequantizes
from moe_core.backends.triton.kernels import (
    CLAMPED_SWIGLU,
    GELU,
    GELU_TANH,
    SILU,
    combine_kernel,
    dequantize_mxfp4_kernel,
    dequantize_nvfp4_kernel,
    moe_gemm_kernel,
)
from moe_core.backends.triton.quant_info import (
    Fp8Accumulation,
    Fp8Activations,
    StaticFp8Activations,
    TritonDenseWeights,
    TritonFp8BlockWeights,
    TritonFp8Weights,
    TritonMxfp4W4A16Weights,
    TritonNvfp4W4A16Weights,
)
from moe_core.backends.triton.quantize import LocalPairs, quantize_fp8_groups, quantize_fp8_rows
from moe_core.backends.triton.sorting import SortedTokens, cdiv, next_power_of_2, sort_tokens
from moe_core.formats.dense import ExpertBiases

COMBINE_BLOCK = 1024
"""Hidden columns per combine program."""


@functools.cache
def _device_name(device: torch.device) -> str:
    """The name the tuned tables are keyed by, asked once per device (not on every forward)."""
    return torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"


@final
@attrs.frozen(eq=False)
class Gemm:
    """One grouped GEMM launch's operands: ``B`` (for NVFP4 with its block scales and per-expert dequantize
    factors, for MXFP4 with its uint8 E8M0 exponents as ``b_scales`` and no ``dequant``, for FP8 with its
    per-channel scales as ``dequant``), the output columns ``n``, the reduction ``k`` and the block sizes."""

    b: torch.Tensor
    b_scales: torch.Tensor | None
    dequant: torch.Tensor | None
    n: int
    k: int
    config: KernelConfig
    promote: bool = True
    """FP8: add the MMAs into the float32 accumulator every K tile (see :class:`~.quant_info.Fp8Accumulation`)."""
    dequantize: bool = False
    """NVFP4: expand ``B`` to the activations' dtype in one pass (:func:`dequantize_nvfp4`) and run the 16-bit
    kernel on that workspace; the global scales stay on the accumulator. MXFP4: the same into bf16
    (:func:`dequantize_mxfp4`)."""
    bias: torch.Tensor | None = None
    """Each expert's bias ``[E, rows of B]``, added to the accumulator in the epilogue."""


@final
@attrs.frozen
class Epilogue:
    """The first GEMM's activation as the kernel's constexprs: ``ACTIVATION`` (a gated one's code), ``RELU2``
    (non-gated ``relu(h) ** 2``: no up half), and the clamped SwiGLU's ``ALPHA`` and ``LIMIT`` (0 otherwise, so
    the other activations compile as one variant each)."""

    activation: int
    relu2: bool = False
    alpha: float = 0.0
    limit: float = 0.0

    @classmethod
    def of(cls, config: MoeRunnerConfig) -> Epilogue:
        """The epilogue of ``config``'s activation."""
        activation = config.activation
        if isinstance(activation, ClampedSwiglu):
            return cls(CLAMPED_SWIGLU, alpha=float(activation.alpha), limit=float(activation.limit))
        if activation is Activation.RELU2:
            return cls(SILU, relu2=True)
        codes = {Activation.SILU_GATED: SILU, Activation.GELU_GATED: GELU, Activation.GELU_TANH_GATED: GELU_TANH}
        return cls(codes[activation])


DEQUANTIZE_ROWS, DEQUANTIZE_BYTES = 16, 256
"""Rows and packed bytes per program of :func:`dequantize_nvfp4` on a GPU (the interpreter takes up to 64 rows)."""


def dequantize_nvfp4(packed: torch.Tensor, block_scales: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Packed NVFP4 ``[E, rows, cols / 2]`` times its E4M3 block scales ``[E, rows, cols / 16]`` as ``[E, rows, cols]``
    of ``dtype`` (exact in bf16 and fp16), without the global scales.

    A workspace the size of the 16-bit weights, from the caching allocator:
    for Mixtral's w13 (8 x 28672 x 4096) 1.9 GB; the two GEMMs take theirs in
    turn, so the larger one is the peak.
    """
    experts, rows, packed_cols = (int(d) for d in packed.shape)
    flat, scales = packed.reshape(experts * rows, packed_cols), block_scales.reshape(experts * rows, packed_cols // 8)
    out = torch.empty((experts * rows, 2 * packed_cols), dtype=dtype, device=packed.device)
    block_r = 64 if interpreted() else DEQUANTIZE_ROWS
    block_c = min(DEQUANTIZE_BYTES, max(8, next_power_of_2(packed_cols)))
    dequantize_nvfp4_kernel[(cdiv(experts * rows, block_r), cdiv(packed_cols, block_c))](
        flat, scales, out, experts * rows, packed_cols, flat.stride(0), scales.stride(0), out.stride(0),
        PTX=not interpreted(), BLOCK_R=block_r, BLOCK_C=block_c,
    )
    return out.view(experts, rows, 2 * packed_cols)


def dequantize_mxfp4(packed: torch.Tensor, exponents: torch.Tensor, dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    """Packed MXFP4 ``[E, rows, cols / 2]`` times its E8M0 scales (uint8 exponents ``[E, rows, cols / 32]``, at most
    240) as ``[E, rows, cols]`` of ``dtype`` (bf16: exact wherever the product is a bf16 number; for gpt-oss's
    w13, 32 x 5760 x 2880, a 1.1 GB workspace, taken in turn with w2's)."""
    experts, rows, packed_cols = (int(d) for d in packed.shape)
    flat, scales = packed.reshape(experts * rows, packed_cols), exponents.reshape(experts * rows, packed_cols // 16)
    out = torch.empty((experts * rows, 2 * packed_cols), dtype=dtype, device=packed.device)
    block_r = 64 if interpreted() else DEQUANTIZE_ROWS
    block_c = min(DEQUANTIZE_BYTES, max(16, next_power_of_2(packed_cols)))
    dequantize_mxfp4_kernel[(cdiv(experts * rows, block_r), cdiv(packed_cols, block_c))](
        flat, scales, out, experts * rows, packed_cols, flat.stride(0), scales.stride(0), out.stride(0),
        PTX=not interpreted(), BLOCK_R=block_r, BLOCK_C=block_c,
    )
    return out.view(experts, rows, 2 * packed_cols)


def launch(
    a: torch.Tensor, gemm: Gemm, out: torch.Tensor, topk_weights: torch.Tensor, sorted_tokens: SortedTokens,
    top_k: int, first: bool, epilogue: Epilogue, a_scales: torch.Tensor | None = None,
    out_scale: torch.Tensor | None = None,
) -> None:
    """Launch the grouped GEMM: the ``first`` (its rows tokens, ``epilogue``'s activation: gated, or ReLU^2 of a
    non-gated ``B``) or the second (weighted by the top-k weights); ``gemm.bias`` added to the accumulator.

    FP8 (``B`` E4M3): ``a_scales`` dequantizes ``a``'s rows (``[rows]``, or
    ``[1]`` for one static scale; with block-scaled ``B``, ``[rows, K / 128]``);
    ``out_scale`` quantizes the gated output to E4M3 (``out`` must then be E4M3).
    """
    if gemm.dequantize and gemm.b_scales is not None:
        if gemm.b_scales.dtype == torch.uint8:  # MXFP4's E8M0 exponents: a bf16 workspace, as the fused kernel's dots
            b = dequantize_mxfp4(gemm.b, gemm.b_scales)
        else:
            b = dequantize_nvfp4(gemm.b, gemm.b_scales, a.dtype)
        gemm = attrs.evolve(gemm, b=b, b_scales=None, dequantize=False)
    config = gemm.config
    grid = (sorted_tokens.max_blocks * cdiv(gemm.n, config.block_n),)
    scales, dequant = gemm.b_scales, gemm.dequant
    fp8 = gemm.b.dtype == torch.float8_e4m3fn
    blocks = fp8 and dequant is not None and dequant.dim() == 3
    if fp8 and a_scales is None:
        raise ValueError("launch: FP8 weights need the scales of their FP8 input rows")
    gated, relu2 = first and not epilogue.relu2, first and epilogue.relu2
    gate = epilogue if gated else Epilogue(SILU)  # only a gated epilogue reads them: one variant of the others
    bias = gemm.bias
    mxfp4 = scales is not None and scales.dtype == torch.uint8
    moe_gemm_kernel[grid](
        a, gemm.b, gemm.b if scales is None else scales, topk_weights if dequant is None else dequant,
        out, topk_weights, sorted_tokens.sorted_ids, sorted_tokens.expert_ids, sorted_tokens.num_rows,
        topk_weights if a_scales is None else a_scales, topk_weights if out_scale is None else out_scale,
        gemm.n, gemm.k, topk_weights.numel(), top_k, sorted_tokens.max_blocks,
        a.stride(0), gemm.b.stride(0), gemm.b.stride(1),
        0 if scales is None else scales.stride(0), 0 if scales is None else scales.stride(1),
        0 if dequant is None else (dequant.stride(0) if dequant.dim() > 1 else 1),
        dequant.stride(1) if dequant is not None and dequant.dim() > 1 else 0,
        a_scales.stride(0) if a_scales is not None and a_scales.shape[0] > 1 else 0, out.stride(0),
        topk_weights if bias is None else bias, 0 if bias is None else bias.stride(0),
        GATED=gated, NVFP4=scales is not None and not mxfp4, EXPERT_SCALES=not fp8 and scales is None and dequant is not None,
        FP8=fp8 and not blocks, FP8_BLOCKS=blocks, OUT_FP8=out_scale is not None,
        PROMOTE=gemm.promote,
        ACTIVATION=gate.activation,
        UPCAST=interpreted(),
        BIAS=bias is not None, RELU2=relu2, ALPHA=gate.alpha, LIMIT=gate.limit, MXFP4=mxfp4,
        EVEN_K=gemm.k % config.block_k == 0, BLOCK_M=config.block_m, BLOCK_N=config.block_n,
        BLOCK_K=config.block_k, GROUP_M=config.group_m, num_warps=config.num_warps, num_stages=config.num_stages,
    )


@final
@attrs.frozen
class PerGroupFp8Activations:
    """Each GEMM input quantized per row and 128-column group at run time (block-scaled FP8 weights)."""


Fp8Inputs = Fp8Activations | PerGroupFp8Activations | None
"""How a forward quantizes its GEMM inputs: not at all (16-bit weights), or one of the FP8 schemes."""


def quantize_hidden(x: torch.Tensor, fp8: Fp8Inputs) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The first GEMM's input and the scales of its rows (none for 16-bit weights)."""
    if fp8 is None:
        return x, None
    if isinstance(fp8, PerGroupFp8Activations):
        return quantize_fp8_groups(x)
    return quantize_fp8_rows(x, fp8.w13_input_scale.value if isinstance(fp8, StaticFp8Activations) else None)


def quantize_gated(
    inter: torch.Tensor, fp8: Fp8Inputs, config: MoeRunnerConfig, topk_ids: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The second GEMM's input and its scales: with static scales the first GEMM already wrote E4M3; dynamic ones
    quantize only this rank's (token, slot) rows."""
    if fp8 is None:
        return inter, None
    if isinstance(fp8, StaticFp8Activations):
        return inter, fp8.w2_input_scale.value
    local = LocalPairs(topk_ids.reshape(-1), config.local_expert_offset, config.num_local_experts)
    if isinstance(fp8, PerGroupFp8Activations):
        return quantize_fp8_groups(inter, local)
    return quantize_fp8_rows(inter, None, local)


def fused_moe(
    config: MoeRunnerConfig, dispatch: DispatchOutput, w13: Gemm, w2: Gemm, fp8: Fp8Inputs = None
) -> torch.Tensor:
    """Sort, ``act(x @ w13.T)``, ``@ w2.T`` times the top-k weights, and the combine.

    With ``fp8`` (W8A8) each GEMM input is quantized first: statically (the
    first GEMM writes the gated activation in E4M3), per row, or per row and
    128-column group.
    """
    hidden = dispatch.hidden_states
    ids, weights = dispatch.topk.topk_ids, dispatch.topk.topk_weights.contiguous()
    tokens, top_k = ids.shape
    sorted_tokens = sort_tokens(ids, config.num_local_experts, config.local_expert_offset, w13.config.block_m)
    epilogue = Epilogue.of(config)
    static = fp8 if isinstance(fp8, StaticFp8Activations) else None
    x, x_scales = quantize_hidden(hidden.contiguous(), fp8)
    inter_dtype = torch.float8_e4m3fn if static is not None else hidden.dtype
    inter = torch.empty((tokens * top_k, w13.n), dtype=inter_dtype, device=hidden.device)
    out_scale = None if static is None else static.w2_input_scale.value
    launch(x, w13, inter, weights, sorted_tokens, top_k, True, epilogue, x_scales, out_scale)
    inter, inter_scales = quantize_gated(inter, fp8, config, ids)
    down = torch.empty((tokens * top_k, w2.n), dtype=hidden.dtype, device=hidden.device)
    launch(inter, w2, down, weights, sorted_tokens, top_k, False, epilogue, inter_scales)
    out = torch.empty_like(hidden, memory_format=torch.contiguous_format)
    grid = (tokens, cdiv(w2.n, COMBINE_BLOCK))
    combine_kernel[grid](
        down, ids, out, w2.n, top_k, config.local_expert_offset, config.num_local_experts,
        config.routed_scaling_factor, down.stride(0), out.stride(0), BLOCK_H=COMBINE_BLOCK,
    )
    return out


def _configs(config: MoeRunnerConfig, dispatch: DispatchOutput, fmt: str) -> tuple[KernelConfig, KernelConfig]:
    hidden = dispatch.hidden_states
    return choose(
        _device_name(hidden.device), int(hidden.shape[0]), config.top_k, config.num_local_experts,
        config.hidden_size, config.intermediate_size_per_partition, fmt, interpreted(),
    )


def dense_gemms(quant_info: TritonDenseWeights, w13: KernelConfig, w2: KernelConfig) -> tuple[Gemm, Gemm]:
    """The two GEMM launches of dense weights (with their biases, if any) under the given block sizes."""
    inter, hidden = quant_info.intermediate_size, quant_info.hidden_size
    biases = quant_info.biases
    w13_bias, w2_bias = (None, None) if biases is None else (biases.w13, biases.w2)
    return (
        Gemm(quant_info.w13, None, None, inter, hidden, w13, bias=w13_bias),
        Gemm(quant_info.w2, None, None, hidden, inter, w2, bias=w2_bias),
    )


def nvfp4_w4a16_gemms(
    quant_info: TritonNvfp4W4A16Weights, w13: KernelConfig, w2: KernelConfig, dequantize: bool = False
) -> tuple[Gemm, Gemm]:
    """The two GEMM launches of NVFP4 W4A16 weights under the given block sizes: fused (decoded per tile) or, with
    ``dequantize``, each on its weights expanded into a 16-bit workspace first."""
    inter, hidden = quant_info.intermediate_size, quant_info.hidden_size
    w13_scales, w2_scales = quant_info.w13_block_scales.data, quant_info.w2_block_scales.data
    return (
        Gemm(quant_info.w13_packed, w13_scales, quant_info.gate_up_dequant, inter, hidden, w13, dequantize=dequantize),
        Gemm(quant_info.w2_packed, w2_scales, quant_info.w2_scales.value, hidden, inter, w2, dequantize=dequantize),
    )


def mxfp4_w4a16_gemms(
    quant_info: TritonMxfp4W4A16Weights, w13: KernelConfig, w2: KernelConfig, dequantize: bool = False
) -> tuple[Gemm, Gemm]:
    """The two GEMM launches of MXFP4 W4A16 weights (with their biases, if any) under the given block sizes: fused
    (decoded per tile) or, with ``dequantize``, each on its weights expanded into a bf16 workspace first."""
    inter, hidden = quant_info.intermediate_size, quant_info.hidden_size
    biases = quant_info.biases
    w13_bias, w2_bias = (None, None) if biases is None else (biases.w13, biases.w2)
    return (
        Gemm(quant_info.w13_packed, quant_info.w13_scales.codes, None, inter, hidden, w13, dequantize=dequantize,
             bias=w13_bias),
        Gemm(quant_info.w2_packed, quant_info.w2_scales.codes, None, hidden, inter, w2, dequantize=dequantize,
             bias=w2_bias),
    )


def fp8_gemms(quant_info: TritonFp8Weights, w13: KernelConfig, w2: KernelConfig) -> tuple[Gemm, Gemm]:
    """The two GEMM launches of FP8 weights under the given block sizes."""
    inter, hidden = quant_info.intermediate_size, quant_info.hidden_size
    promote = quant_info.accumulation is Fp8Accumulation.FLOAT32_EVERY_TILE
    return (
        Gemm(quant_info.w13, None, quant_info.w13_scales.value, inter, hidden, w13, promote),
        Gemm(quant_info.w2, None, quant_info.w2_scales.value, hidden, inter, w2, promote),
    )


def fp8_block_gemms(quant_info: TritonFp8BlockWeights, w13: KernelConfig, w2: KernelConfig) -> tuple[Gemm, Gemm]:
    """The two GEMM launches of block-scaled FP8 weights under the given block sizes."""
    inter, hidden = quant_info.intermediate_size, quant_info.hidden_size
    return (
        Gemm(quant_info.w13, None, quant_info.w13_scales.value, inter, hidden, w13),
        Gemm(quant_info.w2, None, quant_info.w2_scales.value, hidden, inter, w2),
    )


def check_dense_layer(config: MoeRunnerConfig, quant_info: TritonDenseWeights) -> None:
    """``ValueError`` unless the weights' halves and biases are the config's (metadata only)."""
    if quant_info.gated != config.activation.gated:
        rows = 2 * config.intermediate_size_per_partition if config.activation.gated else config.intermediate_size_per_partition
        raise ValueError(
            f"quant_info.w13: expected {rows} rows for {config.activation.value}, got {int(quant_info.w13.shape[1])}"
        )
    check_biases(config, quant_info.biases)


def check_biases(config: MoeRunnerConfig, biases: ExpertBiases | None) -> None:
    """``ValueError`` unless the weights carry biases exactly where the config says so."""
    if (biases is not None) != config.expert_biases:
        carried = "some" if biases is not None else "none"
        raise ValueError(f"quant_info: the config says expert_biases={config.expert_biases}, the weights carry {carried}")


def check_gated_layer(config: MoeRunnerConfig) -> None:
    """``ValueError`` unless ``config`` is a gated layer without biases: quantized weights hold gate and up halves
    and no biases."""
    if not config.activation.gated:
        raise ValueError(f"config.activation: these weights are gated (w13 [E, 2I, H]), not {config.activation.value}")
    if config.expert_biases:
        raise ValueError("config.expert_biases: these weights hold no expert biases")


@final
@attrs.frozen
class TritonDenseRunner:
    """bf16/fp16 experts through the fused Triton kernels."""

    config: MoeRunnerConfig

    def run(self, dispatch: DispatchOutput, quant_info: TritonDenseWeights, /) -> torch.Tensor:
        """The ``[T, H]`` MoE output in the activations' dtype."""
        check_run_inputs(self.config, dispatch, quant_info, (DispatchFormat.STANDARD,))
        check_dense_layer(self.config, quant_info)
        fmt = "bf16" if quant_info.w13.dtype == torch.bfloat16 else "fp16"
        return fused_moe(self.config, dispatch, *dense_gemms(quant_info, *_configs(self.config, dispatch, fmt)))


@final
@attrs.frozen
class TritonNvfp4W4A16Runner:
    """NVFP4 weights with bf16/fp16 activations (W4A16): dequantized inside the fused Triton kernels at decode, into a
    16-bit workspace for the 16-bit kernels from :func:`~.configs.nvfp4_dequantizes`' token count on."""

    config: MoeRunnerConfig

    def run(self, dispatch: DispatchOutput, quant_info: TritonNvfp4W4A16Weights, /) -> torch.Tensor:
        """The ``[T, H]`` MoE output in the activations' dtype."""
        check_run_inputs(self.config, dispatch, quant_info, (DispatchFormat.STANDARD,))
        check_gated_layer(self.config)
        hidden, config = dispatch.hidden_states, self.config
        if nvfp4_dequantizes(
            _device_name(hidden.device), int(hidden.shape[0]), config.top_k, config.num_local_experts,
            config.hidden_size, config.intermediate_size_per_partition, interpreted(),
        ):
            fmt = "bf16" if hidden.dtype == torch.bfloat16 else "fp16"
            gemms = nvfp4_w4a16_gemms(quant_info, *_configs(self.config, dispatch, fmt), dequantize=True)
        else:
            gemms = nvfp4_w4a16_gemms(quant_info, *_configs(self.config, dispatch, "nvfp4"))
        return fused_moe(self.config, dispatch, *gemms)


@final
@attrs.frozen
class TritonMxfp4W4A16Runner:
    """MXFP4 weights (E8M0 scales per 32, gpt-oss's biases) with bf16/fp16 activations (W4A16): decoded inside the
    fused Triton kernels, into a bf16 workspace for the 16-bit kernels from :func:`~.configs.mxfp4_dequantizes`'
    token count on."""

    config: MoeRunnerConfig

    def run(self, dispatch: DispatchOutput, quant_info: TritonMxfp4W4A16Weights, /) -> torch.Tensor:
        """The ``[T, H]`` MoE output in the activations' dtype."""
        check_run_inputs(self.config, dispatch, quant_info, (DispatchFormat.STANDARD,))
        config = self.config
        if not config.activation.gated:
            raise ValueError(f"config.activation: these weights are gated (w13 [E, 2I, H]), not {config.activation.value}")
        check_biases(config, quant_info.biases)
        hidden = dispatch.hidden_states
        if mxfp4_dequantizes(
            _device_name(hidden.device), int(hidden.shape[0]), config.top_k, config.num_local_experts,
            config.hidden_size, config.intermediate_size_per_partition, interpreted(),
        ):
            gemms = mxfp4_w4a16_gemms(quant_info, *_configs(config, dispatch, "bf16"), dequantize=True)
        else:
            gemms = mxfp4_w4a16_gemms(quant_info, *_configs(config, dispatch, "mxfp4"))
        return fused_moe(config, dispatch, *gemms)


@final
@attrs.frozen
class TritonFp8Runner:
    """FP8 W8A8 experts through the fused Triton kernels: FP8 dot products, bf16/fp16 activations in and out."""

    config: MoeRunnerConfig

    def run(self, dispatch: DispatchOutput, quant_info: TritonFp8Weights, /) -> torch.Tensor:
        """The ``[T, H]`` MoE output in the activations' dtype."""
        check_run_inputs(self.config, dispatch, quant_info, (DispatchFormat.STANDARD,))
        check_gated_layer(self.config)
        gemms = fp8_gemms(quant_info, *_configs(self.config, dispatch, "fp8"))
        return fused_moe(self.config, dispatch, *gemms, fp8=quant_info.activations)


@final
@attrs.frozen
class TritonFp8BlockRunner:
    """Block-scaled FP8 experts (128x128 weight blocks, 1x128 activation groups) through the fused Triton kernels."""

    config: MoeRunnerConfig

    def run(self, dispatch: DispatchOutput, quant_info: TritonFp8BlockWeights, /) -> torch.Tensor:
        """The ``[T, H]`` MoE output in the activations' dtype."""
        check_run_inputs(self.config, dispatch, quant_info, (DispatchFormat.STANDARD,))
        check_gated_layer(self.config)
        gemms = fp8_block_gemms(quant_info, *_configs(self.config, dispatch, "fp8-block"))
        return fused_moe(self.config, dispatch, *gemms, fp8=PerGroupFp8Activations())
