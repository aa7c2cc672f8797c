"""Argument checks shared by the constructors of moe-core's frozen types.

Every check raises with the argument's name and what was expected, so a bad
checkpoint or a wiring mistake is reported where the object is built, once,
and never surfaces later as a silently wrong result on the hot path.
"""

from __future__ import annotations

import functools
import weakref
from collections.abc import Callable, Sequence
from typing import TypeVar

import attrs
import torch

FLOAT_DTYPES: tuple[torch.dtype, ...] = (torch.float32, torch.bfloat16, torch.float16)


def require_tensor(name: str, value: object) -> torch.Tensor:
    """Return ``value`` if it is a tensor, else raise ``TypeError`` naming ``name``."""
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(value).__name__}")
    return value


def require_dtype(name: str, tensor: torch.Tensor, allowed: Sequence[torch.dtype]) -> None:
    """Raise ``TypeError`` unless ``tensor.dtype`` is one of ``allowed``."""
    if tensor.dtype not in allowed:
        wanted = " or ".join(str(d) for d in allowed)
        raise TypeError(f"{name}: expected dtype {wanted}, got {tensor.dtype}")


def require_ndim(name: str, tensor: torch.Tensor, ndim: int, layout: str) -> None:
    """Raise ``ValueError`` unless ``tensor`` has ``ndim`` dims; ``layout`` names them."""
    if tensor.dim() != ndim:
        raise ValueError(
            f"{name}: expected a {ndim}-d tensor {layout}, got shape {tuple(tensor.shape)}"
        )


def require_shape(name: str, tensor: torch.Tensor, shape: Sequence[int], layout: str) -> None:
    """Raise ``ValueError`` unless ``tensor.shape == shape``; ``layout`` names the dims."""
    if tuple(tensor.shape) != tuple(shape):
        raise ValueError(
            f"{name}: expected shape {tuple(shape)} {layout}, got {tuple(tensor.shape)}"
        )


def require_nonempty(name: str, tensor: torch.Tensor, layout: str) -> None:
    """Raise ``ValueError`` if any dim of ``tensor`` has size 0; ``layout`` names the dims."""
    if tensor.numel() == 0:
        raise ValueError(f"{name}: expected no empty dim in {layout}, got shape {tuple(tensor.shape)}")


def require_same_device(names_and_tensors: Sequence[tuple[str, torch.Tensor]]) -> torch.device:
    """Return the one device all tensors live on, else raise ``ValueError`` listing them."""
    devices = {tensor.device for _, tensor in names_and_tensors}
    if len(devices) != 1:
        listing = ", ".join(f"{name} on {tensor.device}" for name, tensor in names_and_tensors)
        raise ValueError(f"expected all tensors on one device, got {listing}")
    return devices.pop()


def require_finite(name: str, tensor: torch.Tensor) -> None:
    """Raise ``ValueError`` if ``tensor`` holds a NaN or an infinity (where values can be read)."""
    if not values_readable(tensor):
        return
    if not _all_finite(tensor):
        raise ValueError(f"{name}: expected finite values, found NaN or infinity")


FINITE_CHUNK = 1 << 26
"""Elements a value check reads at a time (:func:`value_chunks`): bounds its transient masks and copies."""


