"""The format kits: one folder each, imports pointing down, every kit complete and its oracle registered."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from moe_core import formats
from moe_core.conversion import WeightFormat
from moe_core.registry import registered_backends

KITS = Path(formats.__file__).parent
KIT_DIRS = sorted(path for path in KITS.iterdir() if path.is_dir() and not path.name.startswith("_"))
ABOVE = ("moe_core.registry", "moe_core.scheme", "moe_core.schemes", "moe_core.backends", "moe_core.check", "moe_core.cli")
"""Modules a kit must not import: they import the kits."""


def imported_modules(path: Path) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module is not None:
            found.append(node.module)
        elif isinstance(node, ast.Import):
            found += [alias.name for alias in node.names]
    return found


@pytest.mark.parametrize("path", sorted(KITS.rglob("*.py")), ids=lambda path: str(path.relative_to(KITS)))
def test_kits_import_only_downward(path: Path) -> None:
    for module in imported_modules(path):
        assert module != "moe_core", f"{path.name} imports the package's __init__"
        assert not module.startswith(ABOVE), f"{path} imports {module}, which imports the kits"


@pytest.mark.parametrize("kit", KIT_DIRS, ids=lambda path: path.name)
def test_every_kit_has_its_weights_reference_and_constant(kit: Path) -> None:
    assert {path.name for path in kit.glob("*.py")} == {"__init__.py", "weights.py", "reference.py"}


def test_every_format_has_a_registered_oracle() -> None:
    constants = [value for value in vars(formats).values() if isinstance(value, WeightFormat)]
    assert len(constants) == len(KIT_DIRS)
    oracles = {fmt.name for entry in registered_backends() if entry.priority.tier.name == "ORACLE" for fmt in entry.formats}
    assert {fmt.name for fmt in constants} <= oracles
