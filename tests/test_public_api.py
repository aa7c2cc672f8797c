"""The public API is documented: every exported name and its public members."""

from __future__ import annotations

import enum
import inspect

import moe_core


def undocumented() -> list[str]:
    missing = []
    for name in moe_core.__all__:
        obj = getattr(moe_core, name)
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
