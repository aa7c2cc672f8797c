"""The Triton kernels (Triton's language, not typed Python): token sorting, the grouped GEMM, the combine.

Only this module and :mod:`.launcher` (which launches compiled binaries) import Triton; :mod:`.sorting` and :mod:`.runner` launch
these kernels. mypy checks it without the typed-definition rules
(``mypy.ini``): Triton's language has no Python types.

One kernel serves both GEMMs and both weight formats, its variant chosen by
constexpr flags:

- ``GATED`` (the first GEMM): each program computes the gate and the up tile
  of the same columns (``w13`` rows ``n`` and ``I + n``) and writes
  ``act(gate) * up``; the rows of ``A`` are tokens (``pair // top_k``).
- otherwise (the second GEMM): ``A``'s rows are the (token, slot) pairs of
  the first GEMM's output, and each row is scaled by its top-k weight.
- ``NVFP4``: ``B`` is packed E2M1 (two codes a byte along K) with one E4M3
  scale per 16 elements, dequantized in registers; each half's per-expert
  dequantize-side global scale multiplies the accumulator. Otherwise ``B`` is
  bf16/fp16 or FP8 E4M3 ``[E, N, K]``.
- ``MXFP4``: ``B`` is packed E2M1 as for ``NVFP4`` with one E8M0 exponent
  (uint8 ``e``: ``2 ** (e - 127)``) per 32 elements and no global scale;
  the decoded weights and ``A`` meet in bf16 dot products whatever ``A``'s
  dtype (fp16 activations are rounded to bf16, as the bf16 weights of the
  MXFP4 -> dense degradation have them: an MXFP4 product can leave fp16's
  range). Exponents above 240 are refused when the weights are converted
  (the decode's ``2 ** (e - 113)`` factor would overflow float32).
- ``EXPERT_SCALES``: 16-bit ``B`` with each half's per-expert factor on the
  accumulator, as for ``NVFP4``: NVFP4 weights that
  :func:`dequantize_nvfp4_kernel` expanded into a workspace (prefill, where
  every row block would decode its weight tiles again).
- ``FP8``: ``A`` and ``B`` are E4M3 and the dot products FP8; the
  accumulator is multiplied by ``A``'s row scale (per token, or one static
  scale with stride 0) and ``B``'s per-channel scale (``dequant [E, N]``,
  the up half at column ``I + n``). ``PROMOTE``: the FP8 MMAs add into the
  float32 accumulator every K tile (``max_num_imprecise_acc``); otherwise
  Triton's SM90 default keeps the whole K in the tensor cores' narrower
  accumulator (seen on the H200: 1.2-1.6e-2 relative error at K=4096-7168
  against 3.4-3.6e-3 promoted, and 1.2x the prefill throughput).
- ``FP8_BLOCKS``: ``B`` has one scale per 128x128 block (``dequant
  [E, N / 128, K / 128]``) and ``A`` one per row and 128-column group
  (``a_scales [rows, K / 128]``); each K tile (a divisor of 128) is a fresh
  dot product scaled by both and added in float32 (where ``BLOCK_N`` divides
  128, one factor per row: ``A``'s scale times the tile's one ``B`` scale). ``OUT_FP8``: the gated output is
  quantized to E4M3 with one static scale (the second GEMM's input scale)
  before it is stored.
- ``RELU2`` (the first GEMM of a non-gated layer, ``GATED`` off): ``B`` is
  ``w13 [E, I, H]`` with no up half, the rows of ``A`` are tokens as for
  ``GATED``, and the epilogue writes ``relu(acc) ** 2``.
- ``BIAS``: each expert's bias row (``bias [E, rows of B]``, the up half's
  at column ``N + n``) is added to the dequantized accumulator, before the
  activation (first GEMM) or the top-k weight (second).

With ``BIAS``, ``RELU2``, ``MXFP4`` off and ``ACTIVATION`` below ``CLAMPED_SWIGLU``, every
flag's code is what it was before they existed (all are constexpr).

Every program reads its block's expert and rows from :mod:`.sorting`'s
output and returns at once past the rows in use, so the launch grid is a
static bound and no size is read back to the host. ``UPCAST`` computes the
dot products in float32 (Triton's CPU interpreter multiplies bf16 wrongly).
"""

from __future__ import annotations

import contextlib
import threading
from contextlib import AbstractContextManager

import triton
import triton.language as tl

from moe_core.backends.triton import interpreted

INTERPRETED = interpreted()
"""Whether Triton's CPU interpreter runs these kernels. ``@triton.jit`` chooses when this module is imported, so the
launches read this, not the environment, on every forward."""

_INTERPRETER = threading.RLock()


def one_at_a_time() -> AbstractContextManager[object]:
    """Held around a forward's launches: under the interpreter, one thread's at a time (Triton's interpreter patches
    ``triton.language`` for each launch, process-wide, so two threads' launches broke each other with Triton's own
    ``InterpreterError``: adversarial pass 10, c03); compiled kernels launch from any thread, so nothing is held."""
    return _INTERPRETER if INTERPRETED else contextlib.nullcontext()

SILU = 0
GELU = 1
GELU_TANH = 2
CLAMPED_SWIGLU = 3
LIMITED_SWIGLU = 4
LIMITED_SWIGLU_AFTER_SILU = 5
"""The gated activations the first GEMM's epilogue computes (``ACTIVATION``): SiLU, erf-GELU, tanh-GELU,
gpt-oss's clamped SwiGLU (its ``alpha`` and ``limit`` the constexprs ``ALPHA`` and ``LIMIT``), and SiLU with limits
(``LIMIT``; the gate clamped before its SiLU, or after)."""


