"""Decode forwards replayed: a memo key's launches recorded once, then repeated with each call's own tensors.

A decode forward of given weights, token count, dtypes and device launches
the same kernels with the same arguments every time, except for the caller's
hidden states, top-k ids and weights and the new output: every other tensor
it hands a kernel is the weights (the memo's) or a buffer its stream and
thread keep (:mod:`.scratch`). :class:`Replays` records the launches of the
first such forward per kept scratch and repeats them with the call's tensors
in their places, without the forward's Python (the sort's sizes, the
buffers' lookups, each launch's arguments).

A forward is recorded only where repeating its launches repeats all it did:

- each torch operation it makes is an allocation or a view (anything else,
  a ``fill_`` say, refuses the record: a replay would skip it);
- each tensor it hands a kernel is one of the call's (at its start), a
  buffer its scratch keeps (at its start; the replay holds it weakly, and
  records again where the scratch has dropped it since), or memory of the
  weights. A buffer allocated for this forward alone (prefill's, a
  workspace's) refuses the record.

Every kernel of a forward is launched through its
:class:`~.launcher.Launcher`, which is what the record sees. A replay fills
its argument lists for each call and clears them after (it keeps none of the
caller's tensors); it belongs to one stream and thread's scratch, so no two
threads run it at once.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Mapping, Sequence
from typing import final

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from moe_core._checks import byte_span, overlaps
from moe_core.backends.triton.launcher import Grid, JitKernel, KernelLauncher, Statics
from moe_core.backends.triton.scratch import KeptScratch

Inputs = tuple[torch.Tensor, torch.Tensor, torch.Tensor]
"""A forward's hidden states, top-k ids and top-k weights, each contiguous."""

Forward = Callable[[Inputs, KernelLauncher], torch.Tensor]
"""One forward of the inputs through a launcher; it returns the output it allocated."""

Step = tuple[str, JitKernel, list[object], Statics, tuple[tuple[int, int], ...]]
"""One recorded launch: its site's name, the kernel, its arguments (a list whose call-dependent positions are
filled for the launch and cleared after it), its grid and constexprs, and those positions with their sources
(0-2 the inputs, 3 the output, from 4 on the kept buffers)."""

_ALLOCATIONS = frozenset({torch.ops.aten.empty.memory_format, torch.ops.aten.empty_like.default, torch.ops.aten.empty_strided.default})


class _OtherOperations(TorchDispatchMode):  # type: ignore[no-untyped-call]  # torch's __init_subclass__ is unannotated
    """Names every torch operation made under it that is neither an allocation nor a view, except while
    ``launching`` (a launch's own operations: Triton's interpreter copies its tensors)."""

    def __init__(self) -> None:
        super().__init__()  # type: ignore[no-untyped-call]  # torch's TorchDispatchMode.__init__ is unannotated
        self.found: list[str] = []
        self.launching = False

    def __torch_dispatch__(
        self, func: torch._ops.OpOverload, types: Sequence[type], args: Sequence[object] = (),
        kwargs: Mapping[str, object] | None = None,
    ) -> object:
        if not (self.launching or func.is_view or func in _ALLOCATIONS):
            self.found.append(str(func))
        return func(*args, **(kwargs or {}))


class _Recording:
    """A launcher's launches, recorded while it launches them (``guard`` told which operations are launches')."""

    __slots__ = ("guard", "launcher", "launches")

    def __init__(self, launcher: KernelLauncher, guard: _OtherOperations) -> None:
        self.launcher, self.guard = launcher, guard
        self.launches: list[tuple[str, JitKernel, tuple[object, ...], Grid, Mapping[str, object]]] = []

    def __call__(self, name: str, kernel: JitKernel, args: Sequence[object], statics: Statics) -> None:
        grid, constexprs = statics()
        self.launches.append((name, kernel, tuple(args), grid, dict(constexprs)))
        self.guard.launching = True
        try:
            self.launcher(name, kernel, args, lambda: (grid, constexprs))
        finally:
            self.guard.launching = False


def _constant(grid: Grid, constexprs: Mapping[str, object]) -> Callable[[], tuple[Grid, Mapping[str, object]]]:
    """Statics that answer what the recorded launch was given (holding none of its buffers)."""
    return lambda: (grid, constexprs)


def _within(tensor: torch.Tensor, spans: Sequence[tuple[torch.device, int, int]]) -> bool:
    """Whether ``tensor``'s bytes lie inside one of ``spans`` on its device."""
    start, stop = byte_span(tensor)
    return any(device == tensor.device and first <= start and stop <= last for device, first, last in spans)


