"""What selection asks a backend: can you run this layer on this device, and where do you rank?

A backend answers ``supports(device, layer)`` with a :class:`Support`: ok,
or the named reasons it cannot run that layer there. ``device`` is a
:class:`DeviceSpec`, a value built from a live ``torch.device`` or described
(``sm90``, ``sm100``, ``cpu``), so CI and a laptop can say what an H200 or a
B200 would run; ``layer`` is a :class:`LayerSpec`, what a backend needs to
judge one layer (its config, format and activation dtype). Each backend
declares its :class:`Priority` at registration; selection walks the
candidates of a layer's format in that order and takes the first that fits.
"""

from __future__ import annotations

import enum
import importlib.util
import os
import re
from typing import final

import attrs
import torch

from moe_core.config import MoeRunnerConfig
from moe_core.conversion import FormatInfo

CUDA_BRINGS = frozenset({"triton"})
"""Packages a CUDA build of torch installs with it: a described CUDA device has them unless told otherwise."""


def _check_reasons(instance: Support, attribute: attrs.Attribute[tuple[str, ...]], reasons: object) -> None:
    if not isinstance(reasons, tuple) or not all(isinstance(r, str) and r for r in reasons):
        raise TypeError(f"Support.reasons: expected a tuple of non-empty str, got {reasons!r}")


@final
@attrs.frozen
class Support:
    """A backend's answer for one layer on one device: ``ok``, or the reasons it cannot run it.

    ``by_name_only`` marks a backend that runs but that selection by rank
    passes over (Triton's CPU interpreter: exact but slow, for tests); an
    explicit choice by name still takes it. ``broken`` marks a backend whose
    own check raised or that failed to load: a faulty plugin, which
    ``moe-core`` reports and exits non-zero for.
    """

    reasons: tuple[str, ...] = attrs.field(default=(), validator=_check_reasons)
    by_name_only: str | None = attrs.field(default=None, kw_only=True)
    broken: bool = attrs.field(default=False, kw_only=True)

    @property
    def ok(self) -> bool:
        """True when nothing stands in the way."""
        return not self.reasons

    @property
    def ranked(self) -> bool:
        """True when selection by rank may take it: ok, and not only by name."""
        return self.ok and self.by_name_only is None

    @classmethod
    def yes(cls) -> Support:
        """The backend runs the layer here."""
        return cls()

    @classmethod
    def no(cls, reason: str, *more: str) -> Support:
        """The backend cannot run the layer here, for human-readable reasons."""
        return cls((reason, *more))

    @classmethod
    def of(cls, reasons: list[str] | tuple[str, ...]) -> Support:
        """Ok when ``reasons`` is empty, else refused for them."""
        return cls(tuple(reasons))

    def combine(self, other: Support) -> Support:
        """Both answers at once: every reason of either, broken if either is."""
        return Support(
            self.reasons + other.reasons,
            by_name_only=self.by_name_only or other.by_name_only,
            broken=self.broken or other.broken,
        )

    def describe(self) -> str:
        """``ok``, ``ok by name only (...)``, or the reasons joined."""
        if not self.ok:
            return "; ".join(self.reasons)
        return "ok" if self.by_name_only is None else f"by name only: {self.by_name_only}"


class Tier(enum.IntEnum):
    """What kind of backend this is, in the order selection prefers them."""

    KERNEL = 0
    """A fast kernel, the reason to run moe-core on this device."""
    FALLBACK = 1
    """Correct and faster than the oracle, but not what a serving engine wants when a kernel fits."""
    ORACLE = 2
    """A reference written for clarity (float32 math, one expert at a time): the truth the others are checked against."""


@final
@attrs.frozen
class Priority:
    """Where a backend ranks among the candidates of a format: by tier, then ``order`` (lower first)."""

    tier: Tier
    order: int = 0
    """Among backends of one tier; registration order breaks ties."""

    def __attrs_post_init__(self) -> None:
        if not isinstance(self.tier, Tier):
            raise TypeError(f"Priority.tier: expected a Tier, got {self.tier!r}")
        if isinstance(self.order, bool) or not isinstance(self.order, int):
            raise TypeError(f"Priority.order: expected an int, got {self.order!r}")


