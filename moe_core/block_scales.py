"""FP8 E4M3 block scales of NVFP4 tensors, with their memory layout in their type.

Checkpoints store one scale per 16 elements row-major (:class:`LinearBlockScales`);
the Blackwell block-scaled GEMMs (CUTLASS, TRT-LLM-gen) read them in the 128x4
tiled layout (:class:`SwizzledBlockScales`). A kernel's quant info names the one
it needs, so passing linear scales to a kernel that reads swizzled ones is a
type error rather than a garbage result. Neither class has a public
constructor from a raw tensor (their ``__init__`` takes nothing, so no
positional, keyword, private-alias or ``attrs.evolve`` spelling reaches a
field): checkpoint scales enter through :meth:`LinearBlockScales.from_checkpoint`,
swizzled ones only come from :meth:`LinearBlockScales.swizzle`. Nor do swizzled
bytes leave as a public tensor, which at real model sizes (rows a multiple of
128, blocks of 4) has the very shape of the linear scales and would pass for
them: the FlashInfer adapters, inside the package, read the private ``_tiles``.

The 128x4 layout: the scale matrix ``[rows, blocks]`` is padded with zeros to
``[ceil(rows/128)*128, ceil(blocks/4)*4]`` and cut into 128x4 tiles stored tile
after tile (row tiles outer, block tiles inner); within a tile, scale ``(m, k)``
sits at ``(m % 32) * 16 + (m // 32) * 4 + k``: 512 bytes a tile.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import final

import attrs
import torch

from moe_core._checks import (
    Float8Bytes,
    countable,
    portable_tensor,
    require_dtype,
    require_int,
    require_tensor,
    require_unwritten,
    tensor_again,
    values_readable,
    write_count,
)

SWIZZLE_ROWS = 128
"""Rows of scales in one 128x4 tile."""
SWIZZLE_BLOCKS = 4
"""Scale columns (blocks of 16 elements) in one 128x4 tile."""


def _round_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


def _check_scale_values(name: str, data: torch.Tensor) -> None:
    require_tensor(name, data)
    require_dtype(name, data, (torch.float8_e4m3fn,))
    if data.dim() < 2:
        raise ValueError(f"{name}: expected a tensor [..., rows, blocks], got shape {tuple(data.shape)}")
    if not values_readable(data):
        return
    as_float = data.float()
    if bool(torch.isnan(as_float).any()):
        raise ValueError(f"{name}: expected no NaN scales (E4M3 code 0x7f/0xff), found some")
    if bool((as_float < 0).any()):
        raise ValueError(f"{name}: expected scales >= 0, found negative ones")


def _no_public_constructor(name: str, factories: str) -> TypeError:
    return TypeError(f"{name}() takes no arguments: its tensor enters only through {factories}, which check it")


@final
@attrs.frozen(eq=False)
class LinearBlockScales:
    """Row-major E4M3 scales ``[..., rows, cols / 16]``, one per 16 elements of a row."""

    _data: torch.Tensor = attrs.field(init=False)
    _writes: int = attrs.field(init=False, repr=False)

    def __attrs_post_init__(self) -> None:
        raise _no_public_constructor("LinearBlockScales", "LinearBlockScales.from_checkpoint")

    @classmethod
    def _of(cls, data: torch.Tensor) -> LinearBlockScales:
        """The one way in: ``data`` checked, bypassing the argument-less ``__init__``."""
        _check_scale_values("LinearBlockScales.data", data)
        data = countable(data)
        scales = object.__new__(cls)
        object.__setattr__(scales, "_data", data)
        object.__setattr__(scales, "_writes", write_count(data))
        return scales

    @property
    def data(self) -> torch.Tensor:
        """E4M3 ``[..., rows, cols / 16]``: read it, never write to it (nor to the checkpoint tensor it may view):
        ``RuntimeError`` at the next read after an in-place write."""
        require_unwritten("LinearBlockScales", self._data, self._writes)
        return self._data

    def __reduce__(self) -> tuple[Callable[[torch.Tensor | Float8Bytes], LinearBlockScales], tuple[torch.Tensor | Float8Bytes]]:
        """Copies and pickles carry a copy of the bytes (:func:`~moe_core._checks.portable_tensor`: plain pickle loads
        no float8 tensor) and rebuild through the checks."""
        return _linear_again, (portable_tensor(self.data.clone()),)

    @classmethod
    def from_checkpoint(cls, data: torch.Tensor) -> LinearBlockScales:
        """Scales as checkpoints store them: row-major E4M3 ``[..., rows, cols / 16]``."""
        return cls._of(data)

    @property
    def rows(self) -> int:
        """Rows of the scaled tensor."""
        return int(self.data.shape[-2])

    def to(self, device: torch.device | str) -> LinearBlockScales:
        """The same scales on ``device``."""
        return LinearBlockScales._of(self.data.to(device))

    @property
    def blocks(self) -> int:
        """Blocks of 16 elements per row."""
        return int(self.data.shape[-1])

    def swizzle(self) -> SwizzledBlockScales:
        """The same scales in the 128x4 tiled layout (padding filled with zeros)."""
        *batch, rows, blocks = self.data.shape
        padded_rows = _round_up(rows, SWIZZLE_ROWS)
        padded_blocks = _round_up(blocks, SWIZZLE_BLOCKS)
        padded = torch.zeros(
            (*batch, padded_rows, padded_blocks), dtype=torch.uint8, device=self.data.device
        )
        padded[..., :rows, :blocks] = self.data.view(torch.uint8)
        tiles = padded.reshape(
            *batch, padded_rows // SWIZZLE_ROWS, 4, 32, padded_blocks // SWIZZLE_BLOCKS, SWIZZLE_BLOCKS
        )
        nb = len(batch)
        order = (*range(nb), nb, nb + 3, nb + 2, nb + 1, nb + 4)
        swizzled = tiles.permute(order).reshape(*batch, padded_rows, padded_blocks)
        return SwizzledBlockScales._of(swizzled.contiguous().view(torch.float8_e4m3fn), rows=rows, blocks=blocks)


@final
@attrs.frozen(eq=False)
class SwizzledBlockScales:
    """E4M3 scales in the 128x4 tiled layout, ``[..., padded_rows, padded_blocks]``.

    The tensor's bytes are in tile order, so its two last dims are only its
    padded extent; ``rows`` and ``blocks`` keep the logical scale matrix size.
    """

    _tile_bytes: torch.Tensor = attrs.field(init=False, repr=False)
    _writes: int = attrs.field(init=False, repr=False)
    rows: int = attrs.field(init=False)
    """Rows of the logical scale matrix."""
    blocks: int = attrs.field(init=False)
    """Scale columns of the logical scale matrix."""

    def __attrs_post_init__(self) -> None:
        raise _no_public_constructor("SwizzledBlockScales", "LinearBlockScales.swizzle")

    @classmethod
    def _of(cls, tiles: torch.Tensor, *, rows: int, blocks: int) -> SwizzledBlockScales:
        """The one way in: ``tiles`` checked against the logical size, bypassing the argument-less ``__init__``."""
        require_int("SwizzledBlockScales.rows", rows, minimum=1)
        require_int("SwizzledBlockScales.blocks", blocks, minimum=1)
        _check_scale_values("SwizzledBlockScales.tiles", tiles)
        *_, padded_rows, padded_blocks = tiles.shape
        if padded_rows != _round_up(rows, SWIZZLE_ROWS) or padded_blocks != _round_up(blocks, SWIZZLE_BLOCKS):
            raise ValueError(
                f"SwizzledBlockScales.tiles: expected last dims "
                f"({_round_up(rows, SWIZZLE_ROWS)}, {_round_up(blocks, SWIZZLE_BLOCKS)}) "
                f"for rows={rows}, blocks={blocks}, got ({padded_rows}, {padded_blocks})"
            )
        tiles = countable(tiles)
        scales = object.__new__(cls)
        for name, value in (("_tile_bytes", tiles), ("_writes", write_count(tiles)), ("rows", rows), ("blocks", blocks)):
            object.__setattr__(scales, name, value)
        return scales

    @property
    def _tiles(self) -> torch.Tensor:
        """E4M3 ``[..., padded_rows, padded_blocks]`` in tile order: package-internal (the FlashInfer adapters pass it
        to the kernels); never public, so swizzled bytes cannot be handed to
        :meth:`LinearBlockScales.from_checkpoint`. Refused after an in-place write, like :attr:`LinearBlockScales.data`."""
        require_unwritten("SwizzledBlockScales", self._tile_bytes, self._writes)
        return self._tile_bytes

    def __reduce__(
        self,
    ) -> tuple[Callable[[torch.Tensor | Float8Bytes, int, int], SwizzledBlockScales], tuple[torch.Tensor | Float8Bytes, int, int]]:
        """Copies and pickles carry a copy of the bytes and rebuild through the checks, like :class:`LinearBlockScales`."""
        return _swizzled_again, (portable_tensor(self._tiles.clone()), self.rows, self.blocks)

    @property
    def shape(self) -> tuple[int, ...]:
        """The padded extent ``(..., padded_rows, padded_blocks)``: the logical one at 128-row, 4-block multiples."""
        return tuple(int(d) for d in self._tiles.shape)

    @property
    def device(self) -> torch.device:
        """Where the scales live."""
        return self._tiles.device

    def to(self, device: torch.device | str) -> SwizzledBlockScales:
        """The same scales on ``device``."""
        return SwizzledBlockScales._of(self._tiles.to(device), rows=self.rows, blocks=self.blocks)

    def unswizzle(self) -> LinearBlockScales:
        """The same scales row-major, padding dropped."""
        *batch, padded_rows, padded_blocks = self._tiles.shape
        tiles = self._tiles.view(torch.uint8).reshape(
            *batch, padded_rows // SWIZZLE_ROWS, padded_blocks // SWIZZLE_BLOCKS, 32, 4, SWIZZLE_BLOCKS
        )
        nb = len(batch)
        order = (*range(nb), nb, nb + 3, nb + 2, nb + 1, nb + 4)
        linear = tiles.permute(order).reshape(*batch, padded_rows, padded_blocks)
        return LinearBlockScales._of(linear[..., : self.rows, : self.blocks].contiguous().view(torch.float8_e4m3fn))


def _linear_again(data: torch.Tensor | Float8Bytes) -> LinearBlockScales:
    """:class:`LinearBlockScales` from what its copies and pickles carry."""
    return LinearBlockScales._of(tensor_again(data))


def _swizzled_again(tiles: torch.Tensor | Float8Bytes, rows: int, blocks: int) -> SwizzledBlockScales:
    """:class:`SwizzledBlockScales` from what its copies and pickles carry."""
    return SwizzledBlockScales._of(tensor_again(tiles), rows=rows, blocks=blocks)
