"""moe-core as users get it: the built wheel in a fresh venv, used from outside the repo.

The wheel is built from a clean copy of the sources and installed with pip
into a venv under pytest's cache; the venv sees this environment's
third-party packages (torch, attrs, mypy) through a ``.pth`` line, which
exposes none of moe-core itself. The venv is rebuilt only when a source
file changes, and mypy keeps its cache beside it, so after the first run
these tests take seconds.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import sysconfig
import venv
from pathlib import Path

import attrs
import pytest

from tests.mypy_cases import ACCEPTED, REJECTED, ROOT, check_verdict, errors_by_file, readme_examples
from tests.test_cli import table_rows

WHEEL_SOURCES = ("pyproject.toml", "README.md", "moe_core", "backends", "schemes")
"""What the wheel is built from (moe_core/backends and moe_core/schemes are links to the top-level folders)."""


@attrs.frozen
class InstalledVenv:
    """A venv holding the installed wheel."""

    root: Path
    mypy_cache: Path

    @property
    def python(self) -> Path:
        return self.root / "bin" / "python"

    @property
    def moe_core_script(self) -> Path:
        return self.root / "bin" / "moe-core"


def _source_files() -> list[Path]:
    files = []
    for name in WHEEL_SOURCES:
        path = ROOT / name
        if path.is_file():
            files.append(path)
            continue
        for dirpath, dirnames, filenames in os.walk(path):  # does not descend into the links
            dirnames[:] = [d for d in dirnames if d != "__pycache__"]
            files.extend(Path(dirpath) / f for f in filenames if not f.endswith(".pyc"))
    return sorted(files)


def _digest() -> str:
    digest = hashlib.sha256()
    for path in _source_files():
        digest.update(str(path.relative_to(ROOT)).encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def _run(command: list[str | Path], cwd: Path | str | None = None, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    result = subprocess.run([str(part) for part in command], cwd=cwd, env=env, capture_output=True, text=True, check=False)
    assert result.returncode == 0, f"{command} failed:\n{result.stdout}\n{result.stderr}"
    return result


def _build_and_install(where: Path) -> None:
    source = where / "source"
    shutil.rmtree(where, ignore_errors=True)
    for name in WHEEL_SOURCES:
        path = ROOT / name
        if path.is_dir():
            shutil.copytree(path, source / name, symlinks=True, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            source.mkdir(parents=True, exist_ok=True)
            shutil.copy2(path, source / name)
    dist = where / "dist"
    _run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", dist, source])
    (wheel,) = dist.glob("moe_core-*.whl")
    target = where / "venv"
    venv.EnvBuilder(with_pip=False).create(target)
    purelib = _run([target / "bin" / "python", "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"])
    ours = {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}
    (Path(purelib.stdout.strip()) / "moe_core_test_dependencies.pth").write_text("\n".join(sorted(ours)) + "\n")
    _run([sys.executable, "-m", "pip", "--python", target / "bin" / "python", "install", "-q", "--no-deps", wheel])


@pytest.fixture(scope="session")
def installed(request: pytest.FixtureRequest) -> InstalledVenv:
    """The wheel of the current sources, installed into a cached venv."""
    cache = request.config.cache
    assert cache is not None, "the installed-wheel tests keep their venv in pytest's cache (do not run with -p no:cacheprovider)"
    home = cache.mkdir("installed-wheel")
    stamp = home / "built-from.sha256"
    digest = _digest()
    if not stamp.is_file() or stamp.read_text() != digest:
        _build_and_install(home / "build")
        stamp.write_text(digest)
    result = InstalledVenv(home / "build" / "venv", home / "mypy-cache")
    where = _run([result.python, "-c", "import moe_core.backends.reference as m; print(m.__file__)"], cwd="/")
    assert Path(where.stdout.strip()).is_relative_to(result.root), f"moe_core came from {where.stdout}, not the venv"
    return result


def _user_programs(directory: Path) -> dict[str, Path | None]:
    """README's examples and every typing case copied to ``directory``: {copy name: its rejected case or None}."""
    directory.mkdir()
    programs: dict[str, Path | None] = {}
    for number, example in enumerate(readme_examples()):
        name = f"readme_example_{number}.py"
        (directory / name).write_text(example)
        programs[name] = None
    for case in ACCEPTED:
        shutil.copy(case, directory / case.name)
        programs[case.name] = None
    for case in REJECTED:
        shutil.copy(case, directory / case.name)
        programs[case.name] = case
    return programs


