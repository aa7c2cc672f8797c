"""The typed dispatch table: backends named by keys that carry their quant info type, and selection among them.

A backend registers once, at import, with its :class:`~moe_core.capability.Priority`,
its ``supports(device, layer)`` answer and one :class:`~moe_core.conversion.Conversion`
per canonical format it takes, and gets a ``BackendKey[Q]``;
``create_runner(key, config)`` returns a ``Runner[Q]`` with ``Q`` taken from the
key, so handing that runner another backend's quant info is a mypy error.
``key.route(format)`` pairs the key with its conversion: routes of one format
but different ``Q`` share the type ``FormatRoute[W]``, so selection can walk
them without naming any ``Q`` and without ``Any``.

:func:`candidates` lists a format's routes in rank order, with the routes of
the formats it declares a :class:`~moe_core.conversion.Degradation` to, each
marked as degraded; :func:`choose` walks them for one
layer on one device and takes the first that fits (or the one named).

The table knows no format and names no backend. The registry finds its
backends itself the first time anything asks (:func:`registered_backends`,
:func:`candidates`): every module of the ``moe_core.backends`` package, then
the modules of the ``moe_core.backends`` entry-point group (plugins). A
plugin that fails while loading leaves nothing registered and stays a row
with its reason.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import pkgutil
import re
import sys
import threading
import weakref
from collections.abc import Callable, Mapping, Sequence
from importlib.metadata import entry_points
from typing import Generic, Protocol, TypeVar, final, overload

import attrs
import torch

from moe_core._compile import run_eagerly
from moe_core._checks import WriteCount, none_moved, overlaps, require_unwritten_since_built, write_count
from moe_core.capability import DeviceSpec, LayerSpec, Priority, Support, Tier
from moe_core.config import MoeRunnerConfig, config_differences
from moe_core.conversion import AnyConversion, Degradation, FormatInfo, WeightFormat
from moe_core.dispatch import DispatchOutput, StandardDispatchOutput
from moe_core.runner import LayerChecked, QuantInfo, Runner, check_quant_info_sizes, check_run_values

HIDDEN_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
"""The hidden-states dtypes a route asks its backend about when it binds (bf16, :class:`LayerSpec`'s default, first)."""

ENTRY_POINT_GROUP = "moe_core.backends"
"""Entry-point group whose modules register backends when imported."""

IN_TREE_PACKAGE = "moe_core.backends"
"""The package whose modules are moe-core's own backends (each registers at import)."""

Q = TypeVar("Q", bound=QuantInfo)
V = TypeVar("V", bound=QuantInfo)
W = TypeVar("W", bound=QuantInfo)
W_contra = TypeVar("W_contra", bound=QuantInfo, contravariant=True)


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
    judge: BackendAnswer | None = attrs.field(default=None, kw_only=True)
    """The backend's answer for this layer per hidden-states dtype (a route's or key's bind passes it); None where
    nothing was asked of the backend."""
    _writes: tuple[tuple[str, WriteCount], ...] = attrs.field(init=False, repr=False)
    """Each tensor the quant info holds, by field path, with its write count at binding."""

    def __attrs_post_init__(self) -> None:
        check_quant_info_sizes(self.runner.config, self.quant_info)
        held = _held(type(self.quant_info).__name__, self.quant_info)
        refuse_writes_since_built(held)
        counted = [(path, WriteCount(value)) for path, value in held if isinstance(value, torch.Tensor)]
        object.__setattr__(self, "_writes", tuple(c for c in counted if c[1].count >= 0))  # inference tensors count none

    @run_eagerly
    def __call__(self, dispatch: DispatchOutput, /) -> torch.Tensor:
        """``runner.run(dispatch, quant_info)``; for standard dispatches, the output is held to the
        :class:`~moe_core.runner.Runner` contract (``[T, H]`` in the hidden states' dtype and device), so a backend that
        returns something else is named instead of passing it on. A top-k built with ``check_values`` (the default)
        has its values checked against the layer first (:func:`~moe_core.runner.check_run_values`), whichever
        backend runs: kernels read no values."""
        self._require_unwritten()
        if self.judge is not None:
            self._require_supported(self.judge, dispatch.hidden_states.dtype)
        if dispatch.topk.check_values:
            check_run_values(self.runner.config, dispatch)
        topk = dispatch.topk
        inputs = (dispatch.hidden_states, topk.topk_ids, topk.topk_weights)  # named by _DISPATCH_TENSORS
        counts = (write_count(inputs[0]), write_count(inputs[1]), write_count(inputs[2]))
        out = self.runner.run(dispatch, self.quant_info)
        if (write_count(inputs[0]), write_count(inputs[1]), write_count(inputs[2])) != counts:
            name = _first_written(list(zip(_DISPATCH_TENSORS, inputs, counts)))
            raise RuntimeError(
                f"{type(self.runner).__name__}.run wrote the dispatch's {name} in place: the caller still reads "
                "it (a residual, a shared expert, the next layer); a runner computes into its own buffers"
            )
        if not none_moved(self._writes):
            for path, counted in self._writes:
                if counted.writes():
                    raise RuntimeError(
                        f"{type(self.runner).__name__}.run wrote its quant info's {path} in place: the next call "
                        "would run other weights; bound weights are immutable (a runner computes into its own buffers)"
                    )
        if isinstance(dispatch, StandardDispatchOutput):
            hidden = dispatch.hidden_states
            fits = isinstance(out, torch.Tensor) and (out.shape, out.dtype, out.device) == (
                hidden.shape, hidden.dtype, hidden.device
            )
            if not fits:
                got = f"{tuple(out.shape)} {out.dtype} on {out.device}" if isinstance(out, torch.Tensor) else type(out).__name__
                raise RuntimeError(
                    f"{type(self.runner).__name__}.run returned {got}, not the hidden states' "
                    f"{tuple(hidden.shape)} {hidden.dtype} on {hidden.device} (the Runner contract)"
                )
        if isinstance(out, torch.Tensor):
            if torch.is_grad_enabled() and not out.requires_grad and (inputs[0].requires_grad or inputs[2].requires_grad):
                out = _without_gradient(out, type(self.runner).__name__, inputs[0], inputs[2])
            self._require_fresh_output(out)
        return out

    def __reduce__(self) -> tuple[Callable[..., BoundRunner[Q]], tuple[object, ...]]:
        """Copies and pickles bind afresh (the copy's tensors count their own writes, from the copy on); weights
        written in place since binding are refused first, as a call would refuse them."""
        self._require_unwritten()
        return _bind_again, (self.runner, self.quant_info, self.judge)

    def _require_unwritten(self) -> None:
        """Refuse weights written in place since binding."""
        if none_moved(self._writes):
            return
        for path, counted in self._writes:
            writes = counted.writes()
            if writes:
                raise RuntimeError(
                    f"{path}: written in place after its weights were built ({writes} write(s), e.g. a staging "
                    "buffer reused for the next layer's weights): bound weights are immutable; bind new ones (a scheme "
                    "reloads through its loader); a workspace or engine state written between calls belongs in the "
                    "runner, not in the quant info"
                )

    def _require_supported(self, judge: BackendAnswer, dtype: torch.dtype) -> None:
        """Refuse hidden states of a dtype the backend does not take for this layer."""
        verdict = judge(dtype)
        if not verdict.ok:
            raise BackendSelectionError(
                f"{type(self.runner).__name__}: its backend does not run this layer's {dtype} hidden states: "
                f"{verdict.describe()} (was it chosen for another dtype? LayerSpec takes the hidden states' dtype)"
            )

    def _require_fresh_output(self, out: torch.Tensor) -> None:
        """Refuse an output in the memory of an earlier one, of any bound forward, that the caller still holds: that
        result would change under its holder (a runner's reused workspace, or one shared by layers: a residual, a
        pipelined engine's other micro-batch)."""
        held = _held_outputs(out)
        if held is not None:
            raise RuntimeError(
                f"{type(self.runner).__name__}.run returned memory of an earlier output ({held}), which the caller "
                "still holds: that result is overwritten (a reused output workspace); a runner returns a new tensor "
                "per call"
            )


class _NoGradient(torch.autograd.Function):
    """The output of a runner that computes no gradients, joined to the inputs that want one: its backward names
    the runner instead of leaving their gradients without the MoE's part (adversarial pass 16, c01: a swapped block's
    output did not require grad, and the loss's gradient came back 5-9% off, with no error)."""

    @staticmethod
    def forward(ctx: torch.autograd.function.FunctionCtx, out: torch.Tensor, runner: str, *inputs: torch.Tensor) -> torch.Tensor:
        setattr(ctx, "runner", runner)  # FunctionCtx declares no attributes of its own
        return out.clone()  # not a view: a caller may add into the output in place

    @staticmethod
    def backward(ctx: torch.autograd.function.FunctionCtx, *grads: torch.Tensor) -> None:
        runner = getattr(ctx, "runner")
        raise RuntimeError(
            f"{runner} computes no gradients, and its output was differentiated (the hidden states or top-k weights "
            "require grad): backpropagate through a backend that computes them (the reference backends), or run "
            "the MoE under torch.no_grad() / torch.inference_mode()"
        )


def _without_gradient(out: torch.Tensor, runner: str, *inputs: torch.Tensor) -> torch.Tensor:
    """A copy of ``out`` whose backward raises naming ``runner`` (:class:`_NoGradient`; only where gradients are
    wanted, which inference does not)."""
    joined: torch.Tensor = _NoGradient.apply(out, runner, *inputs)  # type: ignore[no-untyped-call]  # torch leaves apply unannotated
    return joined


_OUTPUTS: list[tuple[weakref.ref[torch.Tensor], str]] = []
"""The outputs bound forwards have returned, while their holders keep them (the newest :data:`OUTPUTS_WATCHED`)."""

OUTPUTS_WATCHED = 64
"""How many live outputs a new one is compared with: the newest, where an engine holds more."""


def _held_outputs(out: torch.Tensor) -> str | None:
    """Which live earlier output (its shape and dtype) ``out``'s memory overlaps, or None; ``out`` is then watched."""
    alive = [(ref, held) for ref, held in _OUTPUTS if ref() is not None][-(OUTPUTS_WATCHED - 1):]
    for ref, held in alive:
        earlier = ref()
        if earlier is not None and overlaps(out, earlier):
            return held
    _OUTPUTS[:] = [*alive, (weakref.ref(out), f"{tuple(out.shape)} {out.dtype}")]
    return None


class _Answers(Protocol):
    """A backend's own answer for a layer on a device (what a key holds)."""

    def supports(self, device: DeviceSpec, layer: LayerSpec) -> Support:
        """Whether the backend runs ``layer`` on ``device``, and if not, why."""
        ...


@final
@attrs.frozen(eq=False)
class BackendAnswer:
    """A backend's answer for one layer on one device, asked once per hidden-states dtype (binding asks every
    dtype, a forward the one it is given): yes where it runs the layer under one of ``formats``, else the first
    format's reasons. A bound forward holds it (it copies and pickles where the backend's own functions do)."""

    backend: _Answers
    formats: tuple[FormatInfo, ...]
    config: MoeRunnerConfig
    device: DeviceSpec
    _verdicts: dict[torch.dtype, Support] = attrs.field(init=False, repr=False, factory=dict)

    def __call__(self, dtype: torch.dtype) -> Support:
        known = self._verdicts.get(dtype)
        if known is not None:
            return known
        verdicts = [self.backend.supports(self.device, LayerSpec(self.config, fmt, dtype)) for fmt in self.formats]
        verdict = next((verdict for verdict in verdicts if verdict.ok), verdicts[0] if verdicts else Support.no(
            "it registered no conversion"))
        self._verdicts[dtype] = verdict
        return verdict


def _require_some_dtype(name: str, what: str, judge: BackendAnswer) -> None:
    """Raise :class:`BackendSelectionError` with bf16's reasons where ``judge`` refuses every hidden-states dtype."""
    verdicts = [judge(dtype) for dtype in HIDDEN_DTYPES]
    if not any(verdict.ok for verdict in verdicts):
        raise BackendSelectionError(f"backend {name!r} cannot run this {what}layer: {verdicts[0].describe()}")


def _bind_again(runner: Runner[Q], quant_info: Q, judge: BackendAnswer | None) -> BoundRunner[Q]:
    """A :class:`BoundRunner` rebuilt from its parts (copies and pickles)."""
    return BoundRunner(runner, quant_info, judge=judge)


def _counted(tensors: list[tuple[str, torch.Tensor]]) -> list[tuple[str, torch.Tensor, int]]:
    """Each named tensor with its write count now, to compare after a call that must not write it."""
    return [(name, tensor, write_count(tensor)) for name, tensor in tensors]


def _first_written(counted: list[tuple[str, torch.Tensor, int]]) -> str | None:
    """The name of the first tensor written in place since :func:`_counted`, or None."""
    return next((name for name, tensor, count in counted if write_count(tensor) != count), None)


_DISPATCH_TENSORS = ("hidden_states", "topk_ids", "topk_weights")
"""The caller's tensors a runner reads and must leave as they are, by name: the hidden states and the top-k's ids and
weights."""


def _held(path: str, value: object, seen: set[int] | None = None, plain: bool = True) -> list[tuple[str, object]]:
    """``value`` and what it holds through attrs or dataclass fields, tuples, lists, mappings, modules' parameters,
    buffers and attributes, and a plain class's attributes (its ``__dict__`` and ``__slots__``: a plugin's quant info
    need not be an attrs class), each with its path from ``path``; each object once.

    Plain objects are looked into only below a plain quant info (``plain``): an attrs or dataclass quant info says
    by its fields what it holds, and a plain object behind one is a helper of its own (a workspace the runner
    writes, an engine's context: adversarial pass 15, c10), as it was before plain quant infos were walked.
    """
    seen = set() if seen is None else seen
    if id(value) in seen:
        return []
    seen.add(id(value))
    if isinstance(value, (tuple, list)):
        return [found for index, item in enumerate(value) for found in _held(f"{path}[{index}]", item, seen, plain)]
    if isinstance(value, Mapping):
        items = value.items()
        return [(path, value)] + [found for key, item in items for found in _held(f"{path}[{key!r}]", item, seen, plain)]
    if isinstance(value, torch.nn.Module):  # parameters and buffers (non-persistent ones too), then its own attributes
        tensors = [*value.named_parameters(), *value.named_buffers()]
        found = [(path, value)] + [found for key, item in tensors for found in _held(f"{path}.{key}", item, seen, plain)]
        names = [name for name in vars(value) if not name.startswith("_") and name != "training"]
        return found + [found for name in names for found in _held(f"{path}.{name}", getattr(value, name), seen, plain)]
    kind = type(value)
    if attrs.has(kind):
        names, plain = [field.name for field in attrs.fields(kind)], False
    elif dataclasses.is_dataclass(kind):
        names, plain = [field.name for field in dataclasses.fields(kind)], False
    elif not plain:
        return [(path, value)]
    elif isinstance(value, functools.partial):
        args, keywords = _held(f"{path}.args", value.args, seen, plain), _held(f"{path}.keywords", value.keywords, seen, plain)
        return [(path, value), *args, *keywords]
    else:
        names = _attributes(value)
    return [(path, value)] + [
        found for name in names for found in _held(f"{path}.{name.lstrip('_')}", getattr(value, name), seen, plain)
    ]


_LEAF_MODULES = ("builtins", "torch", "enum", "typing", "abc")
"""Where the classes come from whose objects :func:`_held` does not look into (tensors, dtypes, devices, enums,
functions, classes and modules hold no weights of a quant info's)."""


def _attributes(value: object) -> list[str]:
    """A plain object's attribute names (a ``SimpleNamespace``'s too), from its ``__dict__`` and every class's
    ``__slots__``; none for an object of builtins' or torch's classes (a function, a class, a tensor, a dtype)."""
    kind = type(value)
    if kind.__module__.split(".")[0] in _LEAF_MODULES:
        return []
    names = list(getattr(value, "__dict__", {}))
    for klass in kind.__mro__:
        slots = getattr(klass, "__slots__", ())
        names += [slots] if isinstance(slots, str) else [name for name in slots if name not in ("__dict__", "__weakref__")]
    return [name for name in dict.fromkeys(names) if hasattr(value, name)]


def refuse_writes_since_built(held: list[tuple[str, object]]) -> None:
    """Raise ``RuntimeError`` if a tensor that one of the ``held`` weight objects was built from has been written in
    place since (a loader's buffer refilled with the next layer's weights before this one was bound)."""
    for path, value in held:
        require_unwritten_since_built(path, value)


SupportsCheck = Callable[[DeviceSpec, LayerSpec], Support]
"""A backend's own answer: can it run ``layer`` on ``device``."""


def _guarded(check: SupportsCheck, device: DeviceSpec, layer: LayerSpec) -> Support:
    """``check(device, layer)``; a check that raises or answers something else counts as broken, not as a crash."""
    try:
        verdict: object = check(device, layer)
    except Exception as error:  # a plugin's check may fail in any way: report it as the reason
        return Support((f"supports check raised {type(error).__name__}: {error}",), broken=True)
    if not isinstance(verdict, Support):
        return Support((f"supports check returned {type(verdict).__name__}, not Support",), broken=True)
    return verdict


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
    supports_check: SupportsCheck = attrs.field(alias="_supports", kw_only=True)
    """The backend's own answer; call :meth:`supports`, which survives a faulty one."""
    conversions: tuple[AnyConversion[Q], ...] = attrs.field(alias="_conversions", kw_only=True)
    """One conversion per canonical format the backend takes."""
    priority: Priority = attrs.field(alias="_priority", kw_only=True)
    """Where it ranks among the candidates of a format."""

    def __reduce__(self) -> tuple[Callable[[str], BackendKey[QuantInfo]], tuple[str]]:
        """Copies and pickles are the registered key of the same name (keys compare by identity; a factory or check
        may be a local function, which does not pickle): unpickling needs the backend registered there too."""
        return _registered_key, (self.name,)

    def supports(self, device: DeviceSpec, layer: LayerSpec) -> Support:
        """Whether the backend runs ``layer`` on ``device``, and if not, why."""
        if not self.converts_from(layer.format):
            taken = ", ".join(fmt.name for fmt in self.formats) or "none"
            return Support.no(f"takes no {layer.format.name} weights (it takes: {taken})")
        return _guarded(self.supports_check, device, layer)

    @property
    def formats(self) -> tuple[WeightFormat[QuantInfo], ...]:
        """The canonical formats the backend converts from, in registration order."""
        return tuple(conversion.source_format() for conversion in self.conversions)

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
        """A runner for ``config`` bound to ``quant_info``.

        Raises :class:`BackendSelectionError` where the backend's own answer
        refuses this layer on the quant info's device in every hidden-states
        dtype, under each format it converts from (a key bound directly skips
        selection, not the backend's refusals); the forward asks for the dtype
        of the hidden states it is given.
        """
        judge = BackendAnswer(self, self.formats, config, DeviceSpec.of(quant_info.device))
        _require_some_dtype(self.name, "", judge)
        return BoundRunner(create_runner(self, config), quant_info, judge=judge)


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

    @property
    def format(self) -> FormatInfo:
        """The format it is fed from (``W``'s)."""
        ...

    @property
    def priority(self) -> Priority:
        """The backend's declared rank."""
        ...

    @property
    def degradation(self) -> str | None:
        """None, or the degradation between formats this route goes through, in words."""
        ...

    def supports(self, device: DeviceSpec, layer: LayerSpec) -> Support:
        """Whether the backend runs ``layer`` (weights of :attr:`format`) on ``device``, and if not, why."""
        ...

    def bind(self, config: MoeRunnerConfig, weights: W_contra) -> MoeForward:
        """Convert ``weights`` once into the backend's quant info and bind a runner for ``config`` to it."""
        ...


@final
@attrs.frozen(eq=False)
class Route(Generic[W, Q]):
    """A backend key with its registered conversion from format ``W``: see :meth:`BackendKey.route`.

    Nothing public here takes or returns a ``Q`` but :meth:`bind` (which
    checks ``weights`` at run time): ``isinstance(choice, Route)`` on a
    ``FormatRoute[W]`` gives ``Route[Any, Any]``, and a key or quant info
    typed ``Any`` must not come out of it.
    """

    _key: BackendKey[Q] = attrs.field(alias="_key", kw_only=True)
    """The backend."""
    source: WeightFormat[W] = attrs.field(alias="_source", kw_only=True)
    """The canonical format it is fed from."""
    _conversion: AnyConversion[Q] = attrs.field(alias="_conversion", kw_only=True)
    """The conversion the backend registered from ``source``."""

    @property
    def name(self) -> str:
        """The backend's name."""
        return self._key.name

    @property
    def description(self) -> str:
        """One line for tables."""
        return self._key.description

    @property
    def format(self) -> WeightFormat[W]:
        """The format it is fed from."""
        return self.source

    @property
    def priority(self) -> Priority:
        """The backend's declared rank."""
        return self._key.priority

    @property
    def degradation(self) -> None:
        """A direct route degrades nothing."""
        return None

    def supports(self, device: DeviceSpec, layer: LayerSpec) -> Support:
        """The backend's answer for ``layer`` with its weights in :attr:`source`."""
        return self._key.supports(device, layer.with_format(self.source))

    def _quant_info(self, weights: W) -> Q:
        """The backend's quant info built from ``weights`` (once, after loading; checked to be in :attr:`source`)."""
        return self._conversion.apply(weights)

    def bind(self, config: MoeRunnerConfig, weights: W) -> BoundRunner[Q]:
        """A runner for ``config`` bound to ``weights`` converted once.

        Raises :class:`BackendSelectionError` where the backend refuses this
        layer on the weights' device in every hidden-states dtype: a route
        chosen for one config is never run on another that its backend does
        not compute. The bound forward asks again for the dtype of the hidden
        states it is given (once per dtype), and refuses one the backend does
        not take: a route chosen for bf16 never runs float32 silently in bf16.
        """
        judge = BackendAnswer(self._key, (self.source,), config, DeviceSpec.of(self.source.narrow(weights).device))
        _require_some_dtype(self.name, f"{self.source.name} ", judge)
        checked: object = weights  # a format's weights may check more of the layer than their shapes say
        if isinstance(checked, LayerChecked):
            checked.check_layer(config)
        held = _held(type(weights).__name__, weights)
        refuse_writes_since_built(held)  # before a conversion copies them
        counts = _counted([(path, value) for path, value in held if isinstance(value, torch.Tensor)])
        quant_info = self._quant_info(weights)
        path = _first_written(counts)
        if path is not None:
            raise RuntimeError(
                f"backend {self.name!r}: its conversion wrote the {self.source.name} weights' {path} in place "
                "(the caller's weights, which other backends and layers may hold); a conversion builds new tensors"
            )
        return BoundRunner(create_runner(self._key, config), quant_info, judge=judge)


@final
@attrs.frozen(eq=False)
class DegradedRoute(Generic[W, V]):
    """A route of format ``V`` fed from format ``W`` through one of ``W``'s declared :class:`Degradation` steps."""

    source: WeightFormat[W]
    step: Degradation[W, V]
    route: FormatRoute[V]

    @property
    def name(self) -> str:
        """The backend's name."""
        return self.route.name

    @property
    def description(self) -> str:
        """One line for tables."""
        return self.route.description

    @property
    def format(self) -> WeightFormat[W]:
        """The format it is fed from (the degradation's source)."""
        return self.source

    @property
    def priority(self) -> Priority:
        """The backend's declared rank."""
        return self.route.priority

    @property
    def degradation(self) -> str:
        """The degradation, in words: ``source -> target: reason``."""
        return f"{self.source.name} -> {self.step.target.name}: {self.step.reason}"

    def supports(self, device: DeviceSpec, layer: LayerSpec) -> Support:
        """The backend's answer for ``layer`` with its weights in the degradation's target format."""
        return self.route.supports(device, layer)

    def bind(self, config: MoeRunnerConfig, weights: W) -> MoeForward:
        """Degrade ``weights``, then convert them once into the backend's quant info."""
        refuse_writes_since_built(_held(type(weights).__name__, weights))  # before the degradation copies them
        return self.route.bind(config, self.step.convert(weights))


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
    def formats(self) -> tuple[WeightFormat[QuantInfo], ...]:
        """The canonical formats it converts from."""
        ...

    @property
    def priority(self) -> Priority:
        """Its declared rank."""
        ...

    def supports(self, device: DeviceSpec, layer: LayerSpec) -> Support:
        """Whether the backend runs ``layer`` on ``device``; a faulty check is reported as broken."""
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
    def formats(self) -> tuple[WeightFormat[QuantInfo], ...]:
        return self.key.formats

    @property
    def priority(self) -> Priority:
        return self.key.priority

    def supports(self, device: DeviceSpec, layer: LayerSpec) -> Support:
        return self.key.supports(device, layer)

    def converts_from(self, source: FormatInfo) -> bool:
        return self.key.converts_from(source)

    def route(self, source: WeightFormat[W]) -> FormatRoute[W]:
        return self.key.route(source)


@final
@attrs.frozen(eq=False)
class _FailedPlugin:
    """A plugin that failed to load: a row with its reason, broken on every device, fed from no format."""

    name: str
    error: str

    @property
    def description(self) -> str:
        return f"entry point of {ENTRY_POINT_GROUP} that failed to load"

    @property
    def formats(self) -> tuple[WeightFormat[QuantInfo], ...]:
        return ()

    @property
    def priority(self) -> Priority:
        return Priority(Tier.ORACLE, order=1 << 30)

    def supports(self, device: DeviceSpec, layer: LayerSpec) -> Support:
        return Support((f"failed to load: {self.error}",), broken=True)

    def converts_from(self, source: FormatInfo) -> bool:
        return False

    def route(self, source: WeightFormat[W]) -> FormatRoute[W]:
        raise ValueError(f"backend {self.name!r} failed to load ({self.error}): it takes no weights")


@final
@attrs.frozen(eq=False)
class _Slot:
    key: object
    """The key itself, compared by identity in :func:`create_runner`."""
    entry: BackendEntry
    module: str = ""
    """The module whose top-level code registered it: a plugin failing to import keeps another plugin's names."""


@final
@attrs.define
class _Discovered:
    """What discovery has loaded: moe-core's own modules first (:attr:`own`), the entry points' plugins after."""

    labels: dict[str, str | None] = attrs.Factory(dict)
    """Each discovered module (in-tree module or entry point) and the error that stopped it, or None."""
    own: bool = False
    """moe-core's own backend modules are loaded (what a registration needs first)."""
    plugins: bool = False
    """The entry points' plugins are loaded too (what a question of the registry needs)."""


_REGISTRY: dict[str, _Slot] = {}
_DISCOVERY = _Discovered()
_DISCOVERING: list[int] = []
"""The discovering thread's id while :func:`discover_backends` runs (the modules it imports register through it)."""
_DISCOVERY_LOCK = threading.RLock()
"""Held by the thread that discovers: another thread's first question waits for the whole table (adversarial pass
16, c03: threads asking at once found an empty or partial one, and chose an oracle over the kernel)."""


_BACKEND_NAME = re.compile(r"[a-z0-9][a-z0-9._+-]*")
"""Backend names: one spelling each (no case or whitespace variants of another name, which selection by name would
match instead of the one meant)."""


def register_backend(
    name: str,
    *,
    description: str,
    factory: Callable[[MoeRunnerConfig], Runner[Q]],
    supports: SupportsCheck,
    priority: Priority,
    conversions: Sequence[AnyConversion[Q]] = (),
) -> BackendKey[Q]:
    """Add a backend to the table and return its key; a name registers once.

    ``supports`` answers for one layer on one device (a value, so that a
    described device can be asked): refuse, with a reason, every config
    field the backend cannot honour, never ignore it. ``priority`` is where
    it ranks (kernel before fallback before oracle, then ``order``).
    ``conversions`` holds one :class:`~moe_core.conversion.Conversion` per
    canonical format the backend takes (none: callers build its quant info
    themselves). ``moe-core check`` tests the backend on each of them.
    """
    if not isinstance(name, str) or not _BACKEND_NAME.fullmatch(name):
        raise ValueError(
            f"name: expected lowercase letters, digits, '-', '.', '_' or '+', starting with a letter or digit, got {name!r}"
        )
    if not _DISCOVERING or _DISCOVERING == [threading.get_ident()]:
        # moe-core's own names are taken first, also by a plugin that registers before anyone asked; while another
        # thread discovers, a module imported here registers without waiting for it: that thread may be waiting for
        # this module's import, which this thread holds (adversarial pass 17, c10: both hung). Plugins load at the
        # first question instead: one importing the module registering now would find it half-imported (pass 19, k02)
        _discover(plugins=False)
    if name in _REGISTRY:
        raise ValueError(f"name: a backend named {name!r} is already registered")
    if not isinstance(priority, Priority):
        raise TypeError(f"priority: expected a Priority, got {type(priority).__name__}")
    if not callable(supports):
        raise TypeError(f"supports: expected a callable (device, layer) -> Support, got {type(supports).__name__}")
    sources = [conversion.source for conversion in conversions]
    if len({id(source) for source in sources}) != len(sources):
        raise ValueError(f"conversions: expected one per format, got formats {[s.name for s in sources]}")
    key = BackendKey(
        _name=name,
        _description=description,
        _factory=factory,
        _supports=supports,
        _conversions=tuple(conversions),
        _priority=priority,
    )
    _REGISTRY[name] = _Slot(key, _Registered(key), _registering_module())
    return key


def _registering_module() -> str:
    """The module whose top-level code made the registration in progress (the innermost one running, past any
    helper function it called): the module a failed import takes the names of."""
    frame = sys._getframe(2)
    while frame.f_back is not None and frame.f_code.co_name != "<module>":
        frame = frame.f_back
    return str(frame.f_globals.get("__name__", ""))


def _registered_key(name: str) -> BackendKey[QuantInfo]:
    """The key registered under ``name`` (a copied or unpickled key); ``LookupError`` naming it where none is."""
    discover_backends()
    slot = _REGISTRY.get(name)
    if slot is None or not isinstance(slot.key, BackendKey):
        raise LookupError(f"backend {name!r} is not registered in this process (its module or plugin did not load)")
    key: BackendKey[QuantInfo] = slot.key
    return key


def create_runner(key: BackendKey[Q], config: MoeRunnerConfig) -> Runner[Q]:
    """A runner of ``key``'s backend for one layer; its ``run`` takes only ``Q``. It asks nothing of the backend's
    answer (no device is known here): a route's or key's ``bind`` does, and holds the forward to it."""
    slot = _REGISTRY.get(key.name)
    if slot is None or slot.key is not key:
        raise ValueError(f"key: backend {key.name!r} is not registered (through register_backend, by a module that loaded)")
    if not isinstance(config, MoeRunnerConfig):
        raise TypeError(f"config: expected a MoeRunnerConfig, got {type(config).__name__}")
    runner = key.factory(config)
    made: object = getattr(runner, "config", None)
    if isinstance(made, MoeRunnerConfig):
        said = "; ".join(config_differences(config, made, f"{key.name!r} runner's"))
    else:
        said = f"its config is {made!r}"
    if said:
        raise RuntimeError(
            f"backend {key.name!r}: its factory returned a runner for another layer than asked ({said}): a runner "
            "computes the config it is made for (a cache keyed by shapes alone hands out another layer's)"
        )
    return runner


def _load(module: str, label: str) -> None:
    """Import ``module``; on failure record the error and unregister whatever it registered before failing."""
    before = set(_REGISTRY)
    try:
        importlib.import_module(module)
    except Exception as error:  # a plugin may fail in any way: report it, load the rest
        # every name registered while it imported goes, but another plugin's: a module of its own entry point that
        # this one imported, and that loaded (adversarial pass 21, a04: its names vanished, the choice changed unnamed)
        plugins = {entry.module for entry in entry_points(group=ENTRY_POINT_GROUP)} - {module}
        for name in set(_REGISTRY) - before:
            registrar = _REGISTRY[name].module
            if registrar not in plugins or registrar not in sys.modules:
                del _REGISTRY[name]
        _DISCOVERY.labels[label] = f"{type(error).__name__}: {error}"
    else:
        _DISCOVERY.labels[label] = None


def discover_backends() -> dict[str, str | None]:
    """Import moe-core's backend modules, then the plugins of the ``moe_core.backends`` entry-point group, once.

    Anything that asks the registry calls it first; an engine need not.
    moe-core's own modules load first, so a plugin cannot take their names.
    Returns each module's label (``moe_core.backends.<name>`` or the entry
    point's name) with None where it loaded, or the error that stopped it.
    """
    _discover(plugins=True)
    return dict(_DISCOVERY.labels)


def _discover(*, plugins: bool) -> None:
    """Load moe-core's backend modules once, and with ``plugins`` the entry points' after them, under the discovery
    lock; re-entered by the discovering thread's own registrations, which see what loaded so far."""

    def done() -> bool:
        return _DISCOVERY.plugins or (_DISCOVERY.own and not plugins)

    if done() and not _DISCOVERING:
        return
    with _DISCOVERY_LOCK:
        if done() or _DISCOVERING:
            return
        _DISCOVERING.append(threading.get_ident())
        try:
            if not _DISCOVERY.own:
                package = importlib.import_module(IN_TREE_PACKAGE)
                for module in sorted(pkgutil.iter_modules(package.__path__), key=lambda info: info.name):
                    if not module.name.startswith("_"):
                        name = f"{IN_TREE_PACKAGE}.{module.name}"
                        _load(name, name)
                _DISCOVERY.own = True
            if plugins:
                for entry in entry_points(group=ENTRY_POINT_GROUP):
                    if entry.module.split(".")[:2] != IN_TREE_PACKAGE.split("."):
                        _load(entry.module, entry.name)
                _DISCOVERY.plugins = True
        finally:
            _DISCOVERING.clear()


def plugin_errors() -> dict[str, str]:
    """The discovered modules that failed to load, with their errors."""
    return {label: error for label, error in discover_backends().items() if error is not None}


def registered_backends() -> tuple[BackendEntry, ...]:
    """Every backend (discovered first), in registration order, its quant info type hidden; failed plugins last,
    as broken rows."""
    failed = plugin_errors()
    return (*(slot.entry for slot in _REGISTRY.values()), *(_FailedPlugin(n, e) for n, e in failed.items()))


def known_formats() -> tuple[WeightFormat[QuantInfo], ...]:
    """Every format some registered backend converts from, in registration order."""
    found: dict[int, WeightFormat[QuantInfo]] = {}
    for entry in registered_backends():
        for fmt in entry.formats:
            found.setdefault(id(fmt), fmt)
    return tuple(found.values())


def _rank(route: FormatRoute[W], step: int, index: int) -> tuple[int, int, int, int]:
    return (route.priority.tier, step, route.priority.order, index)


def candidates(source: WeightFormat[W], *, strict: bool = False) -> list[FormatRoute[W]]:
    """Every backend that can be fed ``source`` weights, in rank order.

    Routes through one of ``source``'s declared degradations follow the
    direct ones of their tier, in the order the format declares its
    degradations (a degraded kernel still ranks before a direct oracle);
    ``strict`` leaves them out.
    """
    discover_backends()
    entries = [slot.entry for slot in _REGISTRY.values()]
    routes: list[tuple[int, FormatRoute[W]]] = [(0, entry.route(source)) for entry in entries if entry.converts_from(source)]
    if not strict:
        for number, step in enumerate(source.degradations, start=1):
            routes += [
                (number, DegradedRoute(source, step, entry.route(step.target)))
                for entry in entries
                if entry.converts_from(step.target)
            ]
    ranked = sorted(enumerate(routes), key=lambda item: _rank(item[1][1], item[1][0], item[0]))
    return [route for _, (_, route) in ranked]


class BackendChoice(Protocol):
    """Anything :func:`select_backend` chooses among: a ``BackendKey[Q]`` or a ``FormatRoute[W]``."""

    @property
    def name(self) -> str:
        """The backend's name."""
        ...

    def supports(self, device: DeviceSpec, layer: LayerSpec) -> Support:
        """Whether the backend runs ``layer`` on ``device``, and if not, why."""
        ...


C = TypeVar("C", bound=BackendChoice)


class BackendSelectionError(ValueError):
    """No backend fits: an unknown or unfit name, or none fits; the message lists the choices and their reasons."""


@final
@attrs.frozen
class Considered:
    """One candidate as selection saw it."""

    name: str
    support: Support
    degradation: str | None = None


@final
@attrs.frozen(eq=False)
class Selection(Generic[C]):
    """The backend :func:`select_backend` chose, and what it found for every choice."""

    chosen: C
    considered: tuple[Considered, ...]
    """Each choice, in rank order."""
    device: DeviceSpec

    @property
    def degradation(self) -> str | None:
        """The degradation the chosen route goes through, if any."""
        return next(c.degradation for c in self.considered if c.name == self.chosen.name)

    def summary(self) -> str:
        """One line for a log: the choice, any degradation, and why earlier ones were passed over."""
        line = f"backend {self.chosen.name}"
        if self.degradation is not None:
            line += f" (degraded: {self.degradation})"
        passed = []
        for considered in self.considered:
            if considered.name == self.chosen.name:
                break
            passed.append(f"{considered.name} ({considered.support.describe()})")
        return line + (f"; passed over: {', '.join(passed)}" if passed else "")


def _listing(considered: Sequence[Considered]) -> str:
    return "; ".join(
        f"{c.name}{' (degraded)' if c.degradation else ''}: {'fits' if c.support.ok else c.support.describe()}"
        for c in considered
    )


def _as_spec(device: DeviceSpec | torch.device) -> DeviceSpec:
    return device if isinstance(device, DeviceSpec) else DeviceSpec.of(device)


@overload
def select_backend(
    choices: Sequence[BackendKey[Q]], device: DeviceSpec | torch.device, layer: LayerSpec, *, name: str | None = None
) -> Selection[BackendKey[Q]]: ...


@overload
def select_backend(
    choices: Sequence[FormatRoute[W]], device: DeviceSpec | torch.device, layer: LayerSpec, *, name: str | None = None
) -> Selection[FormatRoute[W]]: ...


def select_backend(
    choices: Sequence[C], device: DeviceSpec | torch.device, layer: LayerSpec, *, name: str | None = None
) -> Selection[C]:
    """Choose from ``choices`` (rank order) for ``layer`` on ``device``: the one named ``name``, or the first that fits.

    Typed by the choices: among ``BackendKey[Q]`` it returns a
    ``BackendKey[Q]``; among ``FormatRoute[W]``, a ``FormatRoute[W]``. A
    choice that fits only by name (:attr:`Support.by_name_only`) is taken
    only when named. Raises :class:`BackendSelectionError` listing every
    choice with its reasons.

    Nothing else is a choice: a ``Sequence[BackendChoice]`` (keys of
    several quant info types, or keys and routes together) matches neither
    overload, so no ``Selection`` holds a key whose ``Q`` an ``isinstance``
    would recover as ``Any``.
    """
    spec = _as_spec(device)
    if not choices:
        raise BackendSelectionError(f"no backend takes {layer.format.name} weights (none is registered for it)")
    considered = tuple(
        Considered(choice.name, choice.supports(spec, layer), getattr(choice, "degradation", None)) for choice in choices
    )
    where = f"{layer.format.name} on {spec.describe()}"
    if name is not None:
        matches = [index for index, choice in enumerate(choices) if choice.name == name]
        if not matches:
            known = ", ".join(choice.name for choice in choices)
            raise BackendSelectionError(f"unknown backend {name!r} for {where}; the choices are: {known}")
        index = matches[0]
        if not considered[index].support.ok:
            raise BackendSelectionError(
                f"backend {name!r} cannot run {where}: {considered[index].support.describe()} "
                f"(all choices: {_listing(considered)})"
            )
        return Selection(choices[index], considered, spec)
    for index, verdict in enumerate(considered):
        if verdict.support.ranked:
            return Selection(choices[index], considered, spec)
    raise BackendSelectionError(f"no backend runs {where}: {_listing(considered)}")


def choose(
    source: WeightFormat[W],
    device: DeviceSpec | torch.device,
    layer: LayerSpec,
    *,
    name: str | None = None,
    strict: bool = False,
) -> Selection[FormatRoute[W]]:
    """The backend for a layer of ``source`` weights on ``device``: named, or the first candidate that fits.

    ``strict`` forbids degradation between formats; its error says what
    would have run without it.
    """
    if layer.format is not source:
        raise ValueError(f"layer: its format is {layer.format.name}, the weights are {source.name}")
    try:
        return select_backend(candidates(source, strict=strict), device, layer, name=name)
    except BackendSelectionError as error:
        if not strict:
            raise
        try:
            relaxed = select_backend(candidates(source), device, layer, name=name)
        except BackendSelectionError:
            raise error from None
        raise BackendSelectionError(
            f"{error} (strict: no degradation; without strict, {relaxed.chosen.name} would run, "
            f"degraded: {relaxed.degradation})"
        ) from None
