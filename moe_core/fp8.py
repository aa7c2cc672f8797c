"""FP8 E4M3 W8A8: the scale types and the expert weights, per tensor and per channel.

FP8 checkpoints store dequantize-side scales, ``x ~= e4m3 * scale`` with
``scale = amax / 448``. Per tensor (compressed-tensors and ModelOpt "FP8
per-tensor"): one per expert weight matrix (w1 and w3 apart) and one static
scale per GEMM input. Per channel (compressed-tensors ``FP8_DYNAMIC``): one
per output row of each weight matrix, and the activations' scales computed
per token at run time (:func:`dynamic_fp8_scales`). There is one convention,
but a scalar, a per-expert vector and a per-channel matrix are different
types, as for NVFP4: a kernel's one input scale is made from several only
under a named :class:`~moe_core.global_scales.ExpertScalePolicy`.
"""

from __future__ import annotations

import abc
import contextlib
import contextvars
from collections.abc import Callable, Iterator, Sequence
from typing import ClassVar, Protocol, final

import attrs
import torch

from moe_core._checks import (
    record_built,
    reduce_rebuilt,
    require_dtype,
    require_finite,
    require_ndim,
    require_positive,
    require_same_device,
    require_tensor,
    value_chunks,
    values_readable,
)
from moe_core.global_scales import (
    E4M3_MAX,
    ExpertScalePolicy,
    _checkpoint_values,
    _collapse,
    _expert_amax,
    _ExpertScales,
    _float_tensor,
    _layer_value,
    _scalar_amax,
    _ScalarScale,
    _TensorScale,
)

FP8_BLOCK = 128
"""The side of a block-scaled checkpoint's weight blocks, and the length of an activation row's groups."""

PER_CHANNEL_EVIDENCE_ROWS = 16
"""Rows from which codes with a +-448 in every row are taken for per-channel ones (:func:`_refuse_per_channel_codes`)."""
_E4M3_MAX_BITS = 0x7E
"""448's E4M3 bits without the sign."""

MIN_DYNAMIC_SCALE = 1.0 / (E4M3_MAX * 512.0)
"""The floor of a per-token scale, so an all-zero row quantizes to zeros instead of dividing by zero (vLLM's)."""


def _amax_scale(amax: torch.Tensor) -> torch.Tensor:
    """``amax / 448`` correctly rounded, the same on every device.

    CUDA computes ``tensor / number`` as ``tensor * fl(1 / number)``; 1/448 is
    inexact, so about 6 scales in 10 came out one ulp off the CPU's. bf16
    inputs often land exactly on an E4M3 rounding tie at ``x / scale`` (short
    significands), and that ulp rounds them the other way: the dynamic FP8
    references missed the float64 MoE by 1e-2 on an H200. A tensor divisor on
    ``amax``'s device is a true division everywhere.
    """
    return amax / torch.full((), E4M3_MAX, dtype=amax.dtype, device=amax.device)


@final
@attrs.frozen(eq=False)
class Fp8TensorScale(_ScalarScale):
    """Dequantize-side scalar FP8 scale ``amax / 448``, shape ``[1]``."""

    @classmethod
    def from_amax(cls, amax: float | torch.Tensor) -> Fp8TensorScale:
        """The scale that maps ``amax`` (one value > 0) onto 448."""
        return cls._of(_amax_scale(_scalar_amax(amax)))

    @classmethod
    def from_checkpoint(cls, tensor: torch.Tensor, *, num_experts: int, policy: ExpertScalePolicy) -> Fp8TensorScale:
        """The scalar from the checkpoint values of all ``num_experts`` experts (``[E]``, ``[E, 2]``); several become
        one under ``policy`` (conservative: the largest)."""
        values = _checkpoint_values(cls.__name__, tensor, num_experts)
        return cls._of(_collapse(cls.__name__, values, policy, values.max()), num_experts)

    @classmethod
    def from_layer_checkpoint(cls, tensor: torch.Tensor) -> Fp8TensorScale:
        """The one value a checkpoint stores for the whole layer (fused experts), shape ``()`` or ``[1]``: no expert
        count to check (like :meth:`from_amax`); refuses a view into a per-expert tensor."""
        return cls._of(_layer_value(cls.__name__, tensor))

    def covered_amax(self) -> float:
        """The largest magnitude this static scale quantizes without clipping, ``448 * scale`` (synchronizes)."""
        return E4M3_MAX * self.item()


