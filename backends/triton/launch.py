"""One forward's launches: the sort, the two grouped GEMMs (with the FP8 inputs' quantization) and the combine.

A GEMM's weights are one typed operand per kind of ``B`` the kernel reads
(:data:`Operand`): 16-bit weights, packed NVFP4 or MXFP4 decoded in the
tile, the same expanded into a 16-bit workspace first, per-channel or
128x128-block FP8. Each operand says which of the kernel's constexpr flags it
sets (:meth:`~DenseOperand.kernel_operands`), so :func:`launch` reads no
dtype or rank to find the format. Nothing here reads a value back to the
host: a forward captures in a CUDA graph.
"""

from __future__ import annotations

import functools
from typing import Protocol, final

import attrs
import torch

from moe_core import Activation, ClampedSwiglu, DispatchOutput, GateClamp, LimitedSwiglu, MoeRunnerConfig
from moe_core.config import ExpertActivation
from moe_core.backends.triton.configs import KernelConfig
from moe_core.backends.triton.kernels import (
    CLAMPED_SWIGLU,
    GELU,
    GELU_TANH,
    INTERPRETED,
    LIMITED_SWIGLU,
    LIMITED_SWIGLU_AFTER_SILU,
    SILU,
    combine_kernel,
    dequantize_mxfp4_kernel,
    dequantize_nvfp4_kernel,
    moe_gemm_kernel,
)
from moe_core.backends.triton.launcher import (
    THROUGH_TRITON, KernelLauncher, Launcher, LaunchSite, current_target, direct_launches,
)
from moe_core.backends.triton.quant_info import Fp8Activations, StaticFp8Activations
from moe_core.backends.triton.quantize import LocalPairs, quantize_fp8_groups, quantize_fp8_rows
from moe_core.backends.triton.replay import Inputs, Replays
from moe_core.backends.triton.scratch import FRESH, KeptScratch, Scratch, forward_scratch
from moe_core.backends.triton.sorting import SortedTokens, cdiv, next_power_of_2, sort_tokens

COMBINE_BLOCK = 1024
"""Hidden columns per combine program."""

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
    block_r = 64 if INTERPRETED else DEQUANTIZE_ROWS
    block_c = min(DEQUANTIZE_BYTES, max(8, next_power_of_2(packed_cols)))
    dequantize_nvfp4_kernel[(cdiv(experts * rows, block_r), cdiv(packed_cols, block_c))](
        flat, scales, out, experts * rows, packed_cols, flat.stride(0), scales.stride(0), out.stride(0),
        PTX=not INTERPRETED, BLOCK_R=block_r, BLOCK_C=block_c,
    )
    return out.view(experts, rows, 2 * packed_cols)