@final
class Replay:
    """One recorded forward: its launches, where the call's tensors go in them, and the kept buffers they read."""

    __slots__ = ("_buffers", "_steps")

    def __init__(self, steps: tuple[Step, ...], buffers: tuple[weakref.ref[torch.Tensor], ...]) -> None:
        self._steps = steps
        self._buffers = buffers

    def run(self, inputs: Inputs, launcher: KernelLauncher) -> torch.Tensor | None:
        """The forward of ``inputs`` launched again through ``launcher``; None, launching nothing, where a kept
        buffer it reads was dropped since (the forward is then recorded again)."""
        buffers = [ref() for ref in self._buffers]
        if any(buffer is None for buffer in buffers):
            return None
        hidden = inputs[0]
        values = (*inputs, torch.empty_like(hidden, memory_format=torch.contiguous_format), *buffers)
        try:
            for name, kernel, args, statics, places in self._steps:
                for position, source in places:
                    args[position] = values[source]
                launcher(name, kernel, args, statics)
        finally:
            for _, _, args, _, places in self._steps:
                for position, _ in places:
                    args[position] = None
        return values[3]


def record(
    forward: Forward, inputs: Inputs, launcher: KernelLauncher, scratch: KeptScratch, weights: Sequence[torch.Tensor]
) -> tuple[torch.Tensor, Replay | None]:
    """Run ``forward`` and record it: its output, and the replay of it, or None where a replay would not repeat all
    it did (see the module's docstring). ``weights``: the tensors its memo entry holds."""
    guard = _OtherOperations()
    recording = _Recording(launcher, guard)
    with guard:
        out = forward(inputs, recording)
    if guard.found or any(tensor.numel() == 0 for tensor in (*inputs, out)):
        return out, None
    given = (*inputs, out)
    starts = {(tensor.data_ptr(), tensor.dtype): index for index, tensor in enumerate(given)}
    if len(starts) < len(given) or any(overlaps(one, other) for i, one in enumerate(given) for other in given[i + 1:]):
        return out, None  # the call's tensors overlap: which one an argument was could not be told
    held = [(tensor.device, *byte_span(tensor)) for tensor in weights if tensor.numel() > 0]
    buffers: list[torch.Tensor] = []
    steps: list[Step] = []
    for name, kernel, args, grid, constexprs in recording.launches:
        places: list[tuple[int, int]] = []
        for position, arg in enumerate(args):
            if not isinstance(arg, torch.Tensor):
                continue
            if arg.numel() == 0:
                return out, None
            source = starts.get((arg.data_ptr(), arg.dtype))
            if source is None:
                if any(overlaps(arg, tensor) for tensor in given):
                    return out, None  # inside a call's tensor, not at its start
                kept = scratch.buffer_at(arg)
                if kept is None:
                    if _within(arg, held):
                        continue
                    return out, None  # a buffer of this forward alone
                source = next((4 + i for i, buffer in enumerate(buffers) if buffer is kept), 4 + len(buffers))
                if source == 4 + len(buffers):
                    buffers.append(kept)
            places.append((position, source))
        filled = {position for position, _ in places}
        template: list[object] = [None if i in filled else arg for i, arg in enumerate(args)]
        steps.append((name, kernel, template, _constant(grid, constexprs), tuple(places)))
    return out, Replay(tuple(steps), tuple(weakref.ref(buffer) for buffer in buffers))


RECORDINGS = 3
"""The most times one memo key records its forward for one kept scratch: a replay whose kept buffers keep being
dropped (decode forwards of many shapes over :data:`~.scratch.KEPT_BYTES`) would record every call, each slower
than the forward itself, so after this many the forward runs as itself."""


@final
class Replays:
    """One memo key's replays, one per kept scratch (stream and thread), while that scratch lives."""

    __slots__ = ("_by_scratch", "_recordings", "_weights")

    def __init__(self, weights: Sequence[torch.Tensor]) -> None:
        self._weights = tuple(weights)
        self._by_scratch: weakref.WeakKeyDictionary[KeptScratch, Replay | None] = weakref.WeakKeyDictionary()
        self._recordings: weakref.WeakKeyDictionary[KeptScratch, int] = weakref.WeakKeyDictionary()

    def recorded(self) -> list[Replay | None]:
        """The replay recorded per live kept scratch, None where the forward could not be (or was recorded
        :data:`RECORDINGS` times)."""
        return list(self._by_scratch.values())

    def run(self, forward: Forward, inputs: Inputs, launcher: KernelLauncher, scratch: KeptScratch) -> torch.Tensor:
        """``forward(inputs, launcher)``: replayed where it was recorded for ``scratch``, recorded where it was not
        (a forward that cannot be replayed runs as itself from then on)."""
        if scratch in self._by_scratch:
            replay = self._by_scratch[scratch]
            if replay is None:
                return forward(inputs, launcher)
            out = replay.run(inputs, launcher)
            if out is not None:
                return out
        recordings = self._recordings[scratch] = self._recordings.get(scratch, 0) + 1
        if recordings > RECORDINGS:
            self._by_scratch[scratch] = None
            return forward(inputs, launcher)
        out, self._by_scratch[scratch] = record(forward, inputs, launcher, scratch, self._weights)
        return out
