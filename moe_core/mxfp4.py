"""MXFP4 numerics in plain PyTorch (CPU and GPU): the E8M0 scale type, quantize, dequantize.

The OCP microscaling format as gpt-oss checkpoints store it: E2M1 codes
(the values of :mod:`moe_core.nvfp4`), two a byte with the first element in
the low nibble, and one E8M0 scale per 32 consecutive elements of a row: a
uint8 exponent ``e`` standing for ``2 ** (e - 127)`` (255 is NaN). There is
no global scale. Dequantization is ``e2m1(code) * 2 ** (e - 127)``, exact in
float32 (and in bf16 wherever the product is a normal bf16 number).

Quantization rounds each block's scale up to the power of two at or above
``amax / 6`` (as OpenAI's triton_kernels ``downcast_to_mxfp`` does), so no
value clips, then rounds ``x / scale`` to E2M1 (ties to even).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import final

import attrs
import torch

from moe_core._checks import (
    FLOAT_DTYPES,
    countable,
    record_built,
    require_dtype,
    require_finite,
    require_int,
    require_ndim,
    require_nonempty,
    require_same_device,
    require_shape,
    require_tensor,
    require_unwritten,
    values_readable,
    write_count,
)
from moe_core.global_scales import E2M1_MAX
from moe_core.nvfp4 import decode_e2m1, encode_e2m1, pack_e2m1, unpack_e2m1

MXFP4_BLOCK = 32
"""Elements sharing one E8M0 scale."""
E8M0_BIAS = 127
"""The exponent bias of an E8M0 scale: code ``e`` stands for ``2 ** (e - 127)``."""
E8M0_NAN = 255
"""The E8M0 code that stands for NaN: refused in a scale."""
E8M0_MAX_CODE = 240
"""The largest exponent taken (a block scale of ``2 ** 113``, far above any model's weights, whose exponents sit
near 127): every kernel decodes up to it (Triton folds its decode's ``2 ** 14`` into the scale, a float32 up to
here), and uint8 arithmetic that wrapped (``scales - 127`` on the exponents of weights below 1) lands above it."""
E8M0_MIN_TYPICAL_CODE = E8M0_BIAS - 64
"""The median exponent below which a scale tensor is refused: half the blocks scaled below 2**-64 is no weight's (a
checkpoint's block scales sit near 2**-8 to 1), but E8M0 values converted to integers (0 and 1)."""