_DESCRIBED = re.compile(r"^sm(?P<major>[1-9]\d*)(?P<minor>\d)$")
ARCHITECTURES: frozenset[tuple[int, int]] = frozenset(
    {(7, 0), (7, 5), (8, 0), (8, 6), (8, 7), (8, 9), (9, 0), (10, 0), (10, 1), (10, 3), (11, 0), (12, 0), (12, 1)}
)
"""The CUDA compute capabilities a described device may name (``sm90``, ``sm100``, ...): a typo such as ``sm900``
is refused instead of describing a GPU that does not exist."""
KNOWN_PACKAGES: frozenset[str] = frozenset({"flashinfer", "triton"})
"""Optional packages moe-core's backends ask about; a described device may also name any package installed here
(a plugin's), and nothing else (``+flashinfr`` is refused, not read as a device without FlashInfer)."""
_PACKAGE_TERM = re.compile(r"([+-])([A-Za-z_][\w.-]*)")


def _installed(package: str) -> bool:
    try:
        return importlib.util.find_spec(package) is not None
    except (ImportError, ValueError):  # a dotted name whose parent is missing, or an empty one
        return False


def interpreter_requested() -> bool:
    """True when ``TRITON_INTERPRET=1`` asks for Triton's CPU interpreter."""
    return os.environ.get("TRITON_INTERPRET") == "1"


