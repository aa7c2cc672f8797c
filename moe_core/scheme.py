"""What a quantization scheme is to the engine, and the backend choice every scheme shares.

A scheme owns one MoE layer: it creates the layer's checkpoint parameters
(:class:`~moe_core.expert_params.ExpertParams`), takes the checkpoint's
tensors one expert and one shard at a time, builds the canonical weights of
its format once after loading, converts them into the chosen backend's quant
info through that backend's registered conversion, and applies the layer by
calling the bound runner: no kernel call of its own.

Backends are chosen among ``FormatRoute[W]``, the backends fed from the
scheme's canonical format ``W``: a forced one that takes another format is a
mypy error at the call site.
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Mapping, Sequence
from typing import Generic, Protocol, TypeVar, final

import attrs
import torch

from moe_core.config import MoeRunnerConfig
from moe_core.conversion import FormatInfo, WeightFormat
from moe_core.dispatch import DispatchOutput
from moe_core.expert_params import ExpertParams, ExpertShard, ParamSpec
from moe_core.registry import BackendChoice, FormatRoute, MoeForward, Selection, registered_backends, select_backend
from moe_core.runner import QuantInfo

W = TypeVar("W", bound=QuantInfo)


class UnsupportedCheckpoint(ValueError):
    """A checkpoint whose quantization config (or contents) the scheme does not take; the message says why."""


def backends_for(source: WeightFormat[W], preference: Sequence[str]) -> list[FormatRoute[W]]:
    """Every registered backend fed from ``source``: those named in ``preference`` first, in that order.

    Backends the preference does not name (plugins) follow in registration
    order, so a new backend is a choice without editing any scheme.
    """
    entries = [entry for entry in registered_backends() if entry.converts_from(source)]
    rank = {name: index for index, name in enumerate(preference)}
    entries.sort(key=lambda entry: rank.get(entry.name, len(rank)))
    return [entry.route(source) for entry in entries]


class ExpertScheme(abc.ABC, Generic[W]):
    """The part every scheme shares: parameters, the per-expert loader, the backend choice and the forward.

    A scheme subclasses it with its checkpoint tensors (:class:`ParamSpec`)
    and :meth:`canonical_weights`, the once-after-loading step from those
    tensors to the canonical weights of its format ``W``.
    """

    def __init__(
        self,
        name: str,
        source: WeightFormat[W],
        specs: Sequence[ParamSpec],
        config: MoeRunnerConfig,
        device: torch.device,
        *,
        preference: Sequence[str],
        backends: Sequence[FormatRoute[W]] | None,
        backend: FormatRoute[W] | None,
    ) -> None:
        """Create the parameters on ``device``; ``backend`` forces one, ``backends`` replaces the default list."""
        if not isinstance(config, MoeRunnerConfig):
            raise TypeError(f"config: expected a MoeRunnerConfig, got {type(config).__name__}")
        self.name = name
        """The scheme's short name."""
        self.config = config
        """The layer, as this rank sees it."""
        self._source = source
        self._params = ExpertParams(name, specs, config, device)
        self._preference = tuple(preference)
        self._backends = None if backends is None else tuple(backends)
        self._forced = backend
        self.weights: W | None = None
        """The canonical weights, once :meth:`process_weights_after_loading` has built them."""
        self.selection: Selection[FormatRoute[W]] | None = None
        """The backend choice, once made."""
        self._forward: MoeForward | None = None

    @property
    def format(self) -> WeightFormat[W]:
        """The canonical weight format the scheme builds."""
        return self._source

    @property
    def params(self) -> ExpertParams:
        """The checkpoint parameters of this rank's experts."""
        return self._params

    def backend_choices(self) -> tuple[FormatRoute[W], ...]:
        """What the scheme chooses from, in preference order: the forced backend alone, if any."""
        if self._forced is not None:
            return (self._forced,)
        if self._backends is not None:
            return self._backends
        return tuple(backends_for(self._source, self._preference))

    def load_expert_weight(self, name: str, tensor: torch.Tensor, *, expert_id: int, shard: ExpertShard) -> bool:
        """Take one checkpoint tensor (``experts.{expert_id}.{shard}.{name}``); False if the expert is not local."""
        return self._params.load(name, tensor, expert_id=expert_id, shard=shard)

    @abc.abstractmethod
    def canonical_weights(self) -> W:
        """The canonical weights from the loaded parameters (all of them are loaded when this runs)."""

    def process_weights_after_loading(self) -> None:
        """Build the canonical weights, choose the first available backend and convert them into its quant info.

        Raises for a missing tensor (by name), for checkpoint values the
        scheme's policies refuse, and with every choice's reasons when no
        backend runs on the parameters' device.
        """
        self._params.require_complete()
        weights = self.canonical_weights()
        selection = select_backend(self.backend_choices(), self._params.device)
        self._forward = selection.chosen.bind(self.config, weights)
        self.weights, self.selection = weights, selection

    def apply(self, dispatch: DispatchOutput) -> torch.Tensor:
        """The layer's ``[T, H]`` output through the chosen backend's runner."""
        if self._forward is None:
            raise RuntimeError(f"{self.name}: call process_weights_after_loading() before apply()")
        return self._forward(dispatch)

    def backend_summary(self) -> str:
        """One line for a log: the backend chosen and why earlier ones were passed over."""
        if self.selection is None:
            return f"{self.name}: no backend chosen yet"
        return f"{self.name}: {self.selection.summary()}"


class MoeScheme(Protocol):
    """One MoE layer under a quantization scheme, as an engine drives it."""

    @property
    def config(self) -> MoeRunnerConfig:
        """The layer, as this rank sees it."""
        ...

    @property
    def format(self) -> FormatInfo:
        """The canonical weight format it builds."""
        ...

    @property
    def params(self) -> ExpertParams:
        """The checkpoint parameters of this rank's experts."""
        ...

    @property
    def weights(self) -> QuantInfo | None:
        """The canonical weights once processed (None before)."""
        ...

    def load_expert_weight(self, name: str, tensor: torch.Tensor, *, expert_id: int, shard: ExpertShard) -> bool:
        """Take one checkpoint tensor (``experts.{expert_id}.{shard}.{name}``); False if the expert is not local."""
        ...

    def process_weights_after_loading(self) -> None:
        """Build the canonical weights, choose a backend and convert them into its quant info, once."""
        ...

    def apply(self, dispatch: DispatchOutput) -> torch.Tensor:
        """The layer's ``[T, H]`` output through the chosen backend."""
        ...

    def backend_summary(self) -> str:
        """One line for a log: the backend chosen and why earlier ones were passed over."""
        ...


@final
@attrs.frozen(eq=False)
class SchemeSpec:
    """A scheme as the checkpoint loader and ``moe-core`` see it: its name, what it takes, how to make one."""

    name: str
    """Short name, e.g. ``compressed-tensors-w4a4-nvfp4``."""
    format: FormatInfo
    """The canonical weight format it builds."""
    unsupported_reason: Callable[[Mapping[str, object] | None], str | None]
    """Why the scheme does not take a checkpoint with this ``quantization_config`` (None: it does)."""
    for_layer: Callable[[MoeRunnerConfig, torch.device, torch.dtype], MoeScheme]
    """The scheme for one layer, its parameters created on the device, with the default backend choice;
    the dtype is the checkpoint's unquantized dtype (what an unquantized scheme stores)."""
    preference: Callable[[], Sequence[BackendChoice]]
    """The backends it would choose from, in preference order (for ``moe-core info``)."""
