"""The typed dispatch table: backends named by keys that carry their quant info type.

A backend registers once, at import, and gets a ``BackendKey[Q]``;
``create_runner(key, config)`` then returns a ``Runner[Q]`` with ``Q`` taken
from the key, so handing that runner another backend's quant info is a mypy
error. Out-of-tree backends register through the same call and are found by
the ``moe_core.backends`` entry-point group; nothing here names a backend.
"""

from __future__ import annotations

from collections.abc import Callable
from importlib.metadata import entry_points
from typing import Generic, Protocol, TypeVar

import attrs
import torch

from moe_core.config import MoeRunnerConfig
from moe_core.dispatch import DispatchOutput
from moe_core.moe_weights import Nvfp4MoeWeights
from moe_core.runner import QuantInfo, Runner

ENTRY_POINT_GROUP = "moe_core.backends"
"""Entry-point group whose modules register backends when imported."""

Q = TypeVar("Q", bound=QuantInfo)


@attrs.frozen
class Availability:
    """Whether a backend can run on a device: ``ok``, or the reasons it cannot."""

    reasons: tuple[str, ...] = ()

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

    def __call__(self, dispatch: DispatchOutput) -> torch.Tensor:
        """The ``[T, H]`` output for ``dispatch``."""
        ...


@attrs.frozen
class BoundRunner(Generic[Q]):
    """A ``Runner[Q]`` with the ``Q`` it runs on, as a scheme keeps them."""

    runner: Runner[Q]
    quant_info: Q

    def __call__(self, dispatch: DispatchOutput) -> torch.Tensor:
        """``runner.run(dispatch, quant_info)``."""
        return self.runner.run(dispatch, self.quant_info)


@attrs.frozen(eq=False)
class BackendKey(Generic[Q]):
    """A registered backend whose runners take quant info of type ``Q``.

    Compared by identity: a key is the handle ``register_backend`` returned.
    """

    name: str
    description: str
    factory: Callable[[MoeRunnerConfig], Runner[Q]]
    """Builds a runner for one layer (cheap: no weights are touched)."""
    availability: Callable[[torch.device], Availability]
    """Says whether the backend runs on a device, and if not, why."""
    from_nvfp4: Callable[[Nvfp4MoeWeights], Q] | None
    """Converts canonical NVFP4 weights into ``Q``; None if the backend runs no NVFP4."""

    def bind_nvfp4(self, config: MoeRunnerConfig, weights: Nvfp4MoeWeights) -> BoundRunner[Q] | None:
        """A runner for ``config`` bound to ``weights`` converted once, or None without NVFP4 support."""
        if self.from_nvfp4 is None:
            return None
        return BoundRunner(create_runner(self, config), self.from_nvfp4(weights))


class BackendEntry(Protocol):
    """What the table tells of a backend without naming its quant info type."""

    @property
    def name(self) -> str:
        """The unique name it registered under."""
        ...

    @property
    def description(self) -> str:
        """One line for tables."""
        ...

    @property
    def availability(self) -> Callable[[torch.device], Availability]:
        """Says whether the backend runs on a device, and if not, why."""
        ...

    def bind_nvfp4(self, config: MoeRunnerConfig, weights: Nvfp4MoeWeights) -> MoeForward | None:
        """A forward over ``weights`` converted once, or None without NVFP4 support."""
        ...


_REGISTRY: dict[str, BackendEntry] = {}


def register_backend(
    name: str,
    *,
    description: str,
    factory: Callable[[MoeRunnerConfig], Runner[Q]],
    availability: Callable[[torch.device], Availability],
    from_nvfp4: Callable[[Nvfp4MoeWeights], Q] | None = None,
) -> BackendKey[Q]:
    """Add a backend to the table and return its key; a name registers once."""
    if not isinstance(name, str) or not name:
        raise ValueError(f"name: expected a non-empty str, got {name!r}")
    if name in _REGISTRY:
        raise ValueError(f"name: a backend named {name!r} is already registered")
    key = BackendKey(name, description, factory, availability, from_nvfp4)
    _REGISTRY[name] = key
    return key


def create_runner(key: BackendKey[Q], config: MoeRunnerConfig) -> Runner[Q]:
    """A runner of ``key``'s backend for one layer; its ``run`` takes only ``Q``."""
    if _REGISTRY.get(key.name) is not key:
        raise ValueError(f"key: backend {key.name!r} was not registered through register_backend")
    if not isinstance(config, MoeRunnerConfig):
        raise TypeError(f"config: expected a MoeRunnerConfig, got {type(config).__name__}")
    return key.factory(config)


def registered_backends() -> tuple[BackendEntry, ...]:
    """Every registered backend, in registration order."""
    return tuple(_REGISTRY.values())


def load_entry_point_backends() -> dict[str, str | None]:
    """Import every module of the ``moe_core.backends`` entry-point group.

    Importing a module is what registers its backends. Returns each entry
    point's name with None where it loaded, or the error that stopped it, so
    that one broken plugin is reported rather than hiding the others.
    """
    outcome: dict[str, str | None] = {}
    for entry in entry_points(group=ENTRY_POINT_GROUP):
        try:
            entry.load()
        except Exception as error:  # a plugin may fail in any way: report it, load the rest
            outcome[entry.name] = f"{type(error).__name__}: {error}"
        else:
            outcome[entry.name] = None
    return outcome