def _require_weight_scale(name: str, tensor: torch.Tensor) -> None:
    """Refuse FP8 weight scales above 1: dequantize-side ``amax / 448`` exceeds 1 only for a weight above 448 (model
    weights are orders of magnitude smaller), so a larger value is the reciprocal: a quantize-side scale, or
    DeepSeek's ``weight_scale_inv`` (already the dequantize multiplier) inverted once more. Activation scales
    (:class:`Fp8TensorScale`) may exceed 1 and are not checked."""
    if values_readable(tensor) and tensor.numel() and bool((tensor > 1).any()):
        index = tuple(int(i) for i in (tensor > 1).nonzero()[0])
        raise ValueError(
            f"{name}: expected dequantize-side FP8 weight scales (amax / 448, at most 1 unless a weight exceeds 448), "
            f"got {float(tensor[index]):g} at index {index}: a quantize-side scale, or weight_scale_inv inverted?"
        )


@final
@attrs.frozen(eq=False)
class ExpertFp8Scales(_ExpertScales):
    """Dequantize-side FP8 scales, one per expert matrix, ``[E]`` float32."""

    @classmethod
    def from_amax(cls, amax: torch.Tensor) -> ExpertFp8Scales:
        """One scale per expert from per-expert amax values ``[E]``."""
        return cls._of(_amax_scale(_expert_amax(amax)))

    @classmethod
    def from_checkpoint(cls, tensor: torch.Tensor) -> ExpertFp8Scales:
        """Per-expert weight scales as a checkpoint stores them (dequantize side), ``[E]`` float32; refuses values
        above 1 (see :func:`_require_weight_scale`)."""
        require_tensor(f"{cls.__name__}.from_checkpoint", tensor)
        _require_weight_scale(f"{cls.__name__}.from_checkpoint", tensor)
        return super().from_checkpoint(tensor)


@attrs.frozen(eq=False)
class _ScaleGrid(_TensorScale):
    """Dequantize-side FP8 scales laid out as :attr:`LAYOUT` (one dimension per name), float32, finite and > 0."""

    LAYOUT: ClassVar[str]

    @classmethod
    def _check(cls, value: torch.Tensor) -> None:
        name = f"{cls.__name__}.value"
        require_tensor(name, value)
        require_dtype(name, value, (torch.float32,))
        require_ndim(name, value, cls.LAYOUT.count(",") + 1, cls.LAYOUT)
        if value.numel() == 0:
            raise ValueError(f"{name}: expected at least one scale, got shape {tuple(value.shape)}")
        require_positive(name, value)

    @property
    def num_experts(self) -> int:
        """E."""
        return int(self.value.shape[0])


@final
@attrs.frozen(eq=False)
class Fp8ChannelScales(_ScaleGrid):
    """Dequantize-side FP8 scales, one per output channel (row) of each expert matrix, ``[E, rows]`` float32."""

    LAYOUT: ClassVar[str] = "[num_experts, rows]"

    @property
    def rows(self) -> int:
        """Output channels per expert matrix."""
        return int(self.value.shape[1])

    @classmethod
    def from_amax(cls, amax: torch.Tensor) -> Fp8ChannelScales:
        """One scale per row from per-row amax values ``[E, rows]``."""
        tensor = _float_tensor("amax", amax)
        require_ndim("amax", tensor, 2, "[num_experts, rows]")
        require_positive("amax", tensor)
        return cls._of(_amax_scale(tensor))

    @classmethod
    def from_checkpoint(cls, tensor: torch.Tensor) -> Fp8ChannelScales:
        """Stacked checkpoint scales ``[E, rows]`` or ``[E, rows, 1]`` (compressed-tensors stores ``[rows, 1]`` per matrix)."""
        require_tensor(f"{cls.__name__}.from_checkpoint", tensor)
        _require_weight_scale(f"{cls.__name__}.from_checkpoint", tensor)
        if tensor.dim() == 3 and tensor.shape[2] == 1:
            tensor = tensor[:, :, 0]
        return cls._of(tensor)

    @classmethod
    def from_expert(cls, scales: ExpertFp8Scales, rows: int) -> Fp8ChannelScales:
        """Per-tensor scales as per-channel ones: every row of an expert takes its matrix's scale (exact)."""
        if not isinstance(scales, ExpertFp8Scales):
            raise TypeError(f"scales: expected ExpertFp8Scales, got {type(scales).__name__}")
        return cls._of(scales.value[:, None].expand(scales.num_experts, rows).contiguous())

    @classmethod
    def from_halves(cls, *, gate: ExpertFp8Scales, up: ExpertFp8Scales, rows: int) -> Fp8ChannelScales:
        """The per-tensor scales of w1 and w3 as per-channel ones of the fused ``w13 [E, 2 * rows, H]`` (gate rows
        first), each half's rows taking its own matrix's scale (exact)."""
        return cls._of(torch.cat((cls.from_expert(gate, rows).value, cls.from_expert(up, rows).value), dim=1))


