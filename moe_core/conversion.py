"""Canonical weight formats and the typed conversions backends register from them.

A scheme holds its layer's weights in one canonical format after loading
(:mod:`moe_core.formats` holds moe-core's; a new format is one more
:class:`WeightFormat` anywhere, with no change here or in the registry). A
backend says which formats it takes by registering one :class:`Conversion`
per format, the once-after-loading step from those canonical weights to its
own quant info.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Generic, Protocol, TypeVar, final

import attrs

from moe_core.runner import QuantInfo

W = TypeVar("W", bound=QuantInfo)
W_co = TypeVar("W_co", bound=QuantInfo, covariant=True)
W_contra = TypeVar("W_contra", bound=QuantInfo, contravariant=True)
V_co = TypeVar("V_co", bound=QuantInfo, covariant=True)
Q = TypeVar("Q", bound=QuantInfo)
Q_co = TypeVar("Q_co", bound=QuantInfo, covariant=True)


class FormatInfo(Protocol):
    """What is known of a format without its weights type: enough to name it and compare it by identity."""

    @property
    def name(self) -> str:
        """Short name, e.g. ``nvfp4``."""
        ...

    @property
    def description(self) -> str:
        """One line for tables."""
        ...


@final
@attrs.frozen(eq=False)
class WeightFormat(Generic[W_co]):
    """A canonical weight format: a name and the class that holds such weights.

    Compared by identity: each format is one module-level object.
    """

    name: str
    weights_type: type[W_co]
    """The canonical weights class (it is also the format's reference quant info)."""
    description: str
    degradations: tuple[Degradation[W_co, QuantInfo], ...] = ()
    """Other formats its weights may run as where none of its own backends fits, in preference order."""

    def narrow(self, weights: object) -> W_co:
        """``weights`` typed as this format's class; ``TypeError`` if they are another's."""
        if not isinstance(weights, self.weights_type):
            raise TypeError(
                f"weights: the {self.name} format takes {self.weights_type.__name__}, got {type(weights).__name__}"
            )
        return weights


@final
@attrs.frozen(eq=False)
class Conversion(Generic[W, Q]):
    """How a backend builds its quant info ``Q`` from canonical weights of one format ``W``."""

    source: WeightFormat[W]
    convert: Callable[[W], Q]
    """Runs once after loading (shuffles, swizzles, precomputes alphas); never per forward."""

    def apply(self, weights: object) -> Q:
        """``convert(weights)``, after checking at run time that ``weights`` are in ``source``'s format."""
        return self.convert(self.source.narrow(weights))

    def source_format(self) -> WeightFormat[QuantInfo]:
        """:attr:`source` with its weights type widened, for selection over every format."""
        return self.source


class AnyConversion(Protocol[Q_co]):
    """A :class:`Conversion` to ``Q`` seen without its source type, as a backend's registration holds it."""

    @property
    def source(self) -> FormatInfo:
        """The format converted from."""
        ...

    def source_format(self) -> WeightFormat[QuantInfo]:
        """:attr:`source` with its weights type widened, for selection over every format."""
        ...

    def apply(self, weights: object) -> Q_co:
        """Convert ``weights``, checked at run time to be in ``source``'s format."""
        ...



@final
@attrs.frozen(eq=False)
class Degradation(Generic[W_contra, V_co]):
    """A named step from one format to another that computes differently, declared by the source format.

    Selection takes it only where no backend of the source format fits,
    shows it wherever the choice is shown, and a strict selection forbids
    it. E.g. NVFP4 W4A4 -> W4A16 where no W4A4 kernel runs: the same
    weights, the activations left in 16 bits.
    """

    target: WeightFormat[V_co]
    reason: str
    """What it costs, for tables (one line)."""
    convert: Callable[[W_contra], V_co]
    """Runs once after loading; shares tensors with its input where it can."""