@final
@attrs.frozen
class DeviceSpec:
    """A device as backends judge it: kind, compute capability and the optional packages present.

    Build one with :meth:`of` from a live ``torch.device``, or :meth:`parse`
    from a description (``cpu``, ``sm90``, ``sm100+flashinfer``,
    ``sm90-flashinfer``): a described device needs no such device present.
    Packages not named in ``with_packages``/``without_packages`` are looked
    up in this Python (importable or not); a described CUDA device has
    :data:`CUDA_BRINGS` too.
    """

    kind: str
    """``cpu``, ``cuda``, ``meta``, or another torch device type."""
    capability: tuple[int, int] | None = None
    """The CUDA compute capability; None for other kinds, or a CUDA device torch does not see."""
    name: str = ""
    """For tables: the GPU's name, or how the device was described."""
    live: bool = False
    """True for a device present in this process (built by :meth:`of`)."""
    with_packages: frozenset[str] = frozenset()
    without_packages: frozenset[str] = frozenset()
    triton_interpreter: bool = False
    """Triton's CPU interpreter is on (``TRITON_INTERPRET=1``)."""

    def __attrs_post_init__(self) -> None:
        """Refuse what describes no device: a kind torch does not know, a described GPU of no CUDA architecture,
        packages neither moe-core's nor installed here, a package both with and without."""
        try:
            torch.device(self.kind)
        except (RuntimeError, TypeError) as error:
            raise ValueError(f"DeviceSpec.kind: {self.kind!r} is not a torch device type ({error})") from None
        if self.capability is not None and not self.live and self.capability not in ARCHITECTURES:
            known = ", ".join(f"sm{major}{minor}" for major, minor in sorted(ARCHITECTURES))
            raise ValueError(
                f"no CUDA GPU is sm{self.capability[0]}{self.capability[1]} (described GPUs: {known})"
            )
        for name in sorted(self.with_packages | self.without_packages):
            if name not in KNOWN_PACKAGES and not _installed(name):
                raise ValueError(
                    f"unknown package {name!r} (expected one of {', '.join(sorted(KNOWN_PACKAGES))}, "
                    "or a package installed here)"
                )
        both = self.with_packages & self.without_packages
        if both:
            raise ValueError(f"{', '.join(sorted(both))} both with and without")

    def has(self, package: str) -> bool:
        """Whether the optional ``package`` (an import name, e.g. ``triton``) is there for this device."""
        if package in self.without_packages:
            return False
        return package in self.with_packages or _installed(package)

    @property
    def is_cuda(self) -> bool:
        """A CUDA GPU that torch sees (live) or that was described."""
        return self.kind == "cuda" and self.capability is not None

    def capability_text(self) -> str:
        """``SM90``, or what stands in for a capability."""
        if self.capability is None:
            return "no CUDA GPU" if self.kind == "cuda" else self.kind
        return f"SM{self.capability[0]}{self.capability[1]}"

    def describe(self) -> str:
        """One line for headers."""
        if self.kind != "cuda":
            return self.name or self.kind
        return f"{self.capability_text()} ({self.name})" if self.name else self.capability_text()

    @classmethod
    def of(cls, device: torch.device) -> DeviceSpec:
        """The spec of a live device (reads the GPU's capability from torch)."""
        if not isinstance(device, torch.device):
            raise TypeError(f"device: expected a torch.device, got {type(device).__name__}")
        interpreter = interpreter_requested()
        if device.type != "cuda":
            return cls(device.type, name=str(device), live=True, triton_interpreter=interpreter)
        if not torch.cuda.is_available():
            return cls("cuda", name=f"{device}: torch sees no CUDA device", live=True, triton_interpreter=interpreter)
        index = device.index if device.index is not None else torch.cuda.current_device()
        capability = torch.cuda.get_device_capability(index)
        return cls(
            "cuda",
            (int(capability[0]), int(capability[1])),
            name=torch.cuda.get_device_name(index),
            live=True,
            triton_interpreter=interpreter,
        )

    @classmethod
    def parse(cls, text: str) -> DeviceSpec:
        """A device from text: a torch device (``cpu``, ``cuda:0``: live) or a description (``sm90``, ``sm100``).

        ``+package`` / ``-package`` after it say which optional packages the
        described device has (``sm100+flashinfer``, ``sm90-flashinfer``).
        ``ValueError`` naming the text for anything else.
        """
        if not isinstance(text, str):
            raise TypeError(f"device: expected a str, got {type(text).__name__}")
        base = re.split(r"[+-](?=[A-Za-z_])", text, maxsplit=1)[0]
        terms = text[len(base):]
        if _PACKAGE_TERM.sub("", terms):
            raise ValueError(f"device {text!r}: expected packages as +name or -name after {base!r}, got {terms!r}")
        described = _DESCRIBED.match(base.lower())
        device: torch.device | None = None
        if described is None:
            try:
                device = torch.device(base)
            except RuntimeError as error:
                raise ValueError(
                    f"device {text!r}: expected a torch device (cpu, cuda, cuda:0) or a described GPU (sm80, sm90, "
                    f"sm100, sm120), optionally with +package/-package ({error})"
                ) from None
        named = [(sign, name.lower()) for sign, name in _PACKAGE_TERM.findall(terms)]
        with_packages = frozenset(name for sign, name in named if sign == "+")
        without_packages = frozenset(name for sign, name in named if sign == "-")
        try:
            if device is not None:
                return attrs.evolve(cls.of(device), with_packages=with_packages, without_packages=without_packages)
            assert described is not None  # one of the two, or raised above
            return cls(
                "cuda",
                (int(described["major"]), int(described["minor"])),
                name=f"described as {text}",
                with_packages=(CUDA_BRINGS - without_packages) | with_packages,
                without_packages=without_packages,
                triton_interpreter=interpreter_requested(),
            )
        except ValueError as error:
            raise ValueError(f"device {text!r}: {error}") from None


@final
@attrs.frozen
class LayerSpec:
    """What a backend needs to judge one layer: its config, its weight format and the activations' dtype."""

    config: MoeRunnerConfig
    format: FormatInfo
    dtype: torch.dtype = torch.bfloat16
    """The hidden states' dtype."""

    def __attrs_post_init__(self) -> None:
        if not isinstance(self.config, MoeRunnerConfig):
            raise TypeError(f"LayerSpec.config: expected a MoeRunnerConfig, got {type(self.config).__name__}")
        if not isinstance(self.dtype, torch.dtype):
            raise TypeError(f"LayerSpec.dtype: expected a torch.dtype, got {self.dtype!r}")

    def with_format(self, fmt: FormatInfo) -> LayerSpec:
        """The same layer, its weights in ``fmt`` (a degradation's target)."""
        return attrs.evolve(self, format=fmt)