@final
@attrs.frozen(eq=False)
class Fp8BlockScales(_ScaleGrid):
    """Dequantize-side FP8 scales, one per 128x128 block of each expert matrix, ``[E, rows / 128, cols / 128]`` float32.

    What DeepSeek-V3 and Qwen3 FP8 checkpoints ship as ``weight_scale_inv``
    (stacked over experts): not a per-tensor or per-channel scale, and not
    interchangeable with either.
    """

    LAYOUT: ClassVar[str] = "[num_experts, rows / 128, cols / 128]"

    @classmethod
    def from_checkpoint(cls, tensor: torch.Tensor) -> Fp8BlockScales:
        """Stacked ``weight_scale_inv`` tensors, ``[E, rows / 128, cols / 128]`` float32 (the dequantize multiplier,
        despite the name); refuses values above 1 (see :func:`_require_weight_scale`)."""
        require_tensor(f"{cls.__name__}.from_checkpoint", tensor)
        _require_weight_scale(f"{cls.__name__}.from_checkpoint", tensor)
        return cls._of(tensor)


def quantize_fp8(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """``x / scale`` saturated to +-448 and rounded to E4M3; ``scale`` broadcasts against ``x``."""
    return (x.to(torch.float32) / scale).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)


def fake_quantize_fp8(x: torch.Tensor, scale: Fp8TensorScale) -> torch.Tensor:
    """``x`` after an FP8 round trip with a static per-tensor scale, as float32."""
    return quantize_fp8(x, scale.value).to(torch.float32) * scale.value


def dynamic_fp8_scales(x: torch.Tensor) -> torch.Tensor:
    """Per-token (per-row) dequantize-side scales of ``x [T, K]``: ``max(amax / 448, MIN_DYNAMIC_SCALE)``, ``[T, 1]`` float32."""
    amax = x.to(torch.float32).abs().amax(dim=-1, keepdim=True)
    return _amax_scale(amax).clamp_min(MIN_DYNAMIC_SCALE)


def fake_quantize_fp8_per_token(x: torch.Tensor) -> torch.Tensor:
    """``x [T, K]`` after an FP8 round trip with its dynamic per-token scales, as float32."""
    scales = dynamic_fp8_scales(x)
    return quantize_fp8(x, scales).to(torch.float32) * scales


