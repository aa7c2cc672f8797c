"""The typed dispatch table: backends named by keys that carry their quant info type.

A backend registers once, at import, and gets a ``BackendKey[Q]``;
``create_runner(key, config)`` then returns a ``Runner[Q]`` with ``Q`` taken
from the key, so handing that runner another backend's quant info is a mypy
error. A backend also registers one :class:`~moe_core.conversion.Conversion`
per canonical weight format it takes; ``key.route(format)`` pairs the key
with it, and routes of one format but different ``Q`` share the type
``FormatRoute[W]``, so a scheme can list them, and choose among them by name
with :func:`select_backend`, without naming any ``Q`` and without ``Any``.

The table knows no format and names no backend. Out-of-tree backends
register through the same call and are found by the ``moe_core.backends``
entry-point group; a plugin that fails while loading is reported and leaves
nothing registered.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from importlib.metadata import entry_points
from typing import Generic, Protocol, TypeVar, final

import attrs
import torch

from moe_core.config import MoeRunnerConfig
from moe_core.conversion import AnyConversion, FormatInfo, WeightFormat
from moe_core.dispatch import DispatchOutput
from moe_core.runner import QuantInfo, Runner

ENTRY_POINT_GROUP = "moe_core.backends"
"""Entry-point group whose modules register backends when imported."""

Q = TypeVar("Q", bound=QuantInfo)
W = TypeVar("W", bound=QuantInfo)
W_contra = TypeVar("W_contra", bound=QuantInfo, contravariant=True)


def _check_reasons(instance: Availability, attribute: attrs.Attribute[tuple[str, ...]], reasons: object) -> None:
    if not isinstance(reasons, tuple) or not all(isinstance(r, str) and r for r in reasons):
        raise TypeError(f"Availability.reasons: expected a tuple of non-empty str, got {reasons!r}")


@final
@attrs.frozen
class Availability:
    """Whether a backend can run on a device: ``ok``, or the reasons it cannot.

    ``broken`` marks a backend whose own availability check raised: a faulty
    plugin, which the ``moe-core`` command reports and exits non-zero for.
    """

    reasons: tuple[str, ...] = attrs.field(default=(), validator=_check_reasons)
    broken: bool = attrs.field(default=False, kw_only=True)

    @property
    def ok(self) -> bool:
        """True when nothing stands in the way."""
        return not self.reasons

    @classmethod
    def available(cls) -> Availability:
        """The backend runs here."""
        return cls()

    @classmethod
    def unavailable(cls, reason: str, *more: str) -> Availability:
        """The backend cannot run here, for human-readable reasons."""
        return cls((reason, *more))


class MoeForward(Protocol):
    """A runner bound to its quant info: call it with a dispatch."""

    def __call__(self, dispatch: DispatchOutput, /) -> torch.Tensor:
        """The ``[T, H]`` output for ``dispatch``."""
        ...


@final
@attrs.frozen(eq=False)
class BoundRunner(Generic[Q]):
    """A ``Runner[Q]`` with the ``Q`` it runs on, as a scheme keeps them."""

    runner: Runner[Q]
    quant_info: Q

    def __call__(self, dispatch: DispatchOutput, /) -> torch.Tensor:
        """``runner.run(dispatch, quant_info)``."""
        return self.runner.run(dispatch, self.quant_info)


@final
@attrs.frozen(eq=False)
class BackendKey(Generic[Q]):
    """A registered backend whose runners take quant info of type ``Q``.

    Only :func:`register_backend` makes keys that run; they compare by identity.
    """

    name: str = attrs.field(alias="_name", kw_only=True)
    """The unique name it registered under."""
    description: str = attrs.field(alias="_description", kw_only=True)
    """One line for tables."""
    factory: Callable[[MoeRunnerConfig], Runner[Q]] = attrs.field(alias="_factory", kw_only=True)
    """Builds a runner for one layer (cheap: no weights are touched)."""
    availability_check: Callable[[torch.device], Availability] = attrs.field(alias="_availability", kw_only=True)
    """The backend's own check; call :meth:`availability`, which survives a faulty one."""
    conversions: tuple[AnyConversion[Q], ...] = attrs.field(alias="_conversions", kw_only=True)
    """One conversion per canonical format the backend takes."""

    def availability(self, device: torch.device) -> Availability:
        """Whether the backend runs on ``device``; a check that raises counts as broken, not as a crash."""
        try:
            verdict: object = self.availability_check(device)
        except Exception as error:  # a plugin's check may fail in any way: report it as the reason
            return Availability((f"availability check raised {type(error).__name__}: {error}",), broken=True)
        if not isinstance(verdict, Availability):
            return Availability((f"availability check returned {type(verdict).__name__}, not Availability",), broken=True)
        return verdict

    @property
    def formats(self) -> tuple[FormatInfo, ...]:
        """The canonical formats the backend converts from, in registration order."""
        return tuple(conversion.source for conversion in self.conversions)

    def converts_from(self, source: FormatInfo) -> bool:
        """True when the backend registered a conversion from ``source``."""
        return any(conversion.source is source for conversion in self.conversions)

    def route(self, source: WeightFormat[W]) -> Route[W, Q]:
        """This backend fed from ``source``; ``ValueError`` if it registered no conversion from it."""
        for conversion in self.conversions:
            if conversion.source is source:
                return Route(_key=self, _source=source, _conversion=conversion)
        taken = ", ".join(fmt.name for fmt in self.formats) or "none"
        raise ValueError(f"backend {self.name!r} converts from no {source.name} weights (it takes: {taken})")

    def bind(self, config: MoeRunnerConfig, quant_info: Q) -> BoundRunner[Q]:
        """A runner for ``config`` bound to ``quant_info``."""
        return BoundRunner(create_runner(self, config), quant_info)


