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

from collections.abc import Callable, Mapping, Sequence
from typing import Generic, Protocol, TypeVar, final

import attrs
import torch

from moe_core.config import MoeRunnerConfig
from moe_core.conversion import FormatInfo, WeightFormat
from moe_core.dispatch import DispatchOutput
from moe_core.expert_params import ExpertParams, ExpertShard
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


@final
class LayerBackend(Generic[W]):
    """The backend choice of one layer, and the forward bound to it after loading."""

    def __init__(self, choices: Sequence[FormatRoute[W]], forced: FormatRoute[W] | None) -> None:
        """``choices`` in preference order; ``forced`` (if given) is the only one considered."""
        self.choices: tuple[FormatRoute[W], ...] = (forced,) if forced is not None else tuple(choices)
        """What :meth:`bind` chooses from."""
        self.selection: Selection[FormatRoute[W]] | None = None
        """The choice made by :meth:`bind` (None before)."""
        self._forward: MoeForward | None = None

    def bind(self, config: MoeRunnerConfig, weights: W, device: torch.device) -> Selection[FormatRoute[W]]:
        """Choose the first available backend on ``device`` and convert ``weights`` into its quant info, once.

        Raises :class:`~moe_core.registry.BackendSelectionError` listing every
        choice with the reasons it cannot run.
        """
        selection = select_backend(self.choices, device)
        self._forward = selection.chosen.bind(config, weights)
        self.selection = selection
        return selection

    def __call__(self, dispatch: DispatchOutput) -> torch.Tensor:
        """The layer's output through the bound backend."""
        if self._forward is None:
            raise RuntimeError("apply: call process_weights_after_loading() first (no backend is bound yet)")
        return self._forward(dispatch)


class MoeScheme(Protocol):
    """One MoE layer under a quantization scheme, as an engine drives it."""

    @property
    def format(self) -> FormatInfo:
        """The canonical weight format it builds."""
        ...

    @property
    def params(self) -> ExpertParams:
        """The checkpoint parameters of this rank's experts."""
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
    for_layer: Callable[[MoeRunnerConfig, torch.device], MoeScheme]
    """The scheme for one layer, its parameters created on the device, with the default backend choice."""
    preference: Callable[[], Sequence[BackendChoice]]
    """The backends it would choose from, in preference order (for ``moe-core info``)."""
