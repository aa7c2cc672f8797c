"""The Triton backend's one runner, generic over its typed plan: sort the tokens, two grouped GEMMs, the combine.

``TritonRunner(config, plan)`` is a ``Runner[Q]`` for the plan's quant info
type ``Q`` (:mod:`.plans`: one plan per weight format). ``run`` checks the
dispatch and quant info from metadata only, allocates its output from the
caching allocator (its own buffers too, but at decode, where :mod:`.scratch`
keeps them) and reads nothing back to the host, so a forward can be captured
in a CUDA graph and replayed.

What a forward launches depends only on the weights, the token count, the
dtypes and the device: the runner keeps it per quant info (while that
lives) and key (:class:`ForwardMemo`), with each kernel's launch site, so a
repeated forward (decode) skips the plan and Triton's per-launch binding, and
with its recorded decode launches (:mod:`.replay`), so it skips the forward's
own Python too.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Generic, TypeVar, final

import attrs
import torch

from moe_core import DispatchFormat, DispatchOutput, MoeRunnerConfig, check_run_inputs
from moe_core._checks import write_count
from moe_core.backends.triton.kernels import one_at_a_time
from moe_core.backends.triton.launch import fused_moe
from moe_core.backends.triton.launcher import LaunchSite
from moe_core.backends.triton.plans import Launches, TritonPlan
from moe_core.backends.triton.replay import Replay, Replays
from moe_core.runner import QuantInfo

Q = TypeVar("Q", bound=QuantInfo)

ForwardKey = tuple[int, torch.dtype, torch.device, torch.dtype, torch.dtype]
"""Tokens, the hidden states' dtype and device, the top-k ids' and weights' dtypes."""


Chain = tuple[str, ...]
"""Attribute names from a quant info down to one of the values it holds."""

_MISSING = object()
"""What :func:`_reach` gives where an attribute of the chain is gone."""


def held_values(value: object, chain: Chain = ()) -> list[tuple[Chain, object]]:
    """Every value ``value`` holds through attrs fields, nested ones included, with its chain of attribute names."""
    kind = type(value)
    if not attrs.has(kind):
        return []
    found: list[tuple[Chain, object]] = []
    for field in attrs.fields(kind):
        held = getattr(value, field.name)
        found += [((*chain, field.name), held), *held_values(held, (*chain, field.name))]
    return found


def _reach(value: object, chain: Chain) -> object:
    """The attribute at ``chain`` below ``value``, or :data:`_MISSING`."""
    for name in chain:
        value = getattr(value, name, _MISSING)
    return value


@final
class _Forwards:
    """One quant info's forwards by key, and what it held when the first was planned: every value by identity, and
    each tensor's write count and data pointer."""

    __slots__ = ("by_key", "counts", "values")

    def __init__(self, quant_info: object) -> None:
        self.values = held_values(quant_info)
        self.counts = [
            (tensor, write_count(tensor), tensor.data_ptr()) for _, tensor in self.values if isinstance(tensor, torch.Tensor)
        ]
        self.by_key: dict[ForwardKey, KeptForward] = {}

    def current(self, quant_info: object) -> bool:
        """Whether ``quant_info`` still holds the same values (none replaced behind its frozen fields) and none of its
        tensors was written in place or given other memory (``.data =``: a kept binary is specialized on its pointer's
        alignment; planning again reads them through their checks, which name a write)."""
        return all(_reach(quant_info, chain) is value for chain, value in self.values) and all(
            write_count(tensor) == count and tensor.data_ptr() == pointer for tensor, count, pointer in self.counts
        )


@final
@attrs.frozen(eq=False)
class KeptForward:
    """One key's forward: its launches, their sites (None where nothing can be kept) and its decode replays."""

    launches: Launches
    sites: dict[str, LaunchSite] | None = None
    replays: Replays | None = None


def _kept(launches: Launches) -> KeptForward:
    """A new key's forward, with sites and replays (which may read the tensors ``launches`` holds)."""
    held = [value for _, value in held_values(launches) if isinstance(value, torch.Tensor)]
    return KeptForward(launches, {}, Replays(held))