class FormatRoute(Protocol[W_contra]):
    """A backend that can be fed canonical weights of format ``W``, its own quant info type hidden."""

    @property
    def name(self) -> str:
        """The backend's name."""
        ...

    @property
    def description(self) -> str:
        """One line for tables."""
        ...

    def availability(self, device: torch.device) -> Availability:
        """Whether the backend runs on ``device``, and if not, why."""
        ...

    def bind(self, config: MoeRunnerConfig, weights: W_contra) -> MoeForward:
        """Convert ``weights`` once into the backend's quant info and bind a runner for ``config`` to it."""
        ...


@final
@attrs.frozen(eq=False)
class Route(Generic[W, Q]):
    """A backend key with its registered conversion from format ``W``: see :meth:`BackendKey.route`."""

    key: BackendKey[Q] = attrs.field(alias="_key", kw_only=True)
    """The backend."""
    source: WeightFormat[W] = attrs.field(alias="_source", kw_only=True)
    """The canonical format it is fed from."""
    conversion: AnyConversion[Q] = attrs.field(alias="_conversion", kw_only=True)
    """The conversion the backend registered from ``source``."""

    @property
    def name(self) -> str:
        """The backend's name."""
        return self.key.name

    @property
    def description(self) -> str:
        """One line for tables."""
        return self.key.description

    def availability(self, device: torch.device) -> Availability:
        """Whether the backend runs on ``device``, and if not, why."""
        return self.key.availability(device)

    def quant_info(self, weights: W) -> Q:
        """The backend's quant info built from ``weights`` (once, after loading)."""
        return self.conversion.apply(weights)

    def bind(self, config: MoeRunnerConfig, weights: W) -> BoundRunner[Q]:
        """A runner for ``config`` bound to ``weights`` converted once."""
        return self.key.bind(config, self.quant_info(weights))


class BackendEntry(Protocol):
    """What the table tells of a registered backend, its quant info type hidden."""

    @property
    def name(self) -> str:
        """The unique name it registered under."""
        ...

    @property
    def description(self) -> str:
        """One line for tables."""
        ...

    @property
    def formats(self) -> tuple[FormatInfo, ...]:
        """The canonical formats it converts from."""
        ...

    def availability(self, device: torch.device) -> Availability:
        """Whether the backend runs on ``device``; a faulty check is reported as broken."""
        ...

    def converts_from(self, source: FormatInfo) -> bool:
        """True when the backend registered a conversion from ``source``."""
        ...

    def route(self, source: WeightFormat[W]) -> FormatRoute[W]:
        """The backend fed from ``source`` (``ValueError`` if it takes no such weights)."""
        ...


@final
@attrs.frozen(eq=False)
class _Registered(Generic[Q]):
    """The table's entry for a key: the key's erased view, so that no ``isinstance`` recovers ``BackendKey[Any]``."""

    key: BackendKey[Q]

    @property
    def name(self) -> str:
        return self.key.name

    @property
    def description(self) -> str:
        return self.key.description

    @property
    def formats(self) -> tuple[FormatInfo, ...]:
        return self.key.formats

    def availability(self, device: torch.device) -> Availability:
        return self.key.availability(device)

    def converts_from(self, source: FormatInfo) -> bool:
        return self.key.converts_from(source)

    def route(self, source: WeightFormat[W]) -> FormatRoute[W]:
        return self.key.route(source)


@final
@attrs.frozen(eq=False)
class _Slot:
    key: object
    """The key itself, compared by identity in :func:`create_runner`."""
    entry: BackendEntry


_REGISTRY: dict[str, _Slot] = {}


def register_backend(
    name: str,
    *,
    description: str,
    factory: Callable[[MoeRunnerConfig], Runner[Q]],
    availability: Callable[[torch.device], Availability],
    conversions: Sequence[AnyConversion[Q]] = (),
) -> BackendKey[Q]:
    """Add a backend to the table and return its key; a name registers once.

    ``conversions`` holds one :class:`~moe_core.conversion.Conversion` per
    canonical format the backend takes (none: callers build its quant info
    themselves). ``moe-core check`` tests the backend on each of them.
    """
    if not isinstance(name, str) or not name:
        raise ValueError(f"name: expected a non-empty str, got {name!r}")
    if name in _REGISTRY:
        raise ValueError(f"name: a backend named {name!r} is already registered")
    sources = [conversion.source for conversion in conversions]
    if len({id(source) for source in sources}) != len(sources):
        raise ValueError(f"conversions: expected one per format, got formats {[s.name for s in sources]}")
    key = BackendKey(
        _name=name,
        _description=description,
        _factory=factory,
        _availability=availability,
        _conversions=tuple(conversions),
    )
    _REGISTRY[name] = _Slot(key, _Registered(key))
    return key


