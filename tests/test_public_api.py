"""The public API is documented: every exported name and its public members."""

from __future__ import annotations

import enum
import inspect

import moe_core
from moe_core import checkpoint, expert_params, scheme
from moe_core.schemes import compressed_tensors_w4a4_nvfp4, modelopt_nvfp4, unquantized

MODULES = (checkpoint, expert_params, scheme, compressed_tensors_w4a4_nvfp4, modelopt_nvfp4, unquantized)
"""Public modules outside ``moe_core.__all__``: their own public classes and functions."""


def public_names() -> list[tuple[str, object]]:
    names: list[tuple[str, object]] = [(name, getattr(moe_core, name)) for name in moe_core.__all__]
    for module in MODULES:
        for name, obj in vars(module).items():
            if not name.startswith("_") and getattr(obj, "__module__", None) == module.__name__:
                names.append((f"{module.__name__}.{name}", obj))
    return names


def undocumented() -> list[str]:
    missing = []
    for name, obj in public_names():
        if not inspect.getdoc(obj):
            missing.append(name)
        if not inspect.isclass(obj) or issubclass(obj, enum.Enum):
            continue
        for member, value in vars(obj).items():
            if member.startswith("_") or not (callable(value) or isinstance(value, (property, classmethod))):
                continue
            if not inspect.getdoc(value):
                missing.append(f"{name}.{member}")
    return missing


def test_every_public_name_has_a_docstring() -> None:
    assert undocumented() == []


def test_all_lists_only_existing_names() -> None:
    assert sorted(moe_core.__all__) == sorted(set(moe_core.__all__))
    for name in moe_core.__all__:
        assert hasattr(moe_core, name), name
