"""What selection would do for each format on a device: every candidate, its answer, and the one chosen.

``moe-core info`` prints these rows (as a table, or JSON with ``--json``);
the device may be described (``sm90``, ``sm100``), so any machine can say
what an H200 or a B200 would run.
"""

from __future__ import annotations

from typing import final

import attrs
import torch

from moe_core.capability import DeviceSpec, LayerSpec
from moe_core.config import MoeRunnerConfig
from moe_core.registry import (
    BackendSelectionError,
    candidates,
    known_formats,
    plugin_errors,
    registered_backends,
    select_backend,
)

INFO_LAYER = MoeRunnerConfig(num_experts=8, hidden_size=4096, intermediate_size_per_partition=14336, top_k=2)
"""The layer ``moe-core info`` asks about unless told otherwise (Mixtral-8x7B's sizes: every kernel's tiles fit)."""


@final
@attrs.frozen
class CandidateRow:
    """One (format, backend) candidate for a layer on a device."""

    format: str
    backend: str
    tier: str
    chosen: bool
    supported: bool
    """Selection by rank may take it (ok, and not by name only)."""
    reasons: tuple[str, ...]
    """Why not, or why only by name; empty when supported."""
    degradation: str | None
    """The degradation between formats it goes through, in words."""

    def as_json(self) -> dict[str, object]:
        """The row as the JSON object ``moe-core info --json`` prints."""
        return {
            "format": self.format,
            "backend": self.backend,
            "tier": self.tier,
            "chosen": self.chosen,
            "supported": self.supported,
            "reasons": list(self.reasons),
            "degradation": self.degradation,
        }


def candidate_rows(
    device: DeviceSpec, config: MoeRunnerConfig = INFO_LAYER, dtype: torch.dtype = torch.bfloat16
) -> list[CandidateRow]:
    """A row per candidate of every known format, in rank order, the chosen one marked (none where nothing fits)."""
    rows = []
    for fmt in known_formats():
        layer = LayerSpec(config, fmt, dtype)
        routes = candidates(fmt)
        try:
            chosen: object = select_backend(routes, device, layer).chosen
        except BackendSelectionError:
            chosen = None
        for route in routes:
            support = route.supports(device, layer)
            reasons = support.reasons if not support.ok else (() if support.by_name_only is None else (support.by_name_only,))
            rows.append(
                CandidateRow(
                    format=fmt.name,
                    backend=route.name,
                    tier=route.priority.tier.name.lower(),
                    chosen=route is chosen,
                    supported=support.ranked,
                    reasons=tuple(reasons),
                    degradation=route.degradation,
                )
            )
    return rows


def broken_backends(device: DeviceSpec, config: MoeRunnerConfig = INFO_LAYER) -> list[tuple[str, str]]:
    """Backends whose own check raised, or that failed to load, with the reason: faulty plugins."""
    found = [(f"entry point {name}", f"failed to load: {error}") for name, error in plugin_errors().items()]
    for entry in registered_backends():
        verdicts = [entry.supports(device, LayerSpec(config, fmt)) for fmt in entry.formats]
        broken = next((verdict for verdict in verdicts if verdict.broken), None)
        if broken is not None:
            found.append((entry.name, broken.describe()))
    return found