@triton.jit
def count_kernel(ids_ptr, counts_ptr, numel, offset, num_local, CHUNK: tl.constexpr, BINS: tl.constexpr):
    """Add each program's per-expert histogram of ``CHUNK`` local ids into ``counts``."""
    start = tl.program_id(0) * CHUNK
    idx = start + tl.arange(0, CHUNK)
    ids = tl.load(ids_ptr + idx, mask=idx < numel, other=-1) - offset
    local = (ids >= 0) & (ids < num_local) & (idx < numel)
    counts = tl.histogram(tl.where(local, ids, num_local), BINS)
    bins = tl.arange(0, BINS)
    tl.atomic_add(counts_ptr + bins, counts, mask=bins < num_local)


@triton.jit
def scan_kernel(
    counts_ptr, starts_ptr, expert_ids_ptr, total_ptr, num_local, max_blocks, BLOCK_M: tl.constexpr, BINS: tl.constexpr,
    BLOCKS: tl.constexpr,
):
    """One program: pad the counts to ``BLOCK_M``, their exclusive prefix sums, the total, each block's expert."""
    bins = tl.arange(0, BINS)
    counts = tl.load(counts_ptr + bins, mask=bins < num_local, other=0)
    padded = tl.cdiv(counts, BLOCK_M) * BLOCK_M
    ends = tl.cumsum(padded, axis=0)
    tl.store(starts_ptr + bins, ends - padded, mask=bins < num_local)
    tl.store(total_ptr, tl.sum(padded, axis=0))
    for first in range(0, max_blocks, BLOCKS):
        blocks = first + tl.arange(0, BLOCKS)
        row = blocks * BLOCK_M
        # a block's expert is the number of experts whose padded range ends at or before its first row
        expert = tl.sum(((ends[None, :] <= row[:, None]) & (bins[None, :] < num_local)).to(tl.int32), axis=1)
        expert = tl.where(expert < num_local, expert, -1)
        tl.store(expert_ids_ptr + blocks, expert, mask=blocks < max_blocks)


@triton.jit
def sort_one_program_kernel(
    ids_ptr, cursors_ptr, sorted_ptr, expert_ids_ptr, total_ptr, numel, offset, num_local, max_rows, max_blocks,
    BLOCK_M: tl.constexpr, BINS: tl.constexpr, PAIRS: tl.constexpr, ROWS: tl.constexpr, BLOCKS: tl.constexpr,
):
    """The whole sort in one program, for up to ``PAIRS`` pairs (decode): count, pad, scan, fill, scatter.

    The cursors start at each expert's first row (stored, then a barrier) and
    the scatter takes slots from them with atomics, so nothing needs zeroing
    beforehand: one launch instead of three and three fills.
    """
    idx = tl.arange(0, PAIRS)
    ids = tl.load(ids_ptr + idx, mask=idx < numel, other=-1) - offset
    local = (ids >= 0) & (ids < num_local) & (idx < numel)
    bins = tl.arange(0, BINS)
    counts = tl.where(bins < num_local, tl.histogram(tl.where(local, ids, num_local), BINS), 0)
    padded = tl.cdiv(counts, BLOCK_M) * BLOCK_M
    ends = tl.cumsum(padded, axis=0)
    tl.store(cursors_ptr + bins, ends - padded)
    tl.store(total_ptr, tl.sum(padded, axis=0))
    for first in range(0, max_rows, ROWS):
        rows = first + tl.arange(0, ROWS)
        tl.store(sorted_ptr + rows, tl.full((ROWS,), 0, tl.int32) + numel, mask=rows < max_rows)
    for first in range(0, max_blocks, BLOCKS):
        blocks = first + tl.arange(0, BLOCKS)
        row = blocks * BLOCK_M
        expert = tl.sum(((ends[None, :] <= row[:, None]) & (bins[None, :] < num_local)).to(tl.int32), axis=1)
        tl.store(expert_ids_ptr + blocks, tl.where(expert < num_local, expert, -1), mask=blocks < max_blocks)
    tl.debug_barrier()
    slot = tl.atomic_add(cursors_ptr + tl.where(local, ids, 0), 1, mask=local)
    tl.store(sorted_ptr + slot, idx, mask=local)


@triton.jit
def scatter_kernel(ids_ptr, starts_ptr, cursors_ptr, sorted_ptr, numel, offset, num_local, CHUNK: tl.constexpr):
    """Write each local pair's flat index at its expert's start plus a slot taken with an atomic."""
    idx = tl.program_id(0) * CHUNK + tl.arange(0, CHUNK)
    ids = tl.load(ids_ptr + idx, mask=idx < numel, other=-1) - offset
    local = (ids >= 0) & (ids < num_local) & (idx < numel)
    expert = tl.where(local, ids, 0)
    slot = tl.atomic_add(cursors_ptr + expert, 1, mask=local)
    start = tl.load(starts_ptr + expert, mask=local, other=0)
    tl.store(sorted_ptr + start + slot, idx, mask=local)


