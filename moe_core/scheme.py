"""What a quantization scheme is to the engine, and the backend choice every scheme shares.

A scheme owns one MoE layer: it creates the layer's checkpoint parameters
(:class:`~moe_core.expert_params.ExpertParams`), takes the checkpoint's
tensors one expert and one shard at a time, builds the canonical weights of
its format once after loading, converts them into the chosen backend's quant
info through that backend's registered conversion, and applies the layer by
calling the bound runner: no kernel call of its own.

The backend is chosen by capability (:func:`~moe_core.registry.choose`):
the first candidate of the scheme's format, in the backends' declared rank,
that runs this layer on the parameters' device, through a named degradation
between formats where none of the format's own fits (unless ``strict``).
A forced backend is a name (checked at run time, with every choice's
reasons) or a ``FormatRoute[W]`` (one fed from another format is a mypy
error at the call site). After processing, the layer holds its weights once,
in the chosen backend's layout: the checkpoint parameters are released and,
unless asked to keep them, so are the canonical weights.
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Mapping, Sequence
from typing import Generic, Protocol, TypeVar, final

import attrs
import torch

from moe_core._checks import FLOAT_DTYPES
from moe_core.capability import LayerSpec
from moe_core.config import MoeRunnerConfig
from moe_core.conversion import FormatInfo, WeightFormat
from moe_core.dispatch import DispatchOutput
from moe_core.expert_params import ExpertParams, ExpertShard, ParamSpec
from moe_core.registry import BackendSelectionError, FormatRoute, MoeForward, Selection, candidates, choose, select_backend
from moe_core.runner import QuantInfo

W = TypeVar("W", bound=QuantInfo)


class UnsupportedCheckpoint(ValueError):
    """A checkpoint whose quantization config (or contents) the scheme does not take; the message says why."""


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
        backend: FormatRoute[W] | str | None,
        strict: bool,
        activation_dtype: torch.dtype,
    ) -> None:
        """Create the parameters on ``device``; ``backend`` forces one (a route or a name), ``strict`` forbids
        degradation between formats, ``activation_dtype`` is the hidden states' dtype backends are asked about."""
        if not isinstance(config, MoeRunnerConfig):
            raise TypeError(f"config: expected a MoeRunnerConfig, got {type(config).__name__}")
        if not isinstance(strict, bool):
            raise TypeError(f"strict: expected a bool, got {strict!r}")
        if activation_dtype not in FLOAT_DTYPES:
            raise TypeError(f"activation_dtype: expected one of {FLOAT_DTYPES}, got {activation_dtype!r}")
        self.name = name
        """The scheme's short name."""
        self.config = config
        """The layer, as this rank sees it."""
        self._source = source
        self._params = ExpertParams(name, specs, config, device)
        self._forced = backend
        self.strict = strict
        """Degradation between formats is forbidden."""
        self.activation_dtype = activation_dtype
        """The hidden states' dtype, as selection asks backends about it."""
        self.weights: W | None = None
        """The canonical weights, when :meth:`process_weights_after_loading` was asked to keep them."""
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

    @property
    def layer(self) -> LayerSpec:
        """The layer as backends judge it."""
        return LayerSpec(self.config, self._source, self.activation_dtype)

    def backend_choices(self) -> tuple[FormatRoute[W], ...]:
        """What the scheme chooses from, in rank order: the forced route alone, if any."""
        if self._forced is not None and not isinstance(self._forced, str):
            return (self._forced,)
        return tuple(candidates(self._source, strict=self.strict))

    def load_expert_weight(self, name: str, tensor: torch.Tensor, *, expert_id: int, shard: ExpertShard) -> bool:
        """Take one checkpoint tensor (``experts.{expert_id}.{shard}.{name}``); False if the expert is not local.
        Refused once the weights were processed: a scheme object is one layer."""
        self._require_unprocessed(f"load_expert_weight({name!r}, expert_id={expert_id})")
        return self._params.load(name, tensor, expert_id=expert_id, shard=shard)

    def _require_unprocessed(self, call: str) -> None:
        if self._forward is not None:
            raise RuntimeError(
                f"{self.name}.{call}: this scheme already processed its weights and released its parameters; a "
                "scheme object holds one layer: build a new one for each layer"
            )

    @abc.abstractmethod
    def canonical_weights(self) -> W:
        """The canonical weights from the loaded parameters (all of them are loaded when this runs)."""

    def choose_backend(self) -> Selection[FormatRoute[W]]:
        """The backend this layer would run on: forced, or chosen by capability (see the module's doc)."""
        device, layer = self._params.device, self.layer
        if isinstance(self._forced, str) or self._forced is None:
            return choose(self._source, device, layer, name=self._forced, strict=self.strict)
        selection = select_backend(self.backend_choices(), device, layer, name=self._forced.name)
        if self.strict and selection.degradation is not None:
            raise BackendSelectionError(f"{self.name}: strict, but the forced backend degrades {selection.degradation}")
        return selection

    def process_weights_after_loading(self, *, keep_canonical: bool = False) -> None:
        """Build the canonical weights, choose the backend, convert them once into its quant info, release the rest.

        Raises for a missing tensor (by name), for checkpoint values the
        scheme's policies refuse, and with every choice's reasons when no
        backend runs this layer on the parameters' device. ``keep_canonical``
        keeps the canonical weights in :attr:`weights` (a second copy, for
        checks against the reference).
        """
        self._require_unprocessed("process_weights_after_loading()")
        self._params.require_complete()
        weights = self.canonical_weights()
        selection = self.choose_backend()
        self._forward = selection.chosen.bind(self.config, weights)
        self._params.release()
        self.selection = selection
        self.weights = weights if keep_canonical else None

    @property
    def forward(self) -> MoeForward | None:
        """The chosen backend's runner bound to its quant info (what :meth:`apply` calls), once processed."""
        return self._forward

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
        """The canonical weights, when processing was asked to keep them (None otherwise)."""
        ...

    def load_expert_weight(self, name: str, tensor: torch.Tensor, *, expert_id: int, shard: ExpertShard) -> bool:
        """Take one checkpoint tensor (``experts.{expert_id}.{shard}.{name}``); False if the expert is not local."""
        ...

    def process_weights_after_loading(self, *, keep_canonical: bool = False) -> None:
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
    for_layer: Callable[[MoeRunnerConfig, torch.device, torch.dtype, SchemeOptions], MoeScheme]
    """The scheme for one layer, its parameters created on the device; the dtype is the checkpoint's unquantized
    dtype (what an unquantized scheme stores)."""


@final
@attrs.frozen
class SchemeOptions:
    """How a checkpoint loader asks for a layer's backend: by name (None: by capability), strict or not."""

    backend: str | None = None
    strict: bool = False
    activation_dtype: torch.dtype = torch.bfloat16
