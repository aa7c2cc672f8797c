"""Per-row tensors sent as one uint8 matrix: every dtype travels (float8 does not on gloo), one collective per payload."""

from __future__ import annotations

import math
from typing import final

import attrs
import torch


def as_bytes(rows: torch.Tensor) -> torch.Tensor:
    """``rows [N, ...]`` as uint8 ``[N, bytes per row]`` (a view where ``rows`` is contiguous)."""
    row_bytes = math.prod(rows.shape[1:]) * rows.dtype.itemsize
    return rows.contiguous().view(torch.uint8).reshape(rows.shape[0], row_bytes)


def from_bytes(data: torch.Tensor, dtype: torch.dtype, columns: int) -> torch.Tensor:
    """uint8 ``data [N, columns * itemsize]`` read as ``[N, columns]`` of ``dtype``.

    A column slice of one row (or none) counts as contiguous while its offset
    or row stride is no multiple of the itemsize, which a view refuses: such
    a slice is copied.
    """
    data = data.contiguous()
    if data.storage_offset() % dtype.itemsize or data.stride(0) % dtype.itemsize:
        data = data.new_empty(data.shape).copy_(data)
    return data.view(dtype).reshape(data.shape[0], columns)


@final
@attrs.frozen
class RowLayout:
    """The columns of a byte row: ``(dtype, columns)`` per packed tensor, in order."""

    fields: tuple[tuple[torch.dtype, int], ...]

    @property
    def row_bytes(self) -> int:
        """Bytes per packed row."""
        return sum(dtype.itemsize * columns for dtype, columns in self.fields)

    def pack(self, *tensors: torch.Tensor) -> torch.Tensor:
        """uint8 ``[N, row_bytes]`` holding each tensor's ``[N, columns]`` (or ``[N]`` for one column) side by side."""
        if len(tensors) != len(self.fields):
            raise ValueError(f"tensors: expected {len(self.fields)} tensors for {self.fields}, got {len(tensors)}")
        for index, (tensor, (dtype, columns)) in enumerate(zip(tensors, self.fields)):
            if tensor.dtype != dtype or tensor.numel() != tensor.shape[0] * columns:
                raise ValueError(
                    f"tensors[{index}]: expected {columns} {dtype} columns per row, got {tensor.dtype} {tuple(tensor.shape)}"
                )
        return torch.cat([as_bytes(tensor) for tensor in tensors], dim=1)

    def unpack(self, data: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """The tensors :meth:`pack` packed, each ``[N, columns]``."""
        if data.dtype != torch.uint8 or data.dim() != 2 or data.shape[1] != self.row_bytes:
            raise ValueError(f"data: expected uint8 [rows, {self.row_bytes}], got {data.dtype} {tuple(data.shape)}")
        tensors, start = [], 0
        for dtype, columns in self.fields:
            stop = start + dtype.itemsize * columns
            tensors.append(from_bytes(data[:, start:stop], dtype, columns))
            start = stop
        return tuple(tensors)

