"""The buffers a forward writes and reads back itself (the sort's, the GEMMs' intermediate rows, FP8 codes), kept
between decode forwards.

Each of those buffers is written and read by the forward's own kernels on
one stream, then never looked at again: the next forward on that stream may
write the same memory, since the stream orders its kernels after the last
reads of the one before. At decode an allocation from the caching allocator
costs about as much host time as a launch (4.5 us on an H100 machine,
``benchmarks/RESULTS.md``), and a forward makes up to seven; a
:class:`KeptScratch` per device, stream and thread hands the same tensors
out again instead. Only the output, which the caller keeps, is allocated
afresh on every forward.

Kept buffers are shared by every layer of one shape (they run one after the
other on the stream) and bounded (:data:`KEPT_BYTES`); prefill, a CUDA graph
capture (whose buffers the graph's pool owns) and callers outside a
runner's memo allocate afresh (:data:`FRESH`).
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import torch

Scratch = Callable[[str, tuple[int, ...], torch.dtype, torch.device], torch.Tensor]
"""``scratch(name, shape, dtype, device)``: a buffer for the forward's own use under ``name`` (one buffer per name in a
forward), its contents undefined."""

KEPT_PAIRS = 4096
"""Forwards of up to this many (token, slot) pairs keep their buffers (decode: host time, not the kernels, sets
their pace)."""

KEPT_BYTES = 32 << 20
"""The most bytes one :class:`KeptScratch` holds; the oldest buffers go first, and a larger one is not kept."""


def fresh(name: str, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A new buffer from the caching allocator on every call."""
    return torch.empty(shape, dtype=dtype, device=device)


FRESH: Scratch = fresh
"""Every buffer allocated afresh."""


class KeptScratch:
    """Buffers by (name, shape, dtype, device), handed out again on every forward of one stream and thread."""

    __slots__ = ("__weakref__", "_bytes", "_kept")

    def __init__(self) -> None:
        self._kept: dict[tuple[str, tuple[int, ...], torch.dtype, torch.device], torch.Tensor] = {}
        self._bytes = 0

    def __call__(self, name: str, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        """The buffer kept under these, allocated (and kept, within :data:`KEPT_BYTES`) the first time."""
        key = (name, shape, dtype, device)
        kept = self._kept.get(key)
        if kept is not None:
            return kept
        buffer = torch.empty(shape, dtype=dtype, device=device)
        if buffer.nbytes > KEPT_BYTES:
            return buffer
        while self._bytes + buffer.nbytes > KEPT_BYTES:
            self._bytes -= self._kept.pop(next(iter(self._kept))).nbytes
        self._kept[key] = buffer
        self._bytes += buffer.nbytes
        return buffer

    @property
    def bytes(self) -> int:
        """The bytes held."""
        return self._bytes

    def buffer_at(self, tensor: torch.Tensor) -> torch.Tensor | None:
        """The kept buffer that starts where ``tensor`` does, with its dtype and device, or None (a replay,
        :mod:`.replay`, takes such a tensor from the scratch again on every forward)."""
        pointer = tensor.data_ptr()
        return next(
            (
                kept for kept in self._kept.values()
                if kept.data_ptr() == pointer and kept.dtype == tensor.dtype and kept.device == tensor.device
            ),
            None,
        )


_SCRATCH: dict[tuple[int, int], KeptScratch] = {}
"""Kept buffers by (stream handle, thread): kernels of other streams, or of a CPU thread running Triton's interpreter,
could run between a forward's kernels. At most :data:`KEPT_SCRATCHES`, the oldest dropped first."""

KEPT_SCRATCHES = 16


def forward_scratch(pairs: int, stream: int, device: torch.device) -> Scratch:
    """The buffers for a forward of ``pairs`` (token, slot) pairs launching on ``stream`` (0 for the CPU): kept ones
    at decode, outside a CUDA graph capture; fresh ones otherwise."""
    if pairs > KEPT_PAIRS or (device.type == "cuda" and torch.cuda.is_current_stream_capturing()):
        return FRESH
    key = (stream, threading.get_ident())
    kept = _SCRATCH.get(key)
    if kept is None:
        if len(_SCRATCH) >= KEPT_SCRATCHES:
            del _SCRATCH[next(iter(_SCRATCH))]
        kept = _SCRATCH[key] = KeptScratch()
    return kept
