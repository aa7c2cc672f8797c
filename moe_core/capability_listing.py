"""Which activations and routing methods each registered backend computes, asked of its own ``supports``.

For ``moe-core info``: every backend is asked about a plain layer on the
device (gated SiLU, top-k renormalize, sizes every kernel tiles), then about
the same layer with each activation and each routing method in turn; a value
is supported when it adds no reason to the plain layer's (a backend refused
on this device for other reasons can still say what it would compute).
"""

from __future__ import annotations

from typing import final

import attrs
import torch

from moe_core.capability import DeviceSpec, LayerSpec, Support
from moe_core.config import EXAMPLE_ACTIVATIONS, ExpertActivation, MoeRunnerConfig, Routing, example_routings
from moe_core.conversion import FormatInfo
from moe_core.registry import BackendEntry, registered_backends

PLAIN = MoeRunnerConfig(num_experts=64, hidden_size=1024, intermediate_size_per_partition=1024, top_k=2)
"""The layer every value is tried on: sizes that fit every kernel's tiles, top-2 (sparsemixer's only k)."""

ACTIVATIONS: tuple[ExpertActivation, ...] = EXAMPLE_ACTIVATIONS
"""Every activation, with gpt-oss's parameters for the clamped SwiGLU."""

ROUTINGS: tuple[Routing, ...] = example_routings(PLAIN.num_experts, PLAIN.top_k)
"""Every routing method (DeepSeek-V3's group sizes, 8 groups of which 4 kept; PhiMoE's jitter)."""


@final
@attrs.frozen
class Verdict:
    """One value asked of one backend: supported, or the reasons it added to the plain layer's."""

    value: str
    reasons: tuple[str, ...]

    @property
    def ok(self) -> bool:
        """True when the value adds no reason."""
        return not self.reasons


@final
@attrs.frozen
class CapabilityRow:
    """One backend's answers on one device."""

    backend: str
    format: str
    """The format the backend was asked about (its first)."""
    plain: Support
    """Its answer for the plain layer: whether it runs here at all."""
    activations: tuple[Verdict, ...]
    routings: tuple[Verdict, ...]

    def supported_activations(self) -> tuple[str, ...]:
        """The names of the activations it computes."""
        return tuple(verdict.value for verdict in self.activations if verdict.ok)

    def supported_routings(self) -> tuple[str, ...]:
        """The names of the routing methods it honours."""
        return tuple(verdict.value for verdict in self.routings if verdict.ok)


def _verdict(value: str, support: Support, plain: Support) -> Verdict:
    return Verdict(value, tuple(reason for reason in support.reasons if reason not in plain.reasons))


def _ask(entry: BackendEntry, fmt: FormatInfo, device: DeviceSpec, dtype: torch.dtype, config: MoeRunnerConfig) -> Support:
    return entry.supports(device, LayerSpec(config, fmt, dtype))


def capability_table(device: DeviceSpec, *, dtype: torch.dtype = torch.bfloat16) -> tuple[CapabilityRow, ...]:
    """Each registered backend's supported activations and routing methods for ``dtype`` hidden states on
    ``device``; backends that declare no format (a failed plugin) are left out."""
    if not isinstance(device, DeviceSpec):
        raise TypeError(f"device: expected a DeviceSpec, got {type(device).__name__}")
    rows = []
    for entry in registered_backends():
        if not entry.formats:
            continue
        fmt = entry.formats[0]
        plain = _ask(entry, fmt, device, dtype, PLAIN)
        activations = tuple(
            _verdict(a.value, _ask(entry, fmt, device, dtype, attrs.evolve(PLAIN, activation=a)), plain)
            for a in ACTIVATIONS
        )
        routings = tuple(
            _verdict(r.value, _ask(entry, fmt, device, dtype, attrs.evolve(PLAIN, routing_method=r)), plain)
            for r in ROUTINGS
        )
        rows.append(CapabilityRow(entry.name, fmt.name, plain, activations, routings))
    return tuple(rows)
