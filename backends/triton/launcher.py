"""Repeated launches of a Triton kernel without Triton's per-call argument binding.

``kernel[grid](*args, **constexprs)`` binds every argument, works out its
specialization (dtypes, integers equal to 1 or divisible by 16, pointers
aligned to 16 bytes) and looks the binary up, on every call: 13 us of host
time per launch on an H100 machine, against 6 us for launching the binary
it returned directly (``benchmarks/RESULTS.md``, 2026-12-07). A
forward launches each kernel with the same grid, constexprs and
specialization for a given token count, dtypes and weights, so a
:class:`LaunchSite` keeps the binary of its first launch and launches it
directly after that.

The caller (:class:`~.runner.TritonRunner`'s memo of forwards) keeps one set
of sites per (weights, tokens, dtypes, device), and launches directly only
where the caller's tensors are aligned and laid out as the memo's key says
(:func:`direct_launches`). Under Triton's interpreter every launch goes
through Triton. A direct launch passes Triton's launch hooks (a profiler's)
and their metadata as Triton's own launch does.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Protocol, final, runtime_checkable

import torch
import triton

from moe_core.backends.triton.kernels import INTERPRETED

Grid = tuple[int] | tuple[int, int] | tuple[int, int, int]

Target = tuple[int, int]
"""Where a direct launch goes: the current device and its current stream's handle, asked once per forward."""

Statics = Callable[[], tuple[Grid, Mapping[str, object]]]
"""A launch's grid and constexprs (``num_warps`` and ``num_stages`` among them), asked for only when Triton binds it."""


class JitKernel(Protocol):
    """A ``@triton.jit`` function, as this module uses it."""

    @property
    def arg_names(self) -> list[str]:
        """Its parameters' names, in order."""
        ...

    def __getitem__(self, grid: Grid) -> Callable[..., object]:
        """The launcher of ``grid``: called with the arguments, it launches and returns the compiled binary."""
        ...


@runtime_checkable
class _Binary(Protocol):
    """A compiled kernel (``triton.compiler.CompiledKernel``), as a direct launch reads it."""

    function: object
    packed_metadata: object
    run: Callable[..., object]

    def _init_handles(self) -> None:
        """Load the binary onto the current device (once)."""
        ...

    def launch_metadata(self, grid: Grid, stream: int, *args: object) -> object:
        """What the launch hooks are given (None where none is set)."""
        ...


class KernelLauncher(Protocol):
    """How a forward's code launches each kernel: a :class:`Launcher`, or a recording of one (:mod:`.replay`)."""

    def __call__(self, name: str, kernel: JitKernel, args: Sequence[object], statics: Statics) -> None:
        """Launch ``kernel`` with ``args`` at the forward's site ``name``; ``statics`` gives the grid and constexprs."""
        ...


def _current_device() -> int:
    """The device Triton launches on: the current one."""
    device: int = triton.runtime.driver.active.get_current_device()
    return device


def _current_stream(device: int) -> int:
    """The current stream's handle on ``device`` (CUDA graph capture included)."""
    stream: int = triton.runtime.driver.active.get_current_stream(device)
    return stream


def _never(*args: object) -> object:
    """A site's launcher before it keeps a binary (never called: the binary is checked first)."""
    raise AssertionError("no binary kept")


def direct_launches(tensors: Sequence[torch.Tensor]) -> bool:
    """Whether this forward's sites may launch their kept binaries: not interpreted, and every tensor the caller
    handed in aligned to 16 bytes (the buffers a forward allocates always are, the weights are the memo's own);
    otherwise Triton binds each launch as usual."""
    if INTERPRETED:
        return False
    return all(tensor.data_ptr() % 16 == 0 for tensor in tensors)


@final
class LaunchSite:
    """One launch of one kernel in a forward, with the binary of its first launch through Triton.

    The caller's contract: every launch through a site passes the same
    constexprs and grid, and positional arguments of the same kinds (tensor
    dtypes, integers' specialization) as the first; its memo key says so.
    Pointer alignment is checked by :func:`direct_launches`.
    """

    __slots__ = ("_binary", "_device", "_dims", "_run", "_tail")

    def __init__(self) -> None:
        self._binary: _Binary | None = None
        self._run: Callable[..., object] = _never
        self._device = -1
        self._dims = (1, 1, 1)
        self._tail: tuple[object, ...] = ()

    @property
    def kept(self) -> bool:
        """Whether the site holds a binary to launch directly."""
        return self._binary is not None

    def launch(self, kernel: JitKernel, args: Sequence[object], statics: Statics, target: Target | None) -> None:
        """``kernel[grid](*args, **constexprs)``; with a ``target`` (direct launches allowed), the kept binary where
        there is one for its device."""
        binary = self._binary
        if target is not None and binary is not None:
            device, stream = target
            if device == self._device:
                full, dims = (*args, *self._tail), self._dims
                hooks = triton.knobs.runtime
                self._run(
                    dims[0], dims[1], dims[2], stream, binary.function, binary.packed_metadata,
                    binary.launch_metadata(dims, stream, *full), hooks.launch_enter_hook, hooks.launch_exit_hook, *full,
                )
                return
        grid, constexprs = statics()
        launched = kernel[grid](*args, **constexprs)
        if target is not None:
            self._keep(kernel, launched, grid, len(args), constexprs, target[0])

    def _keep(
        self, kernel: JitKernel, binary: object, grid: Grid, runtime_args: int, constexprs: Mapping[str, object],
        device: int,
    ) -> None:
        """Keep ``binary`` if it is a compiled kernel whose launcher takes the constexprs after the runtime arguments
        (Triton's own launch passes every parameter in order); otherwise the site keeps going through Triton."""
        names = kernel.arg_names[runtime_args:]
        options = {"num_warps", "num_stages"}
        if not isinstance(binary, triton.compiler.CompiledKernel) or not isinstance(binary, _Binary):
            return
        if set(names) != set(constexprs) - options:
            return
        binary._init_handles()
        dims = (*grid, 1, 1)
        self._dims = (dims[0], dims[1], dims[2])
        self._tail = tuple(constexprs[name] for name in names)
        self._device = device
        self._binary, self._run = binary, binary.run


def current_target() -> Target:
    """The current device and stream (the interpreter's: 0 and 0)."""
    if INTERPRETED:
        return 0, 0
    device = _current_device()
    return device, _current_stream(device)


@final
class Launcher:
    """How one forward launches its kernels: through Triton (``sites`` None), or through the memo's sites by name,
    directly where ``direct`` (:func:`direct_launches`) allows, on ``target`` (:func:`current_target` by default)."""

    __slots__ = ("_sites", "_target")

    def __init__(
        self, sites: dict[str, LaunchSite] | None = None, direct: bool = False, target: Target | None = None
    ) -> None:
        self._sites = sites
        self._target = (target or current_target()) if direct else None

    def __call__(self, name: str, kernel: JitKernel, args: Sequence[object], statics: Statics) -> None:
        """Launch ``kernel`` at the forward's site ``name`` (one kernel per name)."""
        sites = self._sites
        if sites is None:
            grid, constexprs = statics()
            kernel[grid](*args, **constexprs)
            return
        site = sites.get(name)
        if site is None:
            site = sites[name] = LaunchSite()
        site.launch(kernel, args, statics, self._target)


THROUGH_TRITON = Launcher()
"""Every launch bound by Triton (callers outside a runner's memo: tests, the tuner)."""
