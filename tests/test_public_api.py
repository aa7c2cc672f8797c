"""The public API is documented: every exported name and its public members."""

from __future__ import annotations

import ast
import enum
import inspect
import subprocess
import sys
from importlib import import_module

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


def test_every_name_in_all_resolves_lazily_to_its_module() -> None:
    """``moe_core`` imports each public name on first access, from the module its table names."""
    assert sorted(moe_core._MODULE_OF) == sorted(moe_core.__all__)
    for name in moe_core.__all__:
        assert getattr(moe_core, name) is getattr(import_module(moe_core._MODULE_OF[name]), name), name


def test_type_checking_imports_are_the_lazy_table() -> None:
    """mypy reads the ``if TYPE_CHECKING:`` imports, the interpreter ``_MODULES``: they must name the same things."""
    tree = ast.parse(inspect.getsource(moe_core))
    (block,) = [node for node in tree.body if isinstance(node, ast.If) and ast.unparse(node.test) == "TYPE_CHECKING"]
    imported: dict[str, list[str]] = {}
    for node in block.body:
        assert isinstance(node, ast.ImportFrom) and node.module is not None
        for alias in node.names:
            assert alias.asname == alias.name, f"{alias.name}: re-export it as `{alias.name} as {alias.name}`"
            imported.setdefault(node.module, []).append(alias.name)
    assert {module: sorted(names) for module, names in imported.items()} == {
        module: sorted(names) for module, names in moe_core._MODULES.items()
    }


def test_a_fresh_interpreter_resolves_every_name() -> None:
    """In a new process, with nothing imported before: attribute access, ``from moe_core import *``, and no torch until then."""
    program = (
        "import sys, moe_core\n"
        "assert 'torch' not in sys.modules, 'import moe_core imported torch'\n"
        "missing = [name for name in moe_core.__all__ if getattr(moe_core, name, None) is None]\n"
        "namespace = {}\n"
        "exec('from moe_core import *', namespace)\n"
        "print(missing, sorted(set(moe_core.__all__) - set(namespace)), set(moe_core.__all__) <= set(dir(moe_core)))\n"
    )
    result = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split("\n")[0] == "[] [] True"