def _check_user_mypy(python: Path, cache_dir: Path, where: Path) -> None:
    programs = _user_programs(where / "user")
    command = [python, "-m", "mypy", "--strict", "--cache-dir", cache_dir, *programs]
    result = subprocess.run([str(c) for c in command], cwd=where / "user", capture_output=True, text=True, check=False)
    assert "Skipping analyzing" not in result.stdout and "import-untyped" not in result.stdout, result.stdout
    errors = errors_by_file(result.stdout)
    for name, case in programs.items():
        if case is None:
            assert name not in errors, f"{name} must type-check:\n{result.stdout}"
        else:
            check_verdict(case, errors.get(name, set()))
    assert set(errors) <= set(programs), result.stdout


def test_mypy_outside_the_repo_gives_the_repos_verdicts_on_the_wheel(installed: InstalledVenv, tmp_path: Path) -> None:
    _check_user_mypy(installed.python, installed.mypy_cache, tmp_path)


def test_mypy_outside_the_repo_sees_the_development_install(tmp_path: Path, request: pytest.FixtureRequest) -> None:
    """The install README's commands make (editable, strict mode) is one a downstream mypy can read."""
    assert request.config.cache is not None
    _check_user_mypy(Path(sys.executable), request.config.cache.mkdir("mypy-outside-dev-install"), tmp_path)


def test_an_application_backends_package_neither_hides_nor_is_hidden(installed: InstalledVenv, tmp_path: Path) -> None:
    app = tmp_path / "app"
    for package in ("backends", "schemes"):
        (app / package).mkdir(parents=True)
        (app / package / "__init__.py").write_text(f'"""The application\'s own {package}."""\nOWNER = "app"\n')
    env = {**os.environ, "PYTHONPATH": str(app)}
    commands: list[list[str | Path]] = [[installed.moe_core_script, "info"], [installed.python, "-m", "moe_core", "info"]]
    for command in commands:
        result = _run(command, cwd=app, env=env)
        rows = table_rows(result.stdout, 0)
        assert rows["dense reference-dense"][3] == "yes" and rows["nvfp4 reference-nvfp4"][3] == "yes", result.stdout
        assert "failed to load" not in result.stdout
    check = _run([installed.moe_core_script, "check", "--tokens", "4", "--hidden", "128", "--intermediate", "128", "--experts", "4"], cwd=app, env=env)
    rows = table_rows(check.stdout)
    flashinfer = {key: row[-1] for key, row in rows.items() if " flashinfer-" in f" {key}" and "[" not in key}
    others = [row[-1] for key, row in rows.items() if key not in flashinfer]  # the variants' rows: skipped
    assert others and all(verdict in ("ok", "info") or verdict.startswith("skipped: ") for verdict in others), check.stdout
    assert {"fp8 triton-fp8", "fp8-channel triton-fp8", "fp8-block triton-fp8-block"} <= rows.keys(), check.stdout
    assert len(flashinfer) == 4, check.stdout
    assert all(v.startswith("unsupported: ") and "needs a CUDA GPU of SM" in v for v in flashinfer.values()), check.stdout
    probe = "import backends, schemes, moe_core.backends.reference as ours; print(backends.OWNER, schemes.OWNER, ours.REFERENCE_NVFP4.name)"
    assert _run([installed.python, "-c", probe], cwd=app, env=env).stdout.split() == ["app", "app", "reference-nvfp4"]