def _groups(x: torch.Tensor) -> torch.Tensor:
    """``x [T, K]`` as ``[T, K / 128, 128]``; refuses a K that is not a multiple of 128."""
    rows, cols = x.shape
    if cols % FP8_BLOCK:
        raise ValueError(f"x: expected a multiple of {FP8_BLOCK} columns for 1x{FP8_BLOCK} groups, got {cols}")
    return x.reshape(rows, cols // FP8_BLOCK, FP8_BLOCK)


def group_fp8_scales(x: torch.Tensor) -> torch.Tensor:
    """Per-token, per-128-column-group scales of ``x [T, K]``: ``max(amax / 448, MIN_DYNAMIC_SCALE)``, ``[T, K / 128]``."""
    return _amax_scale(_groups(x).to(torch.float32).abs().amax(dim=-1)).clamp_min(MIN_DYNAMIC_SCALE)


def fake_quantize_fp8_per_group(x: torch.Tensor) -> torch.Tensor:
    """``x [T, K]`` after an FP8 round trip with dynamic scales per token and 128-column group, as float32."""
    scales = group_fp8_scales(x)[:, :, None]
    return (quantize_fp8(_groups(x), scales).to(torch.float32) * scales).reshape(x.shape)


class _ScaleValues(Protocol):
    """Scales that hold their float32 values as a tensor."""

    @property
    def value(self) -> torch.Tensor: ...


class _Fp8Stack:
    """E4M3 codes of stacked expert matrices ``[E, rows, cols]`` and the dequantize-side scales laid over them.

    A subclass says how its scales spread over the elements (:meth:`_grid`);
    the codes' checks, the shape and the dequantization are the same for all.
    """

    codes: torch.Tensor
    scales: _ScaleValues

    @staticmethod
    @abc.abstractmethod
    def _grid(values: torch.Tensor, rows: int, cols: int) -> torch.Tensor:
        """Scale values ``[E, ...]`` as a tensor that broadcasts against codes ``[E, rows, cols]``."""

    def _check_codes(self) -> None:
        name = f"{type(self).__name__}.codes"
        require_tensor(name, self.codes)
        require_dtype(name, self.codes, (torch.float8_e4m3fn,))
        require_ndim(name, self.codes, 3, "[num_experts, rows, cols]")
        require_finite(name, self.codes)
        _refuse_misscaled_codes(name, self.codes)
        record_built(self, "codes", self.codes)

    def __reduce__(self) -> tuple[Callable[..., object], tuple[object, ...]]:
        """Copies and pickles are built again through the constructor, the codes carried as bytes (plain pickle
        cannot load a float8 tensor)."""
        return reduce_rebuilt(self, type(self).__name__)

    @property
    def shape(self) -> tuple[int, int, int]:
        """``(num_experts, rows, cols)``."""
        experts, rows, cols = self.codes.shape
        return int(experts), int(rows), int(cols)

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """The values the codes stand for, ``[E, rows, cols]``."""
        _, rows, cols = self.shape
        return (self.codes.to(torch.float32) * self._grid(self.scales.value, rows, cols)).to(dtype)

    def dequantize_expert(self, expert: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """One expert's ``[rows, cols]``."""
        _, rows, cols = self.shape
        scales = self._grid(self.scales.value[expert : expert + 1], rows, cols)[0]
        return (self.codes[expert].to(torch.float32) * scales).to(dtype)


_E4M3_EIGHT_BITS = 0x50
"""8.0's E4M3 bits without the sign (the bits of non-negative E4M3 values order as the values do)."""

SATURATION_EVIDENCE = 64
"""Codes of an expert matrix before the share of them at +-448 says anything about its scales."""


def _refuse_misscaled_codes(name: str, codes: torch.Tensor) -> None:
    """Refuse codes that were never divided by their dequantize-side scales, or were divided by scales far too small.

    Quantizers take each scale as ``amax / 448`` of what it covers (a tensor, a
    row, a block) or smaller (clipping observers), so the largest code of an
    expert matrix sits at 448, or lower in a slice of what the scale covered (a
    tensor-parallel shard, one half of a fused gate/up matrix): an expert whose
    codes are not all zero must reach 8 (a slice 56 times below the amax of
    the rest is no model's weights). Model weights lie far below 8, so weights
    cast to E4M3 without their scale (``w.to(torch.float8_e4m3fn)``), which
    dequantize to ``w * scale``, fall under it. Codes of a scale hundreds
    of times too small (a scale passed where an amax belongs) saturate: more
    than half of an expert's codes at +-448 (where real scales put one code
    per tensor, row or block there) is refused too. Checked where the values
    can be read.
    """
    if not values_readable(codes) or not codes.numel():
        return
    per_expert = codes[0].numel()
    top_parts, saturated_parts = [], []
    for chunk in value_chunks(codes.view(torch.uint8)):
        magnitudes = (chunk & 0x7F).flatten(1)
        top_parts.append(magnitudes.amax(dim=1))
        saturated_parts.append((magnitudes == _E4M3_MAX_BITS).sum(dim=1, dtype=torch.int32))
    top, saturated = torch.cat(top_parts), torch.cat(saturated_parts)
    low = ((top > 0) & (top < _E4M3_EIGHT_BITS)).nonzero()
    if low.numel():
        expert = int(low[0, 0])
        largest = float(codes[expert].float().abs().max())
        raise ValueError(
            f"{name}: expert {expert}'s largest code is {largest:g}, where a dequantize-side scale (amax / 448 of what "
            f"it covers) puts one at 448, or at least 8 in a slice ({int(low.shape[0])} of {codes.shape[0]} experts "
            "below): codes cast without "
            "dividing by their scale? quantize with quantize_fp8(w, scale), or the weights class's quantize()"
        )
    if per_expert < SATURATION_EVIDENCE:
        return
    over = (2 * saturated > per_expert).nonzero()
    if over.numel():
        expert = int(over[0, 0])
        raise ValueError(
            f"{name}: {int(saturated[expert])} of expert {expert}'s {per_expert} codes are at +-448 (a scale of amax / "
            "448 puts one code per tensor, row or block there): codes quantized with a scale far too small (a scale "
            "passed where an amax belongs?)"
        )


def _rows_at_max(codes: torch.Tensor, experts: Sequence[int]) -> list[tuple[int, int, int]]:
    """Per expert of ``codes [E, rows, cols]`` in ``experts``: its nonzero rows, how many of them hold a +-448 code,
    and how many +-448 codes they hold (pruned, all-zero rows say nothing of the scales' granularity)."""
    counts = []
    for expert in experts:  # one expert's bytes at a time: DeepSeek-V3's w13 is 7.5 GB
        magnitudes = codes[expert].view(torch.uint8) & 0x7F
        nonzero = (magnitudes != 0).any(dim=1)
        at_max = (magnitudes == _E4M3_MAX_BITS) & nonzero[:, None]
        counts.append((int(nonzero.sum()), int(at_max.any(dim=1).sum()), int(at_max.sum())))
    return counts


EXPERT_BLOCK_EVIDENCE = 4
"""Experts with fewer nonzero 128x128 blocks are not judged: per-tensor codes of a random matrix of two blocks hold
+-448 in both about a third of the time (the second block's amax within 1/28 of the first's), so layers of four
such experts were taken for block codes in 0.3-0.7% of draws (8 experts of 128 x 256, 4 of 256 x 128)."""


def _blocks_at_max(codes: torch.Tensor) -> tuple[int, int, int]:
    """Over the 128x128 blocks of ``codes [E, rows, cols]`` (both multiples of 128; else zeros) of the experts with
    :data:`EXPERT_BLOCK_EVIDENCE` nonzero blocks or more: how many hold a nonzero code, how many of those a +-448 code,
    and how many +-448 codes they hold."""
    experts, rows, cols = (int(d) for d in codes.shape)
    if rows % SCALE_BAND or cols % SCALE_BAND or rows * cols < EXPERT_BLOCK_EVIDENCE * SCALE_BAND * SCALE_BAND:
        return 0, 0, 0
    blocks = at_max = saturated = 0
    for expert in range(experts):  # one expert's bytes at a time
        magnitudes = (codes[expert].view(torch.uint8) & 0x7F).reshape(rows // SCALE_BAND, SCALE_BAND, cols // SCALE_BAND, SCALE_BAND)
        nonzero = (magnitudes != 0).any(dim=3).any(dim=1)
        judged = int(nonzero.sum())
        if judged < EXPERT_BLOCK_EVIDENCE:
            continue
        peaks = (magnitudes == _E4M3_MAX_BITS).sum(dim=(1, 3)) * nonzero
        blocks, at_max, saturated = blocks + judged, at_max + int((peaks > 0).sum()), saturated + int(peaks.sum())
    return blocks, at_max, saturated


BLOCK_EVIDENCE = 8
"""128x128 blocks from which codes with a +-448 in nearly every block are taken for block-quantized ones."""


BLOCK_SATURATION = 2.5
"""Block codes hold 1.5 to 2.1 +-448 codes a block on average (its amax, and values within 1/28 of it, measured on
random 128x128 blocks). A clipping per-tensor scale saturates a Poisson number a block: for 90% of blocks to hold
one, about 2.3 or more on average (a 99.99th-percentile scale's 3 to 4 a block was refused at a bound of 4:
adversarial pass 8, c07)."""


def _block_codes(codes: torch.Tensor) -> bool:
    """Whether ``codes`` look quantized per 128x128 block: at least :data:`BLOCK_EVIDENCE` nonzero blocks, 90% of them
    holding a +-448 (each block's amax) but fewer than :data:`BLOCK_SATURATION` a block on average."""
    blocks, at_max, saturated = _blocks_at_max(codes)
    return blocks >= BLOCK_EVIDENCE and at_max >= 0.9 * blocks and saturated < BLOCK_SATURATION * blocks


SATURATED_PER_ROW = 2.0
"""Per-channel codes hold about one +-448 a row (the row's amax; a second only within 1/28 of it); per-tensor codes
of a scale calibrated below the amax (a percentile observer's) saturate several in every wide row. At this many a
row or more, every row at +-448 is taken for clipping, not for per-channel codes (adversarial pass 7, c26)."""


def _refuse_per_channel_codes(name: str, codes: torch.Tensor) -> None:
    """Refuse codes quantized per channel under per-tensor scales (per-channel scales collapsed, codes kept).

    Per channel, each row's largest magnitude is its own amax over its own
    ``amax / 448`` scale: every nonzero row holds a +-448 code, about one.
    Per tensor only the rows near the matrix's amax do (within one E4M3 step,
    1/28 of it), or, under a scale calibrated below the amax, rows saturate
    several (:data:`SATURATED_PER_ROW`). A real matrix with every nonzero row
    there once in every expert is not per-tensor data; its rows would
    dequantize up to each row's scale ratio too large. Experts with fewer
    than :data:`PER_CHANNEL_EVIDENCE_ROWS` nonzero rows prove nothing and are
    skipped; values that cannot be read are not checked.
    """
    if not values_readable(codes):
        return
    counts = _rows_at_max(codes, range(int(codes.shape[0])))
    judged = [count for count in counts if count[0] >= PER_CHANNEL_EVIDENCE_ROWS]
    if not judged or any(at_max < rows or saturated >= SATURATED_PER_ROW * rows for rows, at_max, saturated in judged):
        return
    raise ValueError(
        f"{name}: expected per-tensor codes, got every nonzero row of {len(judged)} experts at +-448: codes quantized "
        "per channel; keep them with their Fp8ChannelScales (Fp8ChannelExpertWeights), or requantize them per "
        "tensor (Fp8ExpertWeights.quantize of their dequantized values)"
    )


def _refuse_block_codes(name: str, codes: torch.Tensor) -> None:
    """Refuse codes quantized per 128x128 block under per-tensor scales (the blocks' scales collapsed to one, codes
    kept: 1.59 off, adversarial pass 7, c03): nearly every block holds its own +-448 (:func:`_block_codes`), where
    per-tensor codes of a real matrix hold it only near the matrix's amax."""
    if values_readable(codes) and _block_codes(codes):
        raise ValueError(
            f"{name}: expected per-tensor codes, got a +-448 in nearly every 128x128 block: codes quantized per block; "
            "keep them with their Fp8BlockScales (Fp8BlockExpertWeights), or requantize them (Fp8ExpertWeights.quantize "
            "of their dequantized values)"
        )


PER_CHANNEL_SHARE = 0.5
"""Under per-channel scales every nonzero row holds a +-448 code; codes quantized per 128x128 block (kept, their
scales collapsed to each row's largest) do only in rows that hold a block's amax (about 1 in 128 per block: 12-35%
of rows at K = 2048-7168). Fewer than this share is refused."""

SCALE_BAND = 128
"""Rows that share one scale in a block-scaled matrix."""


def _banded(scales: torch.Tensor) -> torch.Tensor:
    """Per expert of ``scales [E, rows]``: True where the rows' scales take more than two values yet are constant
    along every aligned band of :data:`SCALE_BAND` rows, as block scales collapsed to rows are (per-channel scales,
    rounded to powers of two or not, vary from row to row)."""
    experts, rows = int(scales.shape[0]), int(scales.reshape(scales.shape[0], -1).shape[1])
    if rows % SCALE_BAND or rows // SCALE_BAND < 3:
        return torch.zeros(experts, dtype=torch.bool)
    bands = scales.reshape(experts, rows // SCALE_BAND, SCALE_BAND)
    constant = (bands == bands[:, :, :1]).all(dim=2).all(dim=1)
    firsts = bands[:, :, 0].sort(dim=1).values
    distinct = 1 + (firsts[:, 1:] != firsts[:, :-1]).sum(dim=1)
    return (constant & (distinct > 2)).cpu()


def _refuse_coarser_codes(name: str, codes: torch.Tensor, scales: torch.Tensor) -> None:
    """Refuse codes quantized per 128x128 block under per-row scales that are the blocks' collapsed (constant along
    each band of 128 rows, :func:`_banded`) and hold +-448 in fewer than :data:`PER_CHANNEL_SHARE` of their nonzero
    rows: most rows would dequantize too large, by their block's scale ratio. Per-channel scales of any rounding vary
    along the rows and are not judged (powers of two leave rows short of 448: adversarial pass 7, c02). Judged from
    :data:`PER_CHANNEL_EVIDENCE_ROWS` nonzero rows, where the values can be read."""
    if not values_readable(codes) or not values_readable(scales):
        return
    varying = [int(expert) for expert in _banded(scales).nonzero().flatten()]
    if not varying and _block_codes(codes):  # block codes under row scales of at most two bands (c03)
        varying = list(range(int(codes.shape[0])))
    if not varying:
        return
    counts = _rows_at_max(codes, varying)
    rows, at_max = sum(c[0] for c in counts), sum(c[1] for c in counts)
    if rows >= PER_CHANNEL_EVIDENCE_ROWS and at_max < PER_CHANNEL_SHARE * rows:
        raise ValueError(
            f"{name}: expected per-channel codes (every nonzero row at +-448 under its own amax / 448 scale), got "
            f"{at_max} of {rows} nonzero rows there under scales constant along each band of {SCALE_BAND} rows: codes "
            "quantized per 128x128 block with their scales collapsed to rows; keep them with their Fp8BlockScales, or "
            "requantize them per channel (Fp8ChannelExpertWeights.quantize of their dequantized values)"
        )


_QUANTIZED_PER_TENSOR_HERE: contextvars.ContextVar[bool] = contextvars.ContextVar("quantized_per_tensor_here", default=False)
"""Set while this module quantizes per tensor itself: its codes are per-tensor whatever their rows look like."""


@contextlib.contextmanager
def _quantized_per_tensor_here() -> Iterator[None]:
    """Codes built inside are this module's own per-tensor quantization: weights whose every row reaches the
    expert's amax (an outlier input column, rows normalized to their maximum) put a +-448 in every row, as
    per-channel codes do, and were refused by the heuristics meant for collapsed scales (adversarial pass 19, v01)."""
    token = _QUANTIZED_PER_TENSOR_HERE.set(True)
    try:
        yield
    finally:
        _QUANTIZED_PER_TENSOR_HERE.reset(token)


@final
@attrs.frozen(eq=False)
class Fp8ExpertWeights(_Fp8Stack):
    """Stacked FP8 expert matrices ``[E, rows, cols]``, one dequantize-side scale per expert."""

    codes: torch.Tensor
    """float8_e4m3fn ``[E, rows, cols]``."""
    scales: ExpertFp8Scales

    def __attrs_post_init__(self) -> None:
        self._check_codes()
        if not isinstance(self.scales, ExpertFp8Scales):
            raise TypeError(f"Fp8ExpertWeights.scales: expected ExpertFp8Scales, got {type(self.scales).__name__}")
        if self.scales.num_experts != self.codes.shape[0]:
            raise ValueError(f"Fp8ExpertWeights.scales: expected {self.codes.shape[0]} experts, got {self.scales.num_experts}")
        require_same_device([("codes", self.codes), ("scales", self.scales.value)])
        if not _QUANTIZED_PER_TENSOR_HERE.get():
            _refuse_per_channel_codes("Fp8ExpertWeights.codes", self.codes)
            _refuse_block_codes("Fp8ExpertWeights.codes", self.codes)

    @staticmethod
    def _grid(values: torch.Tensor, rows: int, cols: int) -> torch.Tensor:
        return values.reshape(-1, 1, 1)

    @classmethod
    def quantize(cls, w: torch.Tensor) -> Fp8ExpertWeights:
        """Quantize float weights ``[E, rows, cols]``, each expert with the scale of its own amax."""
        require_ndim("w", w, 3, "[num_experts, rows, cols]")
        amax = w.detach().abs().amax(dim=(1, 2)).to(torch.float32)
        scales = ExpertFp8Scales.from_amax(torch.where(amax > 0, amax, torch.ones_like(amax)))
        with _quantized_per_tensor_here():
            return cls(quantize_fp8(w, cls._grid(scales.value, int(w.shape[1]), int(w.shape[2]))), scales)


@final
@attrs.frozen(eq=False, kw_only=True)
class Fp8GateUpWeights:
    """The fused first GEMM ``w13 [E, 2I, H]`` in FP8: gate (w1) and up (w3) halves, each with its own scales."""

    gate: Fp8ExpertWeights = attrs.field(kw_only=True)
    up: Fp8ExpertWeights = attrs.field(kw_only=True)

    def __attrs_post_init__(self) -> None:
        for name in ("gate", "up"):
            if not isinstance(getattr(self, name), Fp8ExpertWeights):
                raise TypeError(f"Fp8GateUpWeights.{name}: expected Fp8ExpertWeights, got {type(getattr(self, name)).__name__}")
        if self.gate.shape != self.up.shape:
            raise ValueError(f"Fp8GateUpWeights.up: expected shape {self.gate.shape} like gate, got {self.up.shape}")
        require_same_device([("gate", self.gate.codes), ("up", self.up.codes)])

    @property
    def shape(self) -> tuple[int, int, int]:
        """The logical ``(num_experts, 2 * I, H)``."""
        experts, rows, cols = self.gate.shape
        return experts, 2 * rows, cols

    @classmethod
    def quantize(cls, w13: torch.Tensor) -> Fp8GateUpWeights:
        """Quantize ``w13 [E, 2I, H]`` (gate rows first), each half with the scales of its own amax."""
        gate, up = w13.chunk(2, dim=1)
        return cls(gate=Fp8ExpertWeights.quantize(gate), up=Fp8ExpertWeights.quantize(up))

    def dequantize_expert(self, expert: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """One expert's ``[2I, H]``, each half with its own scale."""
        return torch.cat((self.gate.dequantize_expert(expert, dtype), self.up.dequantize_expert(expert, dtype)))

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """``[E, 2I, H]``, each half with its own scales."""
        return torch.cat((self.gate.dequantize(dtype), self.up.dequantize(dtype)), dim=1)

    def with_shared_scale(self) -> Fp8ExpertWeights:
        """The fused ``[E, 2I, H]`` on one scale per expert (the larger of the two), for kernels with one FC1 scale.

        The half with the smaller scale is requantized onto the larger one
        (its codes rounded again; exact where the two scales are equal), as
        vLLM does for FP8 MoE checkpoints.
        """
        shared = torch.maximum(self.gate.scales.value, self.up.scales.value)
        halves = [quantize_fp8(half.dequantize(), shared.reshape(-1, 1, 1)) for half in (self.gate, self.up)]
        with _quantized_per_tensor_here():
            return Fp8ExpertWeights(torch.cat(halves, dim=1), ExpertFp8Scales.from_checkpoint(shared))


@final
@attrs.frozen(eq=False)
class Fp8ChannelExpertWeights(_Fp8Stack):
    """Stacked FP8 expert matrices ``[E, rows, cols]``, one dequantize-side scale per row (output channel).

    The fused ``w13 [E, 2I, H]`` is one of these (gate rows first): with a
    scale per row, the gate and up halves keep their own scales in one tensor.
    """

    codes: torch.Tensor
    """float8_e4m3fn ``[E, rows, cols]``."""
    scales: Fp8ChannelScales

    def __attrs_post_init__(self) -> None:
        self._check_codes()
        if not isinstance(self.scales, Fp8ChannelScales):
            raise TypeError(f"Fp8ChannelExpertWeights.scales: expected Fp8ChannelScales, got {type(self.scales).__name__}")
        if (self.scales.num_experts, self.scales.rows) != tuple(self.codes.shape[:2]):
            raise ValueError(
                f"Fp8ChannelExpertWeights.scales: expected shape {tuple(self.codes.shape[:2])} [num_experts, rows], "
                f"got {tuple(self.scales.value.shape)}"
            )
        require_same_device([("codes", self.codes), ("scales", self.scales.value)])
        _refuse_coarser_codes("Fp8ChannelExpertWeights.codes", self.codes, self.scales.value)

    @staticmethod
    def _grid(values: torch.Tensor, rows: int, cols: int) -> torch.Tensor:
        return values[:, :, None]

    @classmethod
    def quantize(cls, w: torch.Tensor) -> Fp8ChannelExpertWeights:
        """Quantize float weights ``[E, rows, cols]``, each row with the scale of its own amax."""
        require_ndim("w", w, 3, "[num_experts, rows, cols]")
        amax = w.detach().abs().amax(dim=2).to(torch.float32)
        scales = Fp8ChannelScales.from_amax(torch.where(amax > 0, amax, torch.ones_like(amax)))
        return cls(quantize_fp8(w, cls._grid(scales.value, int(w.shape[1]), int(w.shape[2]))), scales)


def _blocks(rows: int, cols: int) -> tuple[int, int]:
    return -(-rows // FP8_BLOCK), -(-cols // FP8_BLOCK)


def _expand_blocks(scales: torch.Tensor, rows: int, cols: int) -> torch.Tensor:
    """``[E, row_blocks, col_blocks]`` -> one value per element ``[E, rows, cols]``."""
    return scales.repeat_interleave(FP8_BLOCK, dim=1)[:, :rows].repeat_interleave(FP8_BLOCK, dim=2)[:, :, :cols]


@final
@attrs.frozen(eq=False)
class Fp8BlockExpertWeights(_Fp8Stack):
    """Stacked FP8 expert matrices ``[E, rows, cols]``, one dequantize-side scale per 128x128 block."""

    codes: torch.Tensor
    """float8_e4m3fn ``[E, rows, cols]``."""
    scales: Fp8BlockScales

    def __attrs_post_init__(self) -> None:
        self._check_codes()
        if not isinstance(self.scales, Fp8BlockScales):
            raise TypeError(f"Fp8BlockExpertWeights.scales: expected Fp8BlockScales, got {type(self.scales).__name__}")
        experts, rows, cols = self.shape
        expected = (experts, *_blocks(rows, cols))
        if tuple(self.scales.value.shape) != expected:
            raise ValueError(
                f"Fp8BlockExpertWeights.scales: expected shape {expected} (one per {FP8_BLOCK}x{FP8_BLOCK} block), "
                f"got {tuple(self.scales.value.shape)}"
            )
        require_same_device([("codes", self.codes), ("scales", self.scales.value)])

    @staticmethod
    def _grid(values: torch.Tensor, rows: int, cols: int) -> torch.Tensor:
        return _expand_blocks(values, rows, cols)

    @classmethod
    def quantize(cls, w: torch.Tensor) -> Fp8BlockExpertWeights:
        """Quantize float weights ``[E, rows, cols]``, each 128x128 block with the scale of its own amax."""
        require_ndim("w", w, 3, "[num_experts, rows, cols]")
        experts, rows, cols = (int(d) for d in w.shape)
        row_blocks, col_blocks = _blocks(rows, cols)
        padded = torch.zeros(experts, row_blocks * FP8_BLOCK, col_blocks * FP8_BLOCK, dtype=torch.float32, device=w.device)
        padded[:, :rows, :cols] = w.detach().abs()
        amax = padded.reshape(experts, row_blocks, FP8_BLOCK, col_blocks, FP8_BLOCK).amax(dim=(2, 4))
        scales = Fp8BlockScales._of(_amax_scale(torch.where(amax > 0, amax, torch.ones_like(amax))))
        return cls(quantize_fp8(w, cls._grid(scales.value, rows, cols)), scales)