def value_chunks(tensor: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """``tensor`` as whole first-dim slices of at most :data:`FINITE_CHUNK` elements (one slice where a slice is
    larger); a small tensor is one chunk (one kernel, not one per row).

    A value check over a weight stack then never holds a copy of the whole
    stack: DeepSeek-V3's bf16 w13 as float32 would take 30 GB, a count over
    its FP8 codes in int64 56 GB.
    """
    if tensor.dim() == 0 or tensor.numel() <= FINITE_CHUNK:
        return (tensor,)
    return tuple(torch.split(tensor, max(1, FINITE_CHUNK // (tensor.numel() // tensor.shape[0]))))


def _all_finite(tensor: torch.Tensor) -> bool:
    """Whether every value is finite, a chunk at a time (:func:`value_chunks`), with one read back; one-byte floats,
    which ``isfinite`` does not take, are upcast a chunk at a time."""
    return bool(torch.stack([_finite(c) for c in value_chunks(tensor)]).all())


def _finite(chunk: torch.Tensor) -> torch.Tensor:
    """A 0-d bool: every value of ``chunk`` finite. E4M3 from its bytes (its only non-finite codes are the NaNs
    0x7F and 0xFF), other one-byte floats upcast, the rest as they are."""
    if chunk.dtype == torch.float8_e4m3fn:
        return ((chunk.view(torch.uint8) & 0x7F) != 0x7F).all()
    return torch.isfinite(chunk.float() if chunk.element_size() == 1 else chunk).all()


def require_positive(name: str, tensor: torch.Tensor) -> None:
    """Raise ``ValueError`` unless every value of ``tensor`` is finite and > 0 (where values can be read)."""
    require_finite(name, tensor)
    if values_readable(tensor) and not bool((tensor > 0).all()):
        raise ValueError(f"{name}: expected values > 0, got minimum {float(tensor.min())}")


def require_finite_non_negative(name: str, tensor: torch.Tensor) -> None:
    """Raise ``ValueError`` unless every value of ``tensor`` is finite and >= 0 (where values can be read)."""
    require_finite(name, tensor)
    if values_readable(tensor) and tensor.numel() and not bool((tensor >= 0).all()):
        raise ValueError(f"{name}: expected values >= 0, got minimum {float(tensor.min())}")


def require_int(name: str, value: int, *, minimum: int) -> None:
    """Raise unless ``value`` is an ``int`` (not ``bool``) of at least ``minimum``."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name}: expected an int, got {type(value).__name__}")
    if value < minimum:
        raise ValueError(f"{name}: expected an int >= {minimum}, got {value}")


def values_readable(tensor: torch.Tensor) -> bool:
    """False for meta tensors (shapes only) and while ``tensor``'s CUDA stream captures a graph.

    Engines create layers on the meta device first, so constructors check
    shapes there and values wherever values exist.
    """
    if tensor.is_meta:
        return False
    return not (tensor.is_cuda and torch.cuda.is_current_stream_capturing())


def require_ids_in_range(name: str, ids: torch.Tensor, limit: int, what: str) -> None:
    """Raise ``ValueError`` unless ``0 <= ids < limit``; ``what`` names the limit.

    Reads the ids' extremes from the device: one synchronization, skipped
    while a CUDA graph is being captured.
    """
    if ids.numel() == 0 or not values_readable(ids):
        return
    low, high = (int(v) for v in torch.aminmax(ids))
    if low < 0:
        raise ValueError(f"{name}: expected ids >= 0, got {low}")
    if high >= limit:
        raise ValueError(f"{name}: expected ids < {limit} ({what}), got {high}")


def require_distinct_per_row(name: str, ids: torch.Tensor) -> None:
    """Raise ``ValueError`` if a row of ``ids [T, K]`` names one value twice.

    Reads the ids (one synchronization, skipped where values cannot be read).
    """
    if ids.shape[1] < 2 or ids.numel() == 0 or not values_readable(ids):
        return
    ordered = ids.sort(dim=1).values
    repeats = (ordered[:, 1:] == ordered[:, :-1]).any(dim=1)
    if bool(repeats.any()):
        row = int(repeats.nonzero()[0, 0])
        raise ValueError(
            f"{name}: expected distinct experts in each row, row {row} is {ids[row].tolist()}"
        )


def write_count(tensor: torch.Tensor) -> int:
    """In-place writes ``tensor``'s storage has seen (its version counter, shared by every view of it); -1 for an
    inference tensor, which tracks none (and outside inference mode cannot be written at all)."""
    try:
        version: int = getattr(tensor, "_version")  # Tensor._version: not in torch's stubs
    except RuntimeError:  # "Inference tensors do not track version counter" (asked on every call: no check first)
        return -1
    return version


def countable(tensor: torch.Tensor) -> torch.Tensor:
    """``tensor`` itself, or for an inference tensor (whose writes no counter sees, and which inference mode may still
    write) a normal copy made outside inference mode: what a scale that views its input keeps, so that
    :func:`require_unwritten` sees every in-place write."""
    if not tensor.is_inference():
        return tensor
    with torch.inference_mode(False):
        return tensor.clone()


def require_unwritten(name: str, tensor: torch.Tensor, count: int) -> None:
    """Raise ``RuntimeError`` if ``tensor`` was written in place since :func:`write_count` gave ``count``.

    Frozen scale types check their tensor on every read: a value written
    into one after construction (``.mul_``, ``.copy_``, an indexed
    assignment, a write into the checkpoint tensor it views) skips every
    check its constructor made and would change a layer's output silently.
    """
    now = write_count(tensor)
    if now != count:
        raise RuntimeError(
            f"{name}: its tensor was written in place after construction ({now - count} write(s)); built scales are "
            "immutable: build a new one through its named constructors (a layer reloads through its scheme)"
        )


FINGERPRINT_CHUNK = 1 << 22
"""Bytes a fingerprint reads at a time, at least one period's worth (its int32 copies of them take 4 times as much)."""


def _in_larger_buffer(tensor: torch.Tensor) -> bool:
    """Whether ``tensor`` is a part of a larger buffer: its storage holds more bytes than it spans, so writes into the
    other parts (an engine's buffer of every layer, filled a layer at a time) count as its writes too."""
    return tensor.untyped_storage().nbytes() > tensor.numel() * tensor.element_size()


FINGERPRINT_PERIOD = 65521
"""The position weights of a fingerprint repeat every this many bytes (a prime): blocks swapped a multiple of it
apart keep the weighted sum. Whole experts or rows of a real layer are never that far apart in a multiple (an
expert's bytes are not a multiple of this prime); with 251 before, experts 251 apart were (256 experts)."""

FINGERPRINT_SEED = 0x5EED
"""The seed of the fingerprint's position weights: fixed, so a fingerprint means the same in every process."""


@functools.cache
def fingerprint_weights(device: torch.device) -> torch.Tensor:
    """One period of position weights, int32 in ``[1, FINGERPRINT_PERIOD]`` (a byte times one stays below 2^24),
    drawn at random once: weights that grow with the position (``1, 2, 3, ...``) cancel under a permutation of equal
    slots whose moves sum to zero, ``[A, B, B, A] -> [B, A, A, B]`` (an expert rebalancing in place: adversarial
    pass 14, c03), where random ones do not."""
    generator = torch.Generator().manual_seed(FINGERPRINT_SEED)
    weights = torch.randint(1, FINGERPRINT_PERIOD + 1, (FINGERPRINT_PERIOD,), generator=generator, dtype=torch.int32)
    return weights.to(device)


def _byte_span(tensor: torch.Tensor) -> torch.Tensor | None:
    """The bytes of storage from ``tensor``'s first element to its last, as one contiguous uint8 tensor, where they are
    exactly its own (contiguous, or a transpose or other permutation of a contiguous block); None otherwise (gaps
    between its elements, or negative strides)."""
    if any(stride < 0 for stride in tensor.stride()):
        return None
    last = sum((size - 1) * stride for size, stride in zip(tensor.shape, tensor.stride()))
    if last + 1 != tensor.numel():
        return None
    span = torch.as_strided(tensor, (last + 1,), (1,), tensor.storage_offset())
    return span.view(torch.uint8)


def _own_byte_runs(tensor: torch.Tensor) -> list[torch.Tensor]:
    """``tensor``'s own bytes as uint8 runs in its element order: one where its bytes are one block
    (:func:`_byte_span`), else one per slice along its first dimension, recursively (a layer's slice ``arena[:, l]``
    of an expert-major buffer ``[E, L, ...]``: the other layers' bytes lie between its experts)."""
    span = _byte_span(tensor)
    if span is not None:
        return [span]
    if tensor.dim() <= 1:
        return [tensor.contiguous().reshape(-1).view(torch.uint8)]
    return [run for part in tensor.unbind(0) for run in _own_byte_runs(part)]


def _fingerprint(tensor: torch.Tensor) -> tuple[int, int] | None:
    """Two sums over a tensor's own bytes in its element order (:func:`_own_byte_runs`), plain and position-weighted
    (a different layer's weights, or the same bytes moved, change them); None where the values cannot be read.

    Byte ``i`` weighs ``fingerprint_weights()[i % FINGERPRINT_PERIOD]``: the bytes are read as
    rows of one period where they line up with it, each row times the same
    int32 weights (a byte times a weight stays below 2^24), summed in int64.
    """
    if not values_readable(tensor) or tensor.numel() == 0:
        return None
    device = tensor.device
    weights = fingerprint_weights(device)
    total = torch.zeros((), dtype=torch.int64, device=device)
    weighted = torch.zeros((), dtype=torch.int64, device=device)
    offset = 0
    for flat in _own_byte_runs(tensor):
        size, start = flat.numel(), 0
        while start < size:
            phase = (offset + start) % FINGERPRINT_PERIOD
            rows = min(FINGERPRINT_CHUNK, size - start) // FINGERPRINT_PERIOD
            if phase or not rows:  # up to the next period boundary, or the last partial row
                length = min(FINGERPRINT_PERIOD - phase, size - start)
                piece, scale = flat[start : start + length].to(torch.int32), weights[phase : phase + length]
            else:
                length = rows * FINGERPRINT_PERIOD
                piece, scale = flat[start : start + length].to(torch.int32).view(rows, FINGERPRINT_PERIOD), weights
            total += piece.sum(dtype=torch.int64)
            weighted += (piece * scale).sum(dtype=torch.int64)
            start += length
        offset += size
    return int(total), int(weighted)


FINGERPRINT_WHOLE_BYTES = 1 << 24
"""A whole tensor (not a part of a larger buffer) up to this many bytes is fingerprinted too: a router's weight, scales,
a small layer's experts, which ``load_state_dict`` of their own values rewrites (its counter moves, its bytes do
not). Larger whole tensors are not read at binding: a move of their counter counts as a write."""


class WriteCount:
    """A tensor's write count at one moment, and where its counter can move while its bytes stay (a part of a larger
    buffer, whose counter the whole buffer shares; a whole tensor up to :data:`FINGERPRINT_WHOLE_BYTES` that a reload
    rewrites with the same values) its contents' fingerprint: a count that moved is checked against the contents
    before it says the tensor was written."""

    __slots__ = ("count", "fingerprint", "pointer", "tensor")

    def __init__(self, tensor: torch.Tensor) -> None:
        self.tensor = tensor
        self.pointer = tensor.data_ptr()
        self.count = write_count(tensor)
        fingerprinted = _in_larger_buffer(tensor) or tensor.numel() * tensor.element_size() <= FINGERPRINT_WHOLE_BYTES
        self.fingerprint = _fingerprint(tensor) if self.count >= 0 and fingerprinted else None

    def writes(self) -> int:
        """In-place writes into the tensor since then (its counter's moves; 0 where they were writes into other parts
        of its buffer, which left its own contents as they were); at least 1 where the tensor now addresses other
        memory (``set_``, ``torch.utils.swap_tensors``), whatever its counter says, unless its fingerprint says the
        bytes there are the same (``share_memory_()``, a ``torch.multiprocessing`` queue's move)."""
        now = write_count(self.tensor)
        if self.tensor.data_ptr() != self.pointer:
            if self.fingerprint is not None and _fingerprint(self.tensor) == self.fingerprint:  # moved, same bytes
                self.pointer, self.count = self.tensor.data_ptr(), now
                return 0
            return max(now - self.count, 1)
        if now == self.count:
            return 0
        if self.fingerprint is not None and _fingerprint(self.tensor) == self.fingerprint:
            self.count = now
            return 0
        return now - self.count


def byte_span(tensor: torch.Tensor) -> tuple[int, int]:
    """The bytes ``tensor`` addresses, as ``[start, stop)`` (its first element to one past its last)."""
    start = tensor.data_ptr()
    reach = sum((size - 1) * stride for size, stride in zip(tensor.shape, tensor.stride())) + 1
    return start, start + reach * tensor.element_size()


def overlaps(one: torch.Tensor, other: torch.Tensor) -> bool:
    """Whether the byte spans the two tensors address on one device intersect (never for empty or meta tensors)."""
    if one.device != other.device or 0 in (one.data_ptr(), other.data_ptr()) or 0 in (one.numel(), other.numel()):
        return False
    (first, stop), (other_first, other_stop) = byte_span(one), byte_span(other)
    return first < other_stop and other_first < stop


def none_moved(counts: Sequence[tuple[str, WriteCount]]) -> bool:
    """Whether every counted tensor (by its path) still has its counter and its memory (counted ones only: no
    inference tensors), asked on every call of a bound layer before the slower :meth:`WriteCount.writes` looks at any
    that moved."""
    for _, counted in counts:
        tensor = counted.tensor
        if getattr(tensor, "_version") != counted.count or tensor.data_ptr() != counted.pointer:  # not in torch's stubs
            return False
    return True


_BUILT: weakref.WeakKeyDictionary[object, list[tuple[str, WriteCount]]] = weakref.WeakKeyDictionary()
"""Per weight object (while it lives): each tensor it was built from, by field, with its write count at the build."""


def record_built(holder: object, field: str, tensor: torch.Tensor) -> None:
    """Remember the write count of ``tensor``, ``holder``'s ``field``, as that weight object is built from it.

    Weight types hold their tensors as given, without copying (a
    checkpoint's, a loader's staging buffer): a buffer written with another
    layer's weights between building and binding would bind that layer's.
    Binding checks the record (:func:`require_unwritten_since_built`); each
    object keeps its own, so weights built anew from a rewritten buffer
    bind, while those built before the write are refused. Inference
    tensors count no writes and are skipped.
    """
    if not tensor.is_inference():
        _BUILT.setdefault(holder, []).append((field, WriteCount(tensor)))


def require_unwritten_since_built(path: str, holder: object) -> None:
    """Raise ``RuntimeError`` naming the tensor (by ``path``, where ``holder`` sits) if one that ``holder`` was built
    from has been written in place since (:func:`record_built`); nothing for an object that recorded none."""
    try:
        records = _BUILT.get(holder, [])
    except TypeError:  # not weakly referable: no weight type
        return
    for field, counted in records:
        writes = counted.writes()
        if writes:
            raise RuntimeError(
                f"{path}.{field}: written in place after its weights were built ({writes} write(s), e.g. a staging "
                "buffer reused for the next layer's weights): built weights are immutable; build new ones from it "
                "(a scheme reloads through its loader)"
            )


H = TypeVar("H")


FLOAT8_DTYPES = (torch.float8_e4m3fn, torch.float8_e5m2)


@attrs.frozen(eq=False)
class Float8Bytes:
    """A float8 tensor as its bytes and dtype's name, for pickles: torch pickles float8 tensors, but plain
    ``pickle.loads`` of one fails inside torch (``UntypedStorage has no attribute 'dtype'``, torch 2.13)."""

    data: torch.Tensor
    dtype: str

    def tensor(self) -> torch.Tensor:
        """The float8 tensor again."""
        dtype = next(kind for kind in FLOAT8_DTYPES if str(kind) == self.dtype)
        return self.data.view(dtype)


def portable_tensor(tensor: torch.Tensor) -> torch.Tensor | Float8Bytes:
    """``tensor`` as a pickle carries it: a float8 one as :class:`Float8Bytes`."""
    return Float8Bytes(tensor.view(torch.uint8), str(tensor.dtype)) if tensor.dtype in FLOAT8_DTYPES else tensor


def tensor_again(value: torch.Tensor | Float8Bytes) -> torch.Tensor:
    """The inverse of :func:`portable_tensor`."""
    return value.tensor() if isinstance(value, Float8Bytes) else value


def portable(value: object) -> object:
    """``value`` as a pickle carries it: a tensor through :func:`portable_tensor`, anything else as it is."""
    return portable_tensor(value) if isinstance(value, torch.Tensor) else value


def unpickled(value: object) -> object:
    """The inverse of :func:`portable`."""
    return tensor_again(value) if isinstance(value, Float8Bytes) else value


def built_again(kind: type[H], fields: dict[str, object]) -> H:
    """``kind(**fields)``: a copy or unpickled weight object built through its constructor (:func:`reduce_rebuilt`),
    its float8 tensors carried as bytes (:func:`portable`)."""
    return kind(**{name: unpickled(value) for name, value in fields.items()})


def reduce_rebuilt(holder: object, path: str) -> tuple[Callable[..., object], tuple[object, ...]]:
    """``__reduce__`` of an attrs weight object that records its tensors (:func:`record_built`): refuse one written
    in place since it was built (its copy would run the new contents), and build the copy through the constructor,
    which checks and records the copy's own tensors."""
    kind = type(holder)
    if not attrs.has(kind):
        raise TypeError(f"{path}: only attrs weight objects are built again from their fields")
    require_unwritten_since_built(path, holder)
    fields = {field.alias: portable(getattr(holder, field.name)) for field in attrs.fields(kind) if field.init}
    return built_again, (kind, fields)
