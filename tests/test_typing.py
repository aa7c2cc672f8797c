"""Strict mypy over the project, and the programs it must reject (see ``mypy_cases``).

mypy runs twice per session (the project, then the rejected files) with the
persistent cache in ``.mypy_cache``, so only a cold first run is slow.
``test_installed.py`` runs the same cases against the built wheel.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.mypy_cases import REJECTED, ROOT, Verdict, check_verdict, errors_by_file


def run_mypy(*targets: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "mypy", "--strict", "--config-file", "mypy.ini", *targets]
    return subprocess.run(command, cwd=ROOT, capture_output=True, text=True, check=False)


@pytest.fixture(scope="session")
def rejected_errors() -> dict[str, Verdict]:
    return errors_by_file(run_mypy(*(str(path.relative_to(ROOT)) for path in REJECTED)).stdout)


def test_mypy_strict_is_clean() -> None:
    result = run_mypy("moe_core", "backends", "schemes", "tests")
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.startswith("Success: no issues found"), result.stdout


def test_there_are_rejected_cases() -> None:
    assert len(REJECTED) >= 4


@pytest.mark.parametrize("path", REJECTED, ids=[path.stem for path in REJECTED])
def test_mypy_rejects(path: Path, rejected_errors: dict[str, Verdict]) -> None:
    check_verdict(path, rejected_errors.get(str(path.relative_to(ROOT)), set()))