@triton.jit
def _e4m3_values(x, scale, ROUND_FIRST: tl.constexpr):
    """``x / scale`` (IEEE division) saturated to +-448, ready for the cast to E4M3 (:func:`_store_e4m3`); NaN and
    infinities stay NaN (torch's cast saturates an infinity to 448): saturated, a non-finite hidden state came out of
    the layer as finite numbers (adversarial pass 18, c10b).

    ``ROUND_FIRST`` (Triton's CPU interpreter, which casts float32 to E4M3
    wrongly where rounding carries into the exponent: triton 3.7.1 turns
    31.27 into 16): round onto the E4M3 grid in float32 first, ties to even
    (3 mantissa bits for normals, steps of 2^-9 below 2^-6), so the cast is exact.
    """
    v = tl.clamp(tl.math.div_rn(x, scale), -448.0, 448.0, propagate_nan=tl.PropagateNan.ALL)
    v = tl.where(tl.abs(x) == float("inf"), float("nan"), v)
    if ROUND_FIRST:
        magnitude = tl.abs(v)
        bits = magnitude.to(tl.uint32, bitcast=True)
        normal = ((bits + 0x7FFFF + ((bits >> 20) & 1)) & 0xFFF00000).to(tl.float32, bitcast=True)
        subnormal = ((magnitude * 512.0 + 12582912.0) - 12582912.0) / 512.0
        magnitude = tl.where(magnitude < 0.015625, subnormal, normal)
        sign = v.to(tl.uint32, bitcast=True) & 0x80000000  # a bit copy: negating a zero gives +0 here
        v = (magnitude.to(tl.uint32, bitcast=True) | sign).to(tl.float32, bitcast=True)
    return v


@triton.jit
def _store_e4m3(q_ptrs, v, mask, ROUND_FIRST: tl.constexpr):
    """Store :func:`_e4m3_values`' ``v`` as E4M3 codes; under ``ROUND_FIRST`` (the interpreter, whose cast turns NaN
    into 384) E4M3's NaN byte is written over each NaN's code."""
    tl.store(q_ptrs, v.to(q_ptrs.dtype.element_ty), mask=mask)
    if ROUND_FIRST:
        tl.store(q_ptrs.to(tl.pointer_type(tl.uint8)), tl.full(v.shape, 0x7F, tl.uint8), mask=mask & (v != v))