@final
@attrs.frozen(eq=False)
class E8M0Scales:
    """Power-of-two block scales, one uint8 exponent per 32 elements of a row, ``[..., rows, cols / 32]``.

    Not a float tensor: the code ``e`` stands for ``2 ** (e - 127)``, and
    read as a number it would scale a layer by ``e`` instead. The tensor
    enters only through :meth:`from_checkpoint` (``__init__`` takes nothing),
    which refuses the NaN code 255.
    """

    _codes: torch.Tensor = attrs.field(init=False)
    _writes: int = attrs.field(init=False, repr=False)

    def __attrs_post_init__(self) -> None:
        raise TypeError(
            "E8M0Scales() takes no arguments: its tensor enters only through E8M0Scales.from_checkpoint, which checks it"
        )

    @classmethod
    def _of(cls, codes: torch.Tensor) -> E8M0Scales:
        name = "E8M0Scales.codes"
        require_tensor(name, codes)
        require_dtype(name, codes, (torch.uint8,))
        if codes.dim() < 2:
            raise ValueError(f"{name}: expected a tensor [..., rows, cols / {MXFP4_BLOCK}], got shape {tuple(codes.shape)}")
        if values_readable(codes) and codes.numel():
            if bool((codes == E8M0_NAN).any()):
                raise ValueError(f"{name}: expected exponents below {E8M0_NAN} (E8M0 {E8M0_NAN} is NaN), found some")
            typical = int(codes.flatten().median())
            if typical < E8M0_MIN_TYPICAL_CODE:
                raise ValueError(
                    f"{name}: expected biased exponents (127 is a block scale of 1), found a median of {typical} (half "
                    f"the blocks scaled below 2**{E8M0_MIN_TYPICAL_CODE - E8M0_BIAS}): E8M0 values converted to integers "
                    "(.to(torch.uint8), 2**-5 -> 0) instead of their bits viewed (.view(torch.uint8))?"
                )
            largest = int(codes.max())
            if largest > E8M0_MAX_CODE:
                raise ValueError(
                    f"{name}: expected exponents up to {E8M0_MAX_CODE} (block scales up to 2**{E8M0_MAX_CODE - E8M0_BIAS}), "
                    f"found {largest}: biased exponents as the checkpoint stores them, not shifted by the bias (uint8 "
                    "arithmetic wraps)?"
                )
        codes = countable(codes)
        scales = object.__new__(cls)
        object.__setattr__(scales, "_codes", codes)
        object.__setattr__(scales, "_writes", write_count(codes))
        return scales

    def __reduce__(self) -> tuple[Callable[[torch.Tensor], E8M0Scales], tuple[torch.Tensor]]:
        """Copies and pickles carry a copy of the exponents and rebuild through the checks."""
        return E8M0Scales._of, (self.codes.clone(),)

    @property
    def codes(self) -> torch.Tensor:
        """uint8 exponents ``[..., rows, cols / 32]``: read them, never write to them (nor to the checkpoint tensor
        they may view): ``RuntimeError`` at the next read after an in-place write."""
        require_unwritten("E8M0Scales", self._codes, self._writes)
        return self._codes

    @classmethod
    def from_checkpoint(cls, codes: torch.Tensor) -> E8M0Scales:
        """Scales as gpt-oss checkpoints store them (``*_scales``): uint8 biased exponents ``[..., rows, cols / 32]``,
        or a ``torch.float8_e8m0fnu`` tensor (another MX library's), whose bits are those exponents."""
        if isinstance(codes, torch.Tensor) and codes.dtype == torch.float8_e8m0fnu:
            codes = codes.view(torch.uint8)
        return cls._of(codes)

    @property
    def shape(self) -> tuple[int, ...]:
        """The exponents' shape."""
        return tuple(int(d) for d in self.codes.shape)

    def to(self, device: torch.device | str) -> E8M0Scales:
        """The same scales on ``device``."""
        return E8M0Scales._of(self.codes.to(device))

    def rows(self, index: torch.Tensor) -> E8M0Scales:
        """The scales of the rows ``index`` (dim -2), e.g. to reorder interleaved gate/up rows."""
        return E8M0Scales._of(self.codes.index_select(-2, index.to(self.codes.device)))

    def factors(self) -> torch.Tensor:
        """``2 ** (e - 127)`` as float32, exactly (the smallest codes give float32 subnormals)."""
        one = torch.ones(self.codes.shape, dtype=torch.float32, device=self.codes.device)
        return torch.ldexp(one, self.codes.to(torch.int32) - E8M0_BIAS)


def _dequantize(packed: torch.Tensor, scales: E8M0Scales) -> torch.Tensor:
    """float32 ``[..., rows, cols]`` of packed codes ``[..., rows, cols / 2]`` and their scales."""
    values = decode_e2m1(unpack_e2m1(packed))
    blocks = values.reshape(*values.shape[:-1], -1, MXFP4_BLOCK) * scales.factors().unsqueeze(-1)
    return blocks.flatten(-2)


def quantize_mxfp4(x: torch.Tensor) -> tuple[torch.Tensor, E8M0Scales]:
    """Packed codes ``[..., rows, cols / 2]`` and E8M0 scales of finite float ``x [..., rows, cols]`` (cols a multiple
    of 32): each block's scale the power of two at or above ``amax / 6`` (1 for an all-zero block)."""
    blocks = x.to(torch.float32).reshape(*x.shape[:-1], -1, MXFP4_BLOCK)
    amax = blocks.abs().amax(dim=-1)
    _, exponent = torch.frexp(amax / E2M1_MAX)  # amax / 6 = m * 2**exponent with 0.5 <= m < 1
    exact = amax / E2M1_MAX == torch.ldexp(torch.full_like(amax, 0.5), exponent)
    exponent = torch.where(amax > 0, exponent - exact.to(torch.int32), torch.zeros_like(exponent))
    codes = (exponent + E8M0_BIAS).clamp(0, E8M0_NAN - 1).to(torch.uint8)
    scales = E8M0Scales._of(codes)
    packed = pack_e2m1(encode_e2m1(blocks / scales.factors().unsqueeze(-1)).flatten(-2))
    return packed, scales