@final
class ForwardMemo:
    """Each quant info's launches and launch sites per :data:`ForwardKey`, while the quant info lives.

    At most :attr:`LIMIT` keys per quant info (the oldest goes first): an
    engine's eager prefill meets many token counts. A quant info whose
    values were replaced behind its frozen fields (``object.__setattr__``),
    or whose tensors were written in place, is planned afresh rather than
    run on what it held (a scale's write is then refused by its own check,
    adversarial pass 8, c01). A copy starts empty.
    """

    LIMIT = 64
    __slots__ = ("_by_weights",)

    def __init__(self) -> None:
        self._by_weights: weakref.WeakKeyDictionary[object, _Forwards] = weakref.WeakKeyDictionary()

    def __reduce__(self) -> tuple[type[ForwardMemo], tuple[()]]:
        """Copies and pickles start empty (launch sites hold compiled binaries)."""
        return ForwardMemo, ()

    def forward(self, quant_info: object, dispatch: DispatchOutput, plan: Callable[[], Launches]) -> KeptForward:
        """The launches of ``dispatch`` on ``quant_info`` (``plan`` makes them once per key), their sites and
        replays; neither for a quant info that cannot be weakly referenced (none is kept for it)."""
        hidden, topk = dispatch.hidden_states, dispatch.topk
        key = (int(hidden.shape[0]), hidden.dtype, hidden.device, topk.topk_ids.dtype, topk.topk_weights.dtype)
        try:
            forwards = self._by_weights.get(quant_info)
        except TypeError:
            return KeptForward(plan())
        if forwards is None or not forwards.current(quant_info):
            forwards = self._by_weights[quant_info] = _Forwards(quant_info)
        found = forwards.by_key.get(key)
        if found is None:
            if len(forwards.by_key) >= self.LIMIT:
                del forwards.by_key[next(iter(forwards.by_key))]
            found = forwards.by_key[key] = _kept(plan())
        return found

    def sites(self, quant_info: object) -> list[LaunchSite]:
        """Every launch site kept for ``quant_info`` (benchmarks and tests read whether they launch directly)."""
        forwards = self._by_weights.get(quant_info)
        if forwards is None:
            return []
        return [site for kept in forwards.by_key.values() if kept.sites is not None for site in kept.sites.values()]

    def replays(self, quant_info: object) -> list[Replay | None]:
        """Every decode forward recorded for ``quant_info`` (None where one could not be: tests read which)."""
        forwards = self._by_weights.get(quant_info)
        if forwards is None:
            return []
        return [replay for kept in forwards.by_key.values() if kept.replays is not None for replay in kept.replays.recorded()]


@final
@attrs.frozen
class TritonRunner(Generic[Q]):
    """Experts of one weight format through the fused Triton kernels, as ``plan`` launches its quant info."""

    config: MoeRunnerConfig
    plan: TritonPlan[Q]
    memo: ForwardMemo = attrs.field(init=False, factory=ForwardMemo, eq=False, repr=False)
    """The forwards launched so far, per quant info."""

    def __attrs_post_init__(self) -> None:
        """Refuse what no plan computes, for runners made by key (``create_runner``, ``key.bind``), which selection's
        ``supports`` never saw."""
        if self.config.routing_method.scales_input:
            raise ValueError(
                f"Triton fused MoE: its kernels weight each expert's output, not its input "
                f"({self.config.routing_method.value} routing)"
            )

    def run(self, dispatch: DispatchOutput, quant_info: Q, /) -> torch.Tensor:
        """The ``[T, H]`` MoE output in the activations' dtype."""
        check_run_inputs(self.config, dispatch, quant_info, (DispatchFormat.STANDARD,))
        with one_at_a_time():
            kept = self.memo.forward(quant_info, dispatch, lambda: self._plan(dispatch, quant_info))
            launches = kept.launches
            return fused_moe(self.config, dispatch, launches.w13, launches.w2, launches.inputs, kept.sites, kept.replays)

    def _plan(self, dispatch: DispatchOutput, quant_info: Q) -> Launches:
        """The plan's check and launches: once per memo key (the memo plans again wherever ``quant_info`` changed)."""
        self.plan.check(self.config, quant_info)
        return self.plan.launches(self.config, dispatch, quant_info)