def create_runner(key: BackendKey[Q], config: MoeRunnerConfig) -> Runner[Q]:
    """A runner of ``key``'s backend for one layer; its ``run`` takes only ``Q``."""
    slot = _REGISTRY.get(key.name)
    if slot is None or slot.key is not key:
        raise ValueError(f"key: backend {key.name!r} is not registered (through register_backend, by a module that loaded)")
    if not isinstance(config, MoeRunnerConfig):
        raise TypeError(f"config: expected a MoeRunnerConfig, got {type(config).__name__}")
    return key.factory(config)


def registered_backends() -> tuple[BackendEntry, ...]:
    """Every registered backend, in registration order, its quant info type hidden."""
    return tuple(slot.entry for slot in _REGISTRY.values())


class BackendChoice(Protocol):
    """Anything :func:`select_backend` chooses among: a ``BackendKey[Q]`` or a ``FormatRoute[W]``."""

    @property
    def name(self) -> str:
        """The backend's name."""
        ...

    def availability(self, device: torch.device) -> Availability:
        """Whether the backend runs on ``device``, and if not, why."""
        ...


C = TypeVar("C", bound=BackendChoice)


class BackendSelectionError(ValueError):
    """No backend fits: an unknown or unavailable name, or none available; the message lists the choices."""


@final
@attrs.frozen(eq=False)
class Selection(Generic[C]):
    """The backend :func:`select_backend` chose, and what it found for every choice."""

    chosen: C
    considered: tuple[tuple[str, Availability], ...]
    """Each choice's name and availability, in preference order."""

    def summary(self) -> str:
        """One line for a log: the choice and why earlier ones were passed over."""
        passed = [f"{name} ({'; '.join(verdict.reasons)})" for name, verdict in self.considered if not verdict.ok]
        return f"backend {self.chosen.name}" + (f"; unavailable: {', '.join(passed)}" if passed else "")


def _listing(considered: Sequence[tuple[str, Availability]]) -> str:
    return "; ".join(f"{name}: {'available' if v.ok else ', '.join(v.reasons)}" for name, v in considered)


def select_backend(choices: Sequence[C], device: torch.device, *, name: str | None = None) -> Selection[C]:
    """Choose from ``choices`` (preference order) for ``device``: the one named ``name``, or the first available.

    Typed by the choices: among ``BackendKey[Q]`` it returns a ``BackendKey[Q]``;
    among ``FormatRoute[W]`` (backends of different quant info fed from one
    canonical format), a ``FormatRoute[W]``. Raises
    :class:`BackendSelectionError` listing every choice with its reasons.
    """
    if not choices:
        raise BackendSelectionError("choices: expected at least one backend to choose from")
    considered = tuple((choice.name, choice.availability(device)) for choice in choices)
    if name is not None:
        matches = [index for index, choice in enumerate(choices) if choice.name == name]
        if not matches:
            known = ", ".join(choice.name for choice in choices)
            raise BackendSelectionError(f"unknown backend {name!r}; the choices are: {known}")
        index = matches[0]
        if not considered[index][1].ok:
            raise BackendSelectionError(
                f"backend {name!r} cannot run on {device}: {'; '.join(considered[index][1].reasons)} "
                f"(all choices: {_listing(considered)})"
            )
        return Selection(choices[index], considered)
    for index, (_, verdict) in enumerate(considered):
        if verdict.ok:
            return Selection(choices[index], considered)
    raise BackendSelectionError(f"no backend runs on {device}: {_listing(considered)}")


def load_entry_point_backends() -> dict[str, str | None]:
    """Import every module of the ``moe_core.backends`` entry-point group.

    Importing a module is what registers its backends; moe-core's own load
    first, so a plugin cannot take their names. Returns each entry point's
    name with None where it loaded, or the error that stopped it; a module
    that fails unregisters whatever it registered before failing, so one
    broken plugin is reported, hides no other and leaves nothing half-made.
    """
    outcome: dict[str, str | None] = {}
    found = sorted(entry_points(group=ENTRY_POINT_GROUP), key=lambda entry: not entry.value.startswith("moe_core."))
    for entry in found:
        before = set(_REGISTRY)
        try:
            entry.load()
        except Exception as error:  # a plugin may fail in any way: report it, load the rest
            for name in set(_REGISTRY) - before:
                del _REGISTRY[name]
            outcome[entry.name] = f"{type(error).__name__}: {error}"
        else:
            outcome[entry.name] = None
    return outcome