@final
@attrs.frozen(eq=False)
class Mxfp4ExpertWeights:
    """Stacked MXFP4 expert matrices ``[E, rows, cols]``: packed E2M1 codes and one E8M0 scale per 32 elements.

    There is no global scale, so a fused ``w13 [E, 2I, H]`` is one of these
    (gate rows first) with each half's rows keeping their own scales.
    """

    packed: torch.Tensor
    """uint8 ``[E, rows, cols / 2]``, the first element of each pair in the low nibble."""
    scales: E8M0Scales
    """``[E, rows, cols / 32]``."""

    def __attrs_post_init__(self) -> None:
        name = "Mxfp4ExpertWeights.packed"
        require_tensor(name, self.packed)
        require_dtype(name, self.packed, (torch.uint8,))
        require_ndim(name, self.packed, 3, "[num_experts, rows, cols / 2]")
        record_built(self, "packed", self.packed)
        if not isinstance(self.scales, E8M0Scales):
            raise TypeError(f"Mxfp4ExpertWeights.scales: expected E8M0Scales, got {type(self.scales).__name__}")
        if (2 * self.packed.shape[-1]) % MXFP4_BLOCK:
            raise ValueError(f"{name}: expected {MXFP4_BLOCK // 2}-byte multiples per row, got {self.packed.shape[-1]}")
        experts, rows, half = self._packed_shape
        expected = (experts, rows, 2 * half // MXFP4_BLOCK)
        require_shape("Mxfp4ExpertWeights.scales", self.scales.codes, expected, f"(one scale per {MXFP4_BLOCK} elements)")
        require_same_device([("packed", self.packed), ("scales", self.scales.codes)])

    @property
    def _packed_shape(self) -> tuple[int, int, int]:
        """The packed tensor's ``(num_experts, rows, cols / 2)``."""
        experts, rows, half = self.packed.shape
        return int(experts), int(rows), int(half)

    @property
    def shape(self) -> tuple[int, int, int]:
        """The logical ``(num_experts, rows, cols)``."""
        experts, rows, half = self._packed_shape
        return experts, rows, 2 * half

    @classmethod
    def from_checkpoint(cls, blocks: torch.Tensor, scales: torch.Tensor) -> Mxfp4ExpertWeights:
        """gpt-oss's ``*_blocks`` (uint8 ``[E, rows, cols / 32, 16]``) and ``*_scales`` (uint8 ``[E, rows, cols / 32]``)."""
        require_tensor("blocks", blocks)
        require_ndim("blocks", blocks, 4, f"[num_experts, rows, cols / {MXFP4_BLOCK}, {MXFP4_BLOCK // 2}]")
        if blocks.shape[-1] != MXFP4_BLOCK // 2:
            raise ValueError(f"blocks: expected {MXFP4_BLOCK // 2} bytes a block (last dim), got shape {tuple(blocks.shape)}")
        return cls(blocks.reshape(*blocks.shape[:2], -1).contiguous(), E8M0Scales.from_checkpoint(scales.contiguous()))

    @classmethod
    def quantize(cls, w: torch.Tensor) -> Mxfp4ExpertWeights:
        """Quantize finite float weights ``[E, rows, cols]`` (cols a multiple of 32), see :func:`quantize_mxfp4`."""
        layout = "[num_experts, rows, cols]"
        require_tensor("w", w)
        require_dtype("w", w, FLOAT_DTYPES)
        require_ndim("w", w, 3, layout)
        require_nonempty("w", w, layout)
        if w.shape[-1] % MXFP4_BLOCK:
            raise ValueError(f"w: expected the last dim to be a multiple of {MXFP4_BLOCK}, got {w.shape[-1]}")
        require_finite("w", w)
        return cls(*quantize_mxfp4(w.detach()))

    def rows(self, index: torch.Tensor) -> Mxfp4ExpertWeights:
        """The rows ``index`` of every expert (codes and scales alike: exact)."""
        return Mxfp4ExpertWeights(self.packed.index_select(1, index.to(self.packed.device)), self.scales.rows(index))

    def to(self, device: torch.device | str) -> Mxfp4ExpertWeights:
        """The same weights on ``device``."""
        return Mxfp4ExpertWeights(self.packed.to(device), self.scales.to(device))

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """The values the codes stand for, ``[E, rows, cols]`` in ``dtype``."""
        return _dequantize(self.packed, self.scales).to(dtype)

    def dequantize_expert(self, expert: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """One expert's ``[rows, cols]`` in ``dtype`` (``0 <= expert < E``)."""
        require_int("expert", expert, minimum=0)
        if expert >= self.shape[0]:
            raise ValueError(f"expert: expected an index below num_experts={self.shape[0]}, got {expert}")
        scales = E8M0Scales._of(self.scales.codes[expert])
        return _dequantize(self.packed[expert], scales).to(dtype)