@triton.jit
def quantize_rows_kernel(
    x_ptr, q_ptr, scales_ptr, static_ptr, ids_ptr, K, stride_xm, stride_qm, min_scale, offset, num_local,
    DYNAMIC: tl.constexpr, PAIRS: tl.constexpr, ROUND_FIRST: tl.constexpr, BLOCK: tl.constexpr,
):
    """One row of ``x`` to E4M3: with its own scale ``max(amax / 448, min_scale)`` (``DYNAMIC``, written to
    ``scales``) or the one static scale; IEEE division, so the codes equal torch's for the same values.

    ``PAIRS``: the rows are (token, slot) pairs and those routed to another
    rank's experts (``ids - offset`` outside ``[0, num_local)``) are skipped:
    the first GEMM never wrote them.
    """
    row = tl.program_id(0).to(tl.int64)
    if PAIRS:
        expert = tl.load(ids_ptr + row) - offset
        if (expert < 0) | (expert >= num_local):
            return
    x_row, q_row = x_ptr + row * stride_xm, q_ptr + row * stride_qm
    if DYNAMIC:
        amax = tl.zeros((BLOCK,), dtype=tl.float32)
        for start in range(0, K, BLOCK):
            cols = start + tl.arange(0, BLOCK)
            amax = tl.maximum(amax, tl.abs(tl.load(x_row + cols, mask=cols < K, other=0.0).to(tl.float32)))
        scale = tl.maximum(tl.math.div_rn(tl.max(amax, axis=0), 448.0), min_scale)
        tl.store(scales_ptr + row, scale)
    else:
        scale = tl.load(static_ptr)
    for start in range(0, K, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        x = tl.load(x_row + cols, mask=cols < K, other=0.0).to(tl.float32)
        _store_e4m3(q_row + cols, _e4m3_values(x, scale, ROUND_FIRST), cols < K, ROUND_FIRST)


@triton.jit
def quantize_groups_kernel(
    x_ptr, q_ptr, scales_ptr, ids_ptr, stride_xm, stride_qm, stride_sm, min_scale, offset, num_local,
    PAIRS: tl.constexpr, ROUND_FIRST: tl.constexpr, GROUP: tl.constexpr,
):
    """One ``GROUP``-column group of one row of ``x`` to E4M3 with its own scale ``max(amax / 448, min_scale)``,
    written to ``scales [rows, K / GROUP]``; ``PAIRS`` as in :func:`quantize_rows_kernel`."""
    row = tl.program_id(0).to(tl.int64)
    group = tl.program_id(1)
    if PAIRS:
        expert = tl.load(ids_ptr + row) - offset
        if (expert < 0) | (expert >= num_local):
            return
    cols = group * GROUP + tl.arange(0, GROUP)
    x = tl.load(x_ptr + row * stride_xm + cols).to(tl.float32)
    scale = tl.maximum(tl.math.div_rn(tl.max(tl.abs(x), axis=0), 448.0), min_scale)
    tl.store(scales_ptr + row * stride_sm + group, scale)
    _store_e4m3(q_ptr + row * stride_qm + cols, _e4m3_values(x, scale, ROUND_FIRST), tl.full((GROUP,), True, tl.int1), ROUND_FIRST)


@triton.jit
def _e2m1_over_2_14(codes):
    """4-bit E2M1 codes (bit 3 the sign) as float32 values divided by 2^14, from their bits.

    The three magnitude bits moved to fp16's bits 9-11 make the exponent's
    two low bits and the top mantissa bit: an fp16 of value ``2^-14`` times
    the E2M1 value (its ``e = 0`` codes land on fp16's subnormals, exactly);
    the sign moves to bit 15. No table and no branches.
    """
    bits = ((codes & 7).to(tl.uint16) << 9) | ((codes & 8).to(tl.uint16) << 12)
    return bits.to(tl.float16, bitcast=True).to(tl.float32)


@triton.jit
def _nibbles_over_2_14(packed, HIGH: tl.constexpr, PTX: tl.constexpr):
    """:func:`_e2m1_over_2_14` of each byte's low (or ``HIGH``) nibble.

    ``PTX`` (compiled, not the interpreter): the same bits made two bytes at a
    time in 32-bit words, five instructions a pair (a byte permute to put the
    bytes at bits 0 and 16, two shifts, a mask and a three-input logic op).
    Decode is bound by instructions, not by the weight bytes: Triton's per-byte
    arithmetic left 12.4 instructions per weight in the fused tile's loop for
    sm_90, this 7.1 (Mixtral T=1 on the H200: 0.350 -> 0.215 ms).
    """
    if not PTX:
        return _e2m1_over_2_14((packed >> 4) if HIGH else (packed & 15))
    if HIGH:
        bits = tl.inline_asm_elementwise(
            """{
            .reg .b32 t0, t1, m0, m1, s0, s1;
            prmt.b32 t0, $2, 0, 0x4140;
            prmt.b32 t1, $2, 0, 0x4342;
            shl.b32 m0, t0, 5;
            shl.b32 m1, t1, 5;
            shl.b32 s0, t0, 8;
            shl.b32 s1, t1, 8;
            and.b32 m0, m0, 0x0E000E00;
            and.b32 m1, m1, 0x0E000E00;
            lop3.b32 $0, s0, 0x80008000, m0, 0xEA;
            lop3.b32 $1, s1, 0x80008000, m1, 0xEA;
            }""",
            "=r,=r,r", [packed], dtype=tl.float16, is_pure=True, pack=4,
        )
    else:
        bits = tl.inline_asm_elementwise(
            """{
            .reg .b32 t0, t1, m0, m1, s0, s1;
            prmt.b32 t0, $2, 0, 0x4140;
            prmt.b32 t1, $2, 0, 0x4342;
            shl.b32 m0, t0, 9;
            shl.b32 m1, t1, 9;
            shl.b32 s0, t0, 12;
            shl.b32 s1, t1, 12;
            and.b32 m0, m0, 0x0E000E00;
            and.b32 m1, m1, 0x0E000E00;
            lop3.b32 $0, s0, 0x80008000, m0, 0xEA;
            lop3.b32 $1, s1, 0x80008000, m1, 0xEA;
            }""",
            "=r,=r,r", [packed], dtype=tl.float16, is_pure=True, pack=4,
        )
    return bits.to(tl.float32)


@triton.jit
def dequantize_nvfp4_kernel(
    packed_ptr, scales_ptr, out_ptr, rows, packed_cols, stride_pr, stride_sr, stride_or,
    PTX: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr,
):
    """``out [rows, 2 * packed_cols] = code * block scale`` of packed NVFP4 rows, in ``out``'s dtype.

    Exact in bf16 and fp16: an E2M1 value (2 significant bits) times an E4M3
    scale (4) has at most 6 significant bits, and the products span
    ``2^-10 .. 2688``. The global scale is left to the GEMM's accumulator, as
    in the fused kernel, so both paths compute the same products. One program
    per ``BLOCK_R`` rows and ``BLOCK_C`` packed bytes (``2 * BLOCK_C`` values).
    """
    r = (tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)).to(tl.int64)
    c = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    blocks = tl.program_id(1) * (BLOCK_C // 8) + tl.arange(0, BLOCK_C // 8)
    row_ok = (r < rows)[:, None]
    packed_ok = row_ok & (c < packed_cols)[None, :]
    packed = tl.load(packed_ptr + r[:, None] * stride_pr + c[None, :], mask=packed_ok, other=0)
    scales_ok = row_ok & (blocks < packed_cols // 8)[None, :]
    scales = tl.load(scales_ptr + r[:, None] * stride_sr + blocks[None, :], mask=scales_ok, other=0.0).to(tl.float32)
    scales = scales * 16384.0  # 2^14: undoes the decode's 2^-14
    # the low nibble is the even element: (low, high) pairs side by side are the row in order
    values = tl.join(_nibbles_over_2_14(packed, False, PTX), _nibbles_over_2_14(packed, True, PTX))
    values = tl.reshape(values, (BLOCK_R, BLOCK_C // 8, 16)) * scales[:, :, None]
    cols = tl.program_id(1) * 2 * BLOCK_C + tl.arange(0, 2 * BLOCK_C)
    out = tl.reshape(values, (BLOCK_R, 2 * BLOCK_C)).to(out_ptr.dtype.element_ty)
    tl.store(out_ptr + r[:, None] * stride_or + cols[None, :], out, mask=row_ok & (cols < 2 * packed_cols)[None, :])


@triton.jit
def _e8m0_times_2_14(exponents):
    """E8M0 exponents ``e`` (uint8, at most 240) as the float32 ``2 ** (e - 113)``: the block scale ``2 ** (e - 127)``
    times the ``2^14`` that :func:`_nibbles_over_2_14` takes off, from its bits (a normal float32 for every ``e``
    up to 240, exactly)."""
    return ((exponents.to(tl.uint32) + 14) << 23).to(tl.float32, bitcast=True)


@triton.jit
def dequantize_mxfp4_kernel(
    packed_ptr, scales_ptr, out_ptr, rows, packed_cols, stride_pr, stride_sr, stride_or,
    PTX: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr,
):
    """``out [rows, 2 * packed_cols] = code * 2 ** (e - 127)`` of packed MXFP4 rows (one E8M0 exponent per 32
    values), in ``out``'s dtype (bf16: exact wherever the product is a bf16 number, as
    :meth:`~moe_core.Mxfp4MoeWeights.dequantized_bf16`). One program per ``BLOCK_R`` rows and ``BLOCK_C`` packed
    bytes (``BLOCK_C`` a multiple of 16)."""
    r = (tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)).to(tl.int64)
    c = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    blocks = tl.program_id(1) * (BLOCK_C // 16) + tl.arange(0, BLOCK_C // 16)
    row_ok = (r < rows)[:, None]
    packed = tl.load(packed_ptr + r[:, None] * stride_pr + c[None, :], mask=row_ok & (c < packed_cols)[None, :], other=0)
    scales_ok = row_ok & (blocks < packed_cols // 16)[None, :]
    exponents = tl.load(scales_ptr + r[:, None] * stride_sr + blocks[None, :], mask=scales_ok, other=0)
    scales = _e8m0_times_2_14(exponents)
    values = tl.join(_nibbles_over_2_14(packed, False, PTX), _nibbles_over_2_14(packed, True, PTX))
    values = tl.reshape(values, (BLOCK_R, BLOCK_C // 16, 32)) * scales[:, :, None]
    cols = tl.program_id(1) * 2 * BLOCK_C + tl.arange(0, 2 * BLOCK_C)
    out = tl.reshape(values, (BLOCK_R, 2 * BLOCK_C)).to(out_ptr.dtype.element_ty)
    tl.store(out_ptr + r[:, None] * stride_or + cols[None, :], out, mask=row_ok & (cols < 2 * packed_cols)[None, :])


@triton.jit
def _dense_tile(b_ptr, offs_n, offs_k, k_left, stride_bn, EVEN_K: tl.constexpr):
    """A ``[BLOCK_K, BLOCK_N]`` tile of ``B [N, K]`` at rows ``offs_n``."""
    ptrs = b_ptr + offs_n[None, :] * stride_bn + offs_k[:, None]
    if EVEN_K:
        return tl.load(ptrs)
    return tl.load(ptrs, mask=offs_k[:, None] < k_left, other=0.0)


@triton.jit
def _nvfp4_tiles(
    packed_ptr, scales_ptr, offs_n, k_start, K, stride_pn, stride_sn, HALF_K: tl.constexpr, EVEN_K: tl.constexpr,
    PTX: tl.constexpr, dtype
):
    """The even- and odd-K ``[BLOCK_K / 2, BLOCK_N]`` tiles of packed NVFP4 ``B``, times their block scales."""
    bytes_k = k_start // 2 + tl.arange(0, HALF_K)
    blocks = k_start // 16 + tl.arange(0, HALF_K // 8)
    packed_ptrs = packed_ptr + offs_n[None, :] * stride_pn + bytes_k[:, None]
    scale_ptrs = scales_ptr + offs_n[None, :] * stride_sn + blocks[:, None]
    if EVEN_K:
        packed = tl.load(packed_ptrs)
        scales = tl.load(scale_ptrs).to(tl.float32)
    else:
        packed = tl.load(packed_ptrs, mask=bytes_k[:, None] < K // 2, other=0)
        scales = tl.load(scale_ptrs, mask=blocks[:, None] < K // 16, other=0.0).to(tl.float32)
    # one scale per 16 elements: 8 bytes of each column share it
    scales = tl.reshape(tl.broadcast_to(scales[:, None, :], (HALF_K // 8, 8, scales.shape[1])), (HALF_K, scales.shape[1]))
    scales = scales * 16384.0  # 2^14: undoes the decode's 2^-14
    low = (_nibbles_over_2_14(packed, False, PTX) * scales).to(dtype)
    high = (_nibbles_over_2_14(packed, True, PTX) * scales).to(dtype)
    return low, high


@triton.jit
def _mxfp4_tiles(
    packed_ptr, scales_ptr, offs_n, k_start, K, stride_pn, stride_sn, HALF_K: tl.constexpr, EVEN_K: tl.constexpr,
    PTX: tl.constexpr, dtype
):
    """The even- and odd-K ``[BLOCK_K / 2, BLOCK_N]`` tiles of packed MXFP4 ``B``, times their E8M0 block scales."""
    bytes_k = k_start // 2 + tl.arange(0, HALF_K)
    blocks = k_start // 32 + tl.arange(0, HALF_K // 16)
    packed_ptrs = packed_ptr + offs_n[None, :] * stride_pn + bytes_k[:, None]
    scale_ptrs = scales_ptr + offs_n[None, :] * stride_sn + blocks[:, None]
    if EVEN_K:
        packed = tl.load(packed_ptrs)
        exponents = tl.load(scale_ptrs)
    else:
        packed = tl.load(packed_ptrs, mask=bytes_k[:, None] < K // 2, other=0)
        exponents = tl.load(scale_ptrs, mask=blocks[:, None] < K // 32, other=0)
    scales = _e8m0_times_2_14(exponents)  # the decode's 2^-14 undone in the per-block factor
    # one scale per 32 elements: 16 bytes of each column share it
    scales = tl.reshape(tl.broadcast_to(scales[:, None, :], (HALF_K // 16, 16, scales.shape[1])), (HALF_K, scales.shape[1]))
    low = (_nibbles_over_2_14(packed, False, PTX) * scales).to(dtype)
    high = (_nibbles_over_2_14(packed, True, PTX) * scales).to(dtype)
    return low, high


@triton.jit
def moe_gemm_kernel(
    a_ptr, b_ptr, b_scales_ptr, dequant_ptr, c_ptr, topk_weights_ptr, sorted_ptr, expert_ids_ptr, num_rows_ptr,
    a_scales_ptr, out_scale_ptr, N, K, num_pairs, top_k, max_blocks,
    stride_am, stride_be, stride_bn, stride_se, stride_sn, stride_de, stride_dn, stride_as, stride_cm,
    bias_ptr, stride_bias,
    GATED: tl.constexpr, NVFP4: tl.constexpr, EXPERT_SCALES: tl.constexpr, FP8: tl.constexpr, FP8_BLOCKS: tl.constexpr,
    OUT_FP8: tl.constexpr, PROMOTE: tl.constexpr, ACTIVATION: tl.constexpr, UPCAST: tl.constexpr,
    BIAS: tl.constexpr, RELU2: tl.constexpr, ALPHA: tl.constexpr, LIMIT: tl.constexpr, MXFP4: tl.constexpr,
    EVEN_K: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
):
    """``C[pair] = A[row] @ B[expert].T`` for every sorted pair, see the module docstring."""
    pid = tl.program_id(0)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    in_group = GROUP_M * num_pid_n
    first_m = (pid // in_group) * GROUP_M
    group_size = tl.minimum(max_blocks - first_m, GROUP_M)
    pid_m = first_m + (pid % in_group) % group_size
    pid_n = (pid % in_group) // group_size
    if pid_m * BLOCK_M >= tl.load(num_rows_ptr):
        return
    expert = tl.load(expert_ids_ptr + pid_m).to(tl.int64)
    pairs = tl.load(sorted_ptr + pid_m * BLOCK_M + tl.arange(0, BLOCK_M))
    row_ok = pairs < num_pairs
    a_rows = tl.where(row_ok, pairs // top_k if GATED or RELU2 else pairs, 0).to(tl.int64)
    offs_n = (pid_n * BLOCK_N + tl.arange(0, BLOCK_N)) % N
    b_expert = b_ptr + expert * stride_be
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    acc_up = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    dot_dtype = tl.float32 if UPCAST else b_ptr.dtype.element_ty
    if NVFP4 or MXFP4:
        dot_dtype = tl.float32 if UPCAST else (tl.bfloat16 if MXFP4 else a_ptr.dtype.element_ty)
        scales_expert = b_scales_ptr + expert * stride_se
        half = tl.arange(0, BLOCK_K // 2)
        for k_start in range(0, K, BLOCK_K):
            even_cols = k_start + 2 * half
            a_even_ptrs = a_ptr + a_rows[:, None] * stride_am + even_cols[None, :]
            if EVEN_K:
                a_even = tl.load(a_even_ptrs).to(dot_dtype)
                a_odd = tl.load(a_even_ptrs + 1).to(dot_dtype)
            else:
                inside = even_cols[None, :] < K
                a_even = tl.load(a_even_ptrs, mask=inside, other=0.0).to(dot_dtype)
                a_odd = tl.load(a_even_ptrs + 1, mask=inside, other=0.0).to(dot_dtype)
            if MXFP4:
                low, high = _mxfp4_tiles(
                    b_expert, scales_expert, offs_n, k_start, K, stride_bn, stride_sn, BLOCK_K // 2, EVEN_K,
                    not UPCAST, dot_dtype,
                )
            else:
                low, high = _nvfp4_tiles(
                    b_expert, scales_expert, offs_n, k_start, K, stride_bn, stride_sn, BLOCK_K // 2, EVEN_K, not UPCAST,
                    dot_dtype,
                )
            acc = tl.dot(a_even, low, acc)
            acc = tl.dot(a_odd, high, acc)
            if GATED:
                if MXFP4:
                    low, high = _mxfp4_tiles(
                        b_expert, scales_expert, offs_n + N, k_start, K, stride_bn, stride_sn, BLOCK_K // 2, EVEN_K,
                        not UPCAST, dot_dtype,
                    )
                else:
                    low, high = _nvfp4_tiles(
                        b_expert, scales_expert, offs_n + N, k_start, K, stride_bn, stride_sn, BLOCK_K // 2, EVEN_K,
                        not UPCAST, dot_dtype,
                    )
                acc_up = tl.dot(a_even, low, acc_up)
                acc_up = tl.dot(a_odd, high, acc_up)
        if NVFP4:  # MXFP4 has no global scale
            acc = acc * tl.load(dequant_ptr + expert * stride_de)
            if GATED:
                acc_up = acc_up * tl.load(dequant_ptr + expert * stride_de + 1)
    else:
        offs_k = tl.arange(0, BLOCK_K)
        a_ptrs = a_ptr + a_rows[:, None] * stride_am + offs_k[None, :]
        for k_start in range(0, K, BLOCK_K):
            if EVEN_K:
                a = tl.load(a_ptrs)
            else:
                a = tl.load(a_ptrs, mask=offs_k[None, :] < K - k_start, other=0.0)
            a = a.to(dot_dtype)
            b = _dense_tile(b_expert + k_start, offs_n, offs_k, K - k_start, stride_bn, EVEN_K).to(dot_dtype)
            up = b
            if GATED:
                up = _dense_tile(b_expert + N * stride_bn + k_start, offs_n, offs_k, K - k_start, stride_bn, EVEN_K)
            if FP8_BLOCKS:
                group = k_start // 128
                a_scales = tl.load(a_scales_ptr + a_rows * stride_as + group)[:, None]
                if BLOCK_N <= 128:  # the tile's columns lie in one 128-row block of B: one scale, one FMA an element
                    b_block = dequant_ptr + expert * stride_de + ((pid_n * BLOCK_N) // 128) * stride_dn + group
                    acc += tl.dot(a, b.to(dot_dtype)) * (a_scales * tl.load(b_block))
                    if GATED:
                        up_block = b_block + (N // 128) * stride_dn
                        acc_up += tl.dot(a, up.to(dot_dtype)) * (a_scales * tl.load(up_block))
                else:
                    b_scales = tl.load(dequant_ptr + expert * stride_de + (offs_n // 128) * stride_dn + group)
                    acc += tl.dot(a, b.to(dot_dtype)) * a_scales * b_scales[None, :]
                    if GATED:
                        up_scales = tl.load(dequant_ptr + expert * stride_de + ((offs_n + N) // 128) * stride_dn + group)
                        acc_up += tl.dot(a, up.to(dot_dtype)) * a_scales * up_scales[None, :]
            elif FP8 and PROMOTE and not UPCAST:
                # promote to float32 every tile: Hopper's FP8 MMAs keep fewer accumulator bits
                acc = tl.dot(a, b, acc, max_num_imprecise_acc=BLOCK_K)
                if GATED:
                    acc_up = tl.dot(a, up, acc_up, max_num_imprecise_acc=BLOCK_K)
            else:
                acc = tl.dot(a, b, acc)
                if GATED:
                    acc_up = tl.dot(a, up.to(dot_dtype), acc_up)
            a_ptrs += BLOCK_K
        if EXPERT_SCALES:
            acc = acc * tl.load(dequant_ptr + expert * stride_de)
            if GATED:
                acc_up = acc_up * tl.load(dequant_ptr + expert * stride_de + 1)
        if FP8:
            a_scales = tl.load(a_scales_ptr + a_rows * stride_as)[:, None]
            acc = acc * a_scales * tl.load(dequant_ptr + expert * stride_de + offs_n * stride_dn)[None, :]
            if GATED:
                up_scales = tl.load(dequant_ptr + expert * stride_de + (offs_n + N) * stride_dn)
                acc_up = acc_up * a_scales * up_scales[None, :]
    if BIAS:
        bias_expert = bias_ptr + expert * stride_bias
        acc += tl.load(bias_expert + offs_n).to(tl.float32)[None, :]
        if GATED:
            acc_up += tl.load(bias_expert + N + offs_n).to(tl.float32)[None, :]
    if GATED:
        if ACTIVATION == 0:
            gate = acc / (1.0 + tl.exp(-acc))
        elif ACTIVATION == 1:
            gate = 0.5 * acc * (1.0 + tl.erf(acc * 0.7071067811865476))
        elif ACTIVATION == 2:  # 0.5 x (1 + tanh(z)) = x * sigmoid(2 z), z = sqrt(2 / pi) (x + 0.044715 x^3)
            gate = acc / (1.0 + tl.exp(-1.5957691216057308 * (acc + 0.044715 * acc * acc * acc)))
        elif ACTIVATION == 3:  # clamped SwiGLU: gate clamped from above only, up to [-limit, limit] plus one; NaN stays NaN
            gate = tl.minimum(acc, LIMIT, propagate_nan=tl.PropagateNan.ALL)
            gate = gate / (1.0 + tl.exp(-ALPHA * gate))
            acc_up = tl.clamp(acc_up, -LIMIT, LIMIT, propagate_nan=tl.PropagateNan.ALL) + 1.0
        elif ACTIVATION == 4:  # SiLU with limits: the gate clamped from above before its SiLU, up to [-limit, limit]
            gate = tl.minimum(acc, LIMIT, propagate_nan=tl.PropagateNan.ALL)
            gate = gate / (1.0 + tl.exp(-gate))
            acc_up = tl.clamp(acc_up, -LIMIT, LIMIT, propagate_nan=tl.PropagateNan.ALL)
        else:  # SiLU with limits, the gate's SiLU clamped from above (Step 3.7)
            gate = tl.minimum(acc / (1.0 + tl.exp(-acc)), LIMIT, propagate_nan=tl.PropagateNan.ALL)
            acc_up = tl.clamp(acc_up, -LIMIT, LIMIT, propagate_nan=tl.PropagateNan.ALL)
        result = gate * acc_up
        if OUT_FP8:
            result = _e4m3_values(result, tl.load(out_scale_ptr), UPCAST)
    elif RELU2:
        result = tl.maximum(acc, 0.0)
        result = result * result
        if OUT_FP8:
            result = _e4m3_values(result, tl.load(out_scale_ptr), UPCAST)
    else:
        result = acc * tl.load(topk_weights_ptr + pairs, mask=row_ok, other=0.0)[:, None]
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    c_ptrs = c_ptr + pairs.to(tl.int64)[:, None] * stride_cm + cols[None, :]
    if OUT_FP8:
        _store_e4m3(c_ptrs, result, row_ok[:, None] & (cols[None, :] < N), UPCAST)
    else:
        tl.store(c_ptrs, result.to(c_ptr.dtype.element_ty), mask=row_ok[:, None] & (cols[None, :] < N))


@triton.jit
def combine_kernel(
    c_ptr, ids_ptr, out_ptr, H, top_k, offset, num_local, scaling, stride_cm, stride_om, BLOCK_H: tl.constexpr,
):
    """``out[t] = scaling * sum_k C[t * top_k + k]`` over the slots routed to this rank's experts."""
    token = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    col_ok = cols < H
    acc = tl.zeros((BLOCK_H,), dtype=tl.float32)
    for k in range(top_k):
        expert = tl.load(ids_ptr + token * top_k + k) - offset
        local = (expert >= 0) & (expert < num_local)
        row = tl.load(c_ptr + (token * top_k + k) * stride_cm + cols, mask=col_ok & local, other=0.0)
        acc += row.to(tl.float32)
    tl.store(out_ptr + token * stride_om + cols, (acc * scaling).to(out_ptr.dtype.element_ty), mask=col_ok)


SOFTMAX_SCORES = 0
SIGMOID_SCORES = 1
EXP_SCORES = 2
"""How :func:`routing_kernel` turns each logit into the score it weights with (``SCORES``): a softmax over all
experts, a sigmoid, or ``exp(logit - max)`` (renormalized over the picked, that is the softmax of the top-k logits)."""


@triton.jit
def _exp(x, LIBDEVICE: tl.constexpr):
    """``exp(x)``: compiled, libdevice's ``expf`` (within 2 ulp, as torch's kernels), since ``tl.exp`` lowers to
    ``ex2.approx`` of ``x * log2(e)``, whose rounding grows with ``|x|``; the interpreter has no libdevice (numpy's
    exp there)."""
    if LIBDEVICE:
        return tl.extra.cuda.libdevice.exp(x)
    return tl.exp(x)


@triton.jit
def _row_max(x):
    """The max of each row of ``x [rows, a, b]``, as ``[rows]``."""
    return tl.max(tl.max(x, axis=2), axis=1)


@triton.jit
def _best(key, ids, candidate, NONE: tl.constexpr):
    """Per row of ``key [rows, a, b]``: the id of the largest ``key`` among ``candidate``, the lowest id among equal
    keys (NaN counts as -inf, so a row with a candidate always finds one)."""
    key = tl.where(candidate & (key == key), key, float("-inf"))
    best = _row_max(key)[:, None, None]
    return tl.min(tl.min(tl.where(candidate & (key == best), ids, NONE), axis=2), axis=1)


@triton.jit
def routing_kernel(
    logits_ptr, bias_ptr, ids_ptr, weights_ptr, num_tokens, stride_lt, stride_le, stride_b, n_group, per_group, eps,
    floor, TOP_K: tl.constexpr, SCORES: tl.constexpr, GROUPED: tl.constexpr, TOPK_GROUP: tl.constexpr,
    GROUP_MAX: tl.constexpr, BIAS: tl.constexpr, RENORMALIZE: tl.constexpr, LIBDEVICE: tl.constexpr,
    ROWS: tl.constexpr, GROUPS: tl.constexpr, PER_GROUP: tl.constexpr, K_PAD: tl.constexpr,
):
    """``ROWS`` tokens' top-k ids and float32 weights from their logits, as :func:`moe_core.select_experts` computes
    them.

    The rows sit in registers as ``[ROWS, GROUPS, PER_GROUP]`` (expert
    ``g * per_group + j``; one group of all experts unless ``GROUPED``).
    Ungrouped, the top-k logits are picked (every score is increasing in the
    logit); ``GROUPED``, the scores (plus the correction bias where ``BIAS``)
    choose: each group scores its best (``GROUP_MAX``) or its two best summed,
    the ``TOPK_GROUP`` best groups stay and the top-k of their experts are
    picked. Each pick is an arg-max over the experts not yet picked, so a
    row's ids come in decreasing order of what chose them, and equal keys go
    to the lower id. The weights are the picked scores, divided by
    ``max(sum + eps, floor)`` where ``RENORMALIZE``; divisions are IEEE
    (``div_rn``) as torch's.
    """
    row = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    row_ok = row < num_tokens
    group = tl.arange(0, GROUPS)[None, :, None]
    column = tl.arange(0, PER_GROUP)[None, None, :]
    expert = group * per_group + column
    valid = (group < n_group) & (column < per_group)
    offsets = row.to(tl.int64)[:, None, None] * stride_lt + expert * stride_le
    logits = tl.load(logits_ptr + offsets, mask=row_ok[:, None, None] & valid, other=0.0).to(tl.float32)
    logits = tl.where(valid, logits, float("-inf"))  # rows past the last stay finite
    if SCORES == 1:
        scores = tl.math.div_rn(tl.full(logits.shape, 1.0, tl.float32), 1.0 + _exp(-logits, LIBDEVICE))
    else:
        scores = _exp(logits - _row_max(logits)[:, None, None], LIBDEVICE)
        if SCORES == 0:
            total = tl.sum(tl.sum(scores, axis=2), axis=1)[:, None, None]
            scores = tl.math.div_rn(scores, tl.broadcast_to(total, scores.shape))
    candidate = tl.broadcast_to(valid, logits.shape)
    if GROUPED:
        key = scores
        if BIAS:
            key += tl.load(bias_ptr + expert * stride_b, mask=valid, other=0.0).to(tl.float32)
        key = tl.where(valid, key, float("-inf"))
        best = tl.max(key, axis=2)
        if GROUP_MAX:
            group_scores = best
        else:
            first = tl.min(tl.where(key == best[:, :, None], column, PER_GROUP), axis=2)
            group_scores = best + tl.max(tl.where(column == first[:, :, None], float("-inf"), key), axis=2)
        group_scores = group_scores[:, :, None]
        kept = tl.zeros(group_scores.shape, tl.int1)
        for _ in tl.static_range(TOPK_GROUP):
            kept |= group == _best(group_scores, group, (group < n_group) & ~kept, GROUPS)[:, None, None]
        candidate &= kept  # dropped groups' experts are never picked
    else:
        key = logits
    slots = tl.arange(0, K_PAD)[None, :]
    ids = tl.zeros((ROWS, K_PAD), tl.int32)
    weights = tl.zeros((ROWS, K_PAD), tl.float32)
    for slot in tl.static_range(TOP_K):
        picked = _best(key, expert, candidate, GROUPS * PER_GROUP)
        hit = expert == picked[:, None, None]
        ids = tl.where(slots == slot, picked[:, None], ids)
        weights = tl.where(slots == slot, _row_max(tl.where(hit, scores, float("-inf")))[:, None], weights)
        candidate &= ~hit
    if RENORMALIZE:
        total = tl.maximum(tl.sum(weights, axis=1) + eps, floor)[:, None]
        weights = tl.math.div_rn(weights, tl.broadcast_to(total, weights.shape))
    out = row.to(tl.int64)[:, None] * TOP_K + slots
    tl.store(ids_ptr + out, ids, mask=row_ok[:, None] & (slots < TOP_K))
    tl.store(weights_ptr + out, weights, mask=row_ok[:, None] & (slots < TOP_K))