def dequantize_mxfp4(packed: torch.Tensor, exponents: torch.Tensor, dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    """Packed MXFP4 ``[E, rows, cols / 2]`` times its E8M0 scales (uint8 exponents ``[E, rows, cols / 32]``, at most
    240) as ``[E, rows, cols]`` of ``dtype`` (bf16: exact wherever the product is a bf16 number; for gpt-oss's
    w13, 32 x 5760 x 2880, a 1.1 GB workspace, taken in turn with w2's)."""
    experts, rows, packed_cols = (int(d) for d in packed.shape)
    flat, scales = packed.reshape(experts * rows, packed_cols), exponents.reshape(experts * rows, packed_cols // 16)
    out = torch.empty((experts * rows, 2 * packed_cols), dtype=dtype, device=packed.device)
    block_r = 64 if INTERPRETED else DEQUANTIZE_ROWS
    block_c = min(DEQUANTIZE_BYTES, max(16, next_power_of_2(packed_cols)))
    dequantize_mxfp4_kernel[(cdiv(experts * rows, block_r), cdiv(packed_cols, block_c))](
        flat, scales, out, experts * rows, packed_cols, flat.stride(0), scales.stride(0), out.stride(0),
        PTX=not INTERPRETED, BLOCK_R=block_r, BLOCK_C=block_c,
    )
    return out.view(experts, rows, 2 * packed_cols)


@final
@attrs.frozen(eq=False, kw_only=True)
class KernelOperands:
    """What one GEMM launch hands :func:`~.kernels.moe_gemm_kernel` for its ``B``: the tensors and the constexpr
    flags that say how to read them (see the kernels' module docstring)."""

    b: torch.Tensor
    b_scales: torch.Tensor | None = None
    """NVFP4's E4M3 block scales or MXFP4's E8M0 exponents, read per K block inside the tile."""
    dequant: torch.Tensor | None = None
    """Factors on the accumulator: each half's per-expert global scale (``[E]`` or ``[E, 2]``), FP8's per-channel
    ``[E, N]`` or per-block ``[E, N / 128, K / 128]`` scales."""
    nvfp4: bool = False
    mxfp4: bool = False
    expert_scales: bool = False
    fp8: bool = False
    fp8_blocks: bool = False
    promote: bool = True

    @property
    def takes_fp8_inputs(self) -> bool:
        """True for FP8 weights: the GEMM's input rows are E4M3 with their scales."""
        return self.fp8 or self.fp8_blocks

    @functools.cached_property
    def arguments(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, int, int, int, int, int, int]:
        """The kernel's ``b``, ``b_scales`` and ``dequant`` pointers (``b`` where there is none: never read) and
        their strides, worked out once per operand."""
        b, scales, dequant = self.b, self.b_scales, self.dequant
        stride_se, stride_sn = (0, 0) if scales is None else (scales.stride(0), scales.stride(1))
        stride_de, stride_dn = (0, 0) if dequant is None else (1, 0) if dequant.dim() == 1 else (dequant.stride(0), dequant.stride(1))
        return (
            b, b if scales is None else scales, b if dequant is None else dequant, b.stride(0), b.stride(1),
            stride_se, stride_sn, stride_de, stride_dn,
        )


class Operand(Protocol):
    """A GEMM's weights ``B`` of one kind, ready for a launch."""

    def kernel_operands(self, dtype: torch.dtype) -> KernelOperands:
        """The launch's ``B`` for activations of ``dtype`` (a workspace operand expands its weights here, once per
        launch)."""
        ...


class SameEveryLaunch:
    """An :class:`Operand` whose kernel operands do not depend on the launch: made once (:attr:`operands`), then the
    same object on every launch, its :attr:`KernelOperands.arguments` worked out once too."""

    __slots__ = ()

    @property
    def operands(self) -> KernelOperands:
        """The kernel operands (each subclass makes them, once)."""
        raise NotImplementedError

    def kernel_operands(self, dtype: torch.dtype) -> KernelOperands:
        """:attr:`operands`, whatever the activations' dtype."""
        return self.operands


@final
@attrs.frozen(eq=False)
class DenseOperand(SameEveryLaunch):
    """bf16/fp16 ``B [E, N, K]``."""

    weights: torch.Tensor

    @functools.cached_property
    def operands(self) -> KernelOperands:
        """The weights as they are."""
        return KernelOperands(b=self.weights)


@final
@attrs.frozen(eq=False)
class Nvfp4Operand(SameEveryLaunch):
    """Packed NVFP4 ``B [E, N, K / 2]`` decoded in the tile: E4M3 block scales ``[E, N, K / 16]``, and each half's
    per-expert dequantize-side global scale on the accumulator (``[E, 2]`` gate and up, or ``[E]``)."""

    packed: torch.Tensor
    block_scales: torch.Tensor
    global_scales: torch.Tensor

    @functools.cached_property
    def operands(self) -> KernelOperands:
        """The codes, their block scales and the global scales."""
        return KernelOperands(b=self.packed, b_scales=self.block_scales, dequant=self.global_scales, nvfp4=True)


@final
@attrs.frozen(eq=False)
class Nvfp4WorkspaceOperand:
    """``codes``' weights expanded into a 16-bit workspace of the activations' dtype first (:func:`dequantize_nvfp4`),
    then read as 16-bit weights with the global scales on the accumulator (prefill)."""

    codes: Nvfp4Operand

    def kernel_operands(self, dtype: torch.dtype) -> KernelOperands:
        """The workspace and the global scales."""
        workspace = dequantize_nvfp4(self.codes.packed, self.codes.block_scales, dtype)
        return KernelOperands(b=workspace, dequant=self.codes.global_scales, expert_scales=True)


@final
@attrs.frozen(eq=False)
class Mxfp4Operand(SameEveryLaunch):
    """Packed MXFP4 ``B [E, N, K / 2]`` decoded in the tile with its E8M0 exponents ``[E, N, K / 32]`` (uint8),
    no global scale; the dot products are bf16."""

    packed: torch.Tensor
    exponents: torch.Tensor

    @functools.cached_property
    def operands(self) -> KernelOperands:
        """The codes and their exponents."""
        return KernelOperands(b=self.packed, b_scales=self.exponents, mxfp4=True)


@final
@attrs.frozen(eq=False)
class Mxfp4WorkspaceOperand:
    """``codes``' weights expanded into a bf16 workspace first (:func:`dequantize_mxfp4`: bf16 whatever the
    activations' dtype, as the fused tile's dot products), then read as 16-bit weights (prefill)."""

    codes: Mxfp4Operand

    def kernel_operands(self, dtype: torch.dtype) -> KernelOperands:
        """The bf16 workspace."""
        return KernelOperands(b=dequantize_mxfp4(self.codes.packed, self.codes.exponents))


@final
@attrs.frozen(eq=False)
class Fp8ChannelOperand(SameEveryLaunch):
    """E4M3 ``B [E, N, K]`` with per-channel dequantize-side scales ``[E, N]`` (per-tensor ones repeated on their
    rows); ``promote`` adds the FP8 MMAs into the float32 accumulator every K tile."""

    codes: torch.Tensor
    scales: torch.Tensor
    promote: bool = True

    @functools.cached_property
    def operands(self) -> KernelOperands:
        """The codes and their row scales."""
        return KernelOperands(b=self.codes, dequant=self.scales, fp8=True, promote=self.promote)


@final
@attrs.frozen(eq=False)
class Fp8BlockOperand(SameEveryLaunch):
    """E4M3 ``B [E, N, K]`` with one dequantize-side scale per 128x128 block, ``[E, N / 128, K / 128]``."""

    codes: torch.Tensor
    scales: torch.Tensor

    @functools.cached_property
    def operands(self) -> KernelOperands:
        """The codes and their block scales."""
        return KernelOperands(b=self.codes, dequant=self.scales, fp8_blocks=True)


@final
@attrs.frozen(eq=False)
class Gemm:
    """One grouped GEMM launch: its weights (an :class:`Operand`), the output columns ``n``, the reduction ``k``,
    the block sizes and each expert's optional bias."""

    weights: Operand
    n: int
    k: int
    config: KernelConfig
    bias: torch.Tensor | None = None
    """Each expert's bias ``[E, rows of B]``, added to the accumulator in the epilogue."""


@final
@attrs.frozen
class Epilogue:
    """The first GEMM's activation as the kernel's constexprs: ``ACTIVATION`` (a gated one's code), ``RELU2``
    (non-gated ``relu(h) ** 2``: no up half), and the clamped SwiGLU's ``ALPHA`` and ``LIMIT`` (the limited
    SwiGLU's ``LIMIT``; 0 otherwise, so the other activations compile as one variant each)."""

    activation: int
    relu2: bool = False
    alpha: float = 0.0
    limit: float = 0.0

    @classmethod
    def of(cls, config: MoeRunnerConfig) -> Epilogue:
        """The epilogue of ``config``'s activation."""
        return _epilogue(config.activation)


@functools.lru_cache(maxsize=64)
def _epilogue(activation: ExpertActivation) -> Epilogue:
    """:meth:`Epilogue.of` an activation, worked out once per activation (every forward asks)."""
    if isinstance(activation, ClampedSwiglu):
        return Epilogue(CLAMPED_SWIGLU, alpha=float(activation.alpha), limit=float(activation.limit))
    if isinstance(activation, LimitedSwiglu):
        before = activation.gate_clamp is GateClamp.BEFORE_SILU
        return Epilogue(LIMITED_SWIGLU if before else LIMITED_SWIGLU_AFTER_SILU, limit=float(activation.limit))
    if activation is Activation.RELU2:
        return Epilogue(SILU, relu2=True)
    codes = {Activation.SILU_GATED: SILU, Activation.GELU_GATED: GELU, Activation.GELU_TANH_GATED: GELU_TANH}
    return Epilogue(codes[activation])


def launch(
    a: torch.Tensor, gemm: Gemm, out: torch.Tensor, topk_weights: torch.Tensor, sorted_tokens: SortedTokens,
    top_k: int, first: bool, epilogue: Epilogue, a_scales: torch.Tensor | None = None,
    out_scale: torch.Tensor | None = None, launcher: KernelLauncher = THROUGH_TRITON,
) -> None:
    """Launch the grouped GEMM: the ``first`` (its rows tokens, ``epilogue``'s activation: gated, or ReLU^2 of a
    non-gated ``B``) or the second (weighted by the top-k weights); ``gemm.bias`` added to the accumulator.

    FP8 weights: ``a_scales`` dequantizes ``a``'s rows (``[rows]``, or ``[1]``
    for one static scale; with block-scaled ``B``, ``[rows, K / 128]``);
    ``out_scale`` quantizes the gated output to E4M3 (``out`` must then be E4M3).
    """
    ops = gemm.weights.kernel_operands(a.dtype)
    if ops.takes_fp8_inputs and a_scales is None:
        raise ValueError("launch: FP8 weights need the scales of their FP8 input rows")
    b, scales, dequant, stride_be, stride_bn, stride_se, stride_sn, stride_de, stride_dn = ops.arguments
    bias = gemm.bias
    args = (
        a, b, scales, dequant,
        out, topk_weights, sorted_tokens.sorted_ids, sorted_tokens.expert_ids, sorted_tokens.num_rows,
        topk_weights if a_scales is None else a_scales, topk_weights if out_scale is None else out_scale,
        gemm.n, gemm.k, topk_weights.numel(), top_k, sorted_tokens.max_blocks,
        a.stride(0), stride_be, stride_bn, stride_se, stride_sn, stride_de, stride_dn,
        a_scales.stride(0) if a_scales is not None and a_scales.shape[0] > 1 else 0, out.stride(0),
        b if bias is None else bias, 0 if bias is None else bias.stride(0),
    )

    def statics() -> tuple[tuple[int], dict[str, object]]:
        config = gemm.config
        gated, relu2 = first and not epilogue.relu2, first and epilogue.relu2
        gate = epilogue if gated else Epilogue(SILU)  # only a gated epilogue reads them: one variant of the others
        grid = (sorted_tokens.max_blocks * cdiv(gemm.n, config.block_n),)
        return grid, dict(
            GATED=gated, NVFP4=ops.nvfp4, EXPERT_SCALES=ops.expert_scales,
            FP8=ops.fp8, FP8_BLOCKS=ops.fp8_blocks, OUT_FP8=out_scale is not None,
            PROMOTE=ops.promote,
            ACTIVATION=gate.activation,
            UPCAST=INTERPRETED,
            BIAS=bias is not None, RELU2=relu2, ALPHA=gate.alpha, LIMIT=gate.limit, MXFP4=ops.mxfp4,
            EVEN_K=gemm.k % config.block_k == 0, BLOCK_M=config.block_m, BLOCK_N=config.block_n,
            BLOCK_K=config.block_k, GROUP_M=config.group_m, num_warps=config.num_warps, num_stages=config.num_stages,
        )

    launcher("w13" if first else "w2", moe_gemm_kernel, args, statics)


@final
@attrs.frozen
class PerGroupFp8Activations:
    """Each GEMM input quantized per row and 128-column group at run time (block-scaled FP8 weights)."""


Fp8Inputs = Fp8Activations | PerGroupFp8Activations | None
"""How a forward quantizes its GEMM inputs: not at all (16-bit and W4A16 weights), or one of the FP8 schemes."""


def quantize_hidden(
    x: torch.Tensor, fp8: Fp8Inputs, scratch: Scratch = FRESH, launcher: KernelLauncher = THROUGH_TRITON
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The first GEMM's input and the scales of its rows (none for 16-bit weights)."""
    if fp8 is None:
        return x, None
    if isinstance(fp8, PerGroupFp8Activations):
        return quantize_fp8_groups(x, scratch=scratch, launcher=launcher)
    static = fp8.w13_input_scale.value if isinstance(fp8, StaticFp8Activations) else None
    return quantize_fp8_rows(x, static, scratch=scratch, launcher=launcher)


def quantize_gated(
    inter: torch.Tensor, fp8: Fp8Inputs, config: MoeRunnerConfig, topk_ids: torch.Tensor, scratch: Scratch = FRESH,
    launcher: KernelLauncher = THROUGH_TRITON,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The second GEMM's input and its scales: with static scales the first GEMM already wrote E4M3; dynamic ones
    quantize only this rank's (token, slot) rows."""
    if fp8 is None:
        return inter, None
    if isinstance(fp8, StaticFp8Activations):
        return inter, fp8.w2_input_scale.value
    local = LocalPairs(topk_ids.reshape(-1), config.local_expert_offset, config.num_local_experts)
    if isinstance(fp8, PerGroupFp8Activations):
        return quantize_fp8_groups(inter, local, scratch, "inter", launcher)
    return quantize_fp8_rows(inter, None, local, scratch, "inter", launcher)


def fused_moe(
    config: MoeRunnerConfig, dispatch: DispatchOutput, w13: Gemm, w2: Gemm, fp8: Fp8Inputs = None,
    sites: dict[str, LaunchSite] | None = None, replays: Replays | None = None,
) -> torch.Tensor:
    """Sort, ``act(x @ w13.T)``, ``@ w2.T`` times the top-k weights, and the combine.

    With ``fp8`` (W8A8) each GEMM input is quantized first: statically (the
    first GEMM writes the gated activation in E4M3), per row, or per row and
    128-column group. ``sites``: a memo's launch sites for this token count,
    dtypes and weights (:mod:`.launcher`), which launch their kept binaries
    where the caller's tensors allow; the forward's own buffers are then
    kept between decode forwards (:mod:`.scratch`), and with ``replays`` (the
    same memo entry's) a decode forward is recorded once and its launches
    repeated after that (:mod:`.replay`).
    """
    hidden = dispatch.hidden_states.contiguous()
    inputs = (hidden, dispatch.topk.topk_ids.contiguous(), dispatch.topk.topk_weights.contiguous())  # read flat
    if sites is None:
        return _forward(config, inputs, w13, w2, fp8, THROUGH_TRITON, FRESH)
    # a one-row view's stride is the caller's: the kernels' binaries are specialized on it
    standard = hidden.stride(0) == hidden.shape[1]
    target = current_target()
    launcher = Launcher(sites, standard and direct_launches(inputs), target)
    buffers = forward_scratch(inputs[1].numel(), target[1], hidden.device)
    if replays is None or not standard or not isinstance(buffers, KeptScratch):
        return _forward(config, inputs, w13, w2, fp8, launcher, buffers)
    kept = buffers
    return replays.run(lambda given, recording: _forward(config, given, w13, w2, fp8, recording, kept), inputs, launcher, kept)


def _forward(
    config: MoeRunnerConfig, inputs: Inputs, w13: Gemm, w2: Gemm, fp8: Fp8Inputs, launcher: KernelLauncher,
    buffers: Scratch,
) -> torch.Tensor:
    """:func:`fused_moe` of contiguous inputs, every kernel launched through ``launcher`` (what a replay records),
    its own buffers from ``buffers``."""
    hidden, ids, weights = inputs
    tokens, top_k = ids.shape
    device = hidden.device
    sorted_tokens = sort_tokens(
        ids, config.num_local_experts, config.local_expert_offset, w13.config.block_m, launcher, buffers
    )
    epilogue = Epilogue.of(config)
    static = fp8 if isinstance(fp8, StaticFp8Activations) else None
    x, x_scales = quantize_hidden(hidden, fp8, buffers, launcher)
    inter_dtype = torch.float8_e4m3fn if static is not None else hidden.dtype
    inter = buffers("inter", (tokens * top_k, w13.n), inter_dtype, device)
    out_scale = None if static is None else static.w2_input_scale.value
    launch(x, w13, inter, weights, sorted_tokens, top_k, True, epilogue, x_scales, out_scale, launcher)
    inter, inter_scales = quantize_gated(inter, fp8, config, ids, buffers, launcher)
    down = buffers("down", (tokens * top_k, w2.n), hidden.dtype, device)
    launch(inter, w2, down, weights, sorted_tokens, top_k, False, epilogue, inter_scales, launcher=launcher)
    out = torch.empty_like(hidden, memory_format=torch.contiguous_format)
    launcher(
        "combine", combine_kernel,
        (
            down, ids, out, w2.n, top_k, config.local_expert_offset, config.num_local_experts,
            config.routed_scaling_factor, down.stride(0), out.stride(0),
        ),
        lambda: ((tokens, cdiv(w2.n, COMBINE_BLOCK)), dict(BLOCK_H=COMBINE_BLOCK)),
    )
    return out
