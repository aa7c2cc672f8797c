"""Shared fixtures: fresh random inputs every run, with the seed reported."""

from __future__ import annotations

import os
import secrets
import sys
from collections.abc import Iterator

import pytest
import torch

if not torch.cuda.is_available():
    # Triton's kernels run under its CPU interpreter here; the flag must be set before they are defined.
    os.environ.setdefault("TRITON_INTERPRET", "1")

from moe_core import registry

registry.discover_backends()


@pytest.fixture
def gen() -> torch.Generator:
    """A generator seeded afresh per test (``MOE_CORE_SEED`` replays one); the seed is printed."""
    seed = int(os.environ.get("MOE_CORE_SEED", secrets.randbits(31)))
    print(f"seed {seed} (replay with MOE_CORE_SEED={seed})")
    return torch.Generator().manual_seed(seed)


@pytest.fixture
def isolated_registry(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Registrations made by the test vanish after it, and so do the plugin modules it imported; discovery runs
    afresh inside it (so monkeypatched entry points are found)."""
    monkeypatch.setattr(registry, "_REGISTRY", dict(registry._REGISTRY))
    monkeypatch.setattr(registry, "_DISCOVERY", registry._Discovered())
    yield
    for name in [name for name in sys.modules if name.startswith("tests.plugins.")]:
        del sys.modules[name]
