"""Strict mypy over the project, and the programs it must reject.

Each file in ``type_cases/rejected`` marks the line mypy must reject with
``# expect: [code] message``; the file must produce exactly those errors.
mypy runs twice per session (the project, then the rejected files) with the
persistent cache in ``.mypy_cache``, so only a cold first run is slow.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
REJECTED = sorted((ROOT / "tests" / "type_cases" / "rejected").glob("[!_]*.py"))
EXPECT = re.compile(r"# expect: \[(?P<code>[a-z-]+)\] (?P<message>.+)$")
ERROR = re.compile(r"^(?P<path>[^:]+):(?P<line>\d+): error: (?P<message>.+?)  \[(?P<code>[a-z-]+)\]$")


def run_mypy(*targets: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "mypy", "--strict", "--config-file", "mypy.ini", *targets]
    return subprocess.run(command, cwd=ROOT, capture_output=True, text=True, check=False)


@pytest.fixture(scope="session")
def rejected_errors() -> dict[str, set[tuple[int, str, str]]]:
    result = run_mypy(*(str(path.relative_to(ROOT)) for path in REJECTED))
    errors: dict[str, set[tuple[int, str, str]]] = {}
    for line in result.stdout.splitlines():
        match = ERROR.match(line)
        if match:
            errors.setdefault(match["path"], set()).add((int(match["line"]), match["code"], match["message"]))
    return errors


def test_mypy_strict_is_clean() -> None:
    result = run_mypy("moe_core", "backends", "schemes", "tests")
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.startswith("Success: no issues found"), result.stdout


def test_there_are_rejected_cases() -> None:
    assert len(REJECTED) >= 4


@pytest.mark.parametrize("path", REJECTED, ids=[path.stem for path in REJECTED])
def test_mypy_rejects(path: Path, rejected_errors: dict[str, set[tuple[int, str, str]]]) -> None:
    expected = []
    for number, text in enumerate(path.read_text().splitlines(), start=1):
        match = EXPECT.search(text)
        if match:
            expected.append((number, match["code"], match["message"]))
    assert expected, f"{path.name} marks no line with '# expect: [code] message'"
    actual = rejected_errors.get(str(path.relative_to(ROOT)), set())
    assert {(line, code) for line, code, _ in actual} == {(line, code) for line, code, _ in expected}, actual
    for line, _, message in expected:
        (actual_message,) = [m for n, _, m in actual if n == line]
        assert message in actual_message, f"line {line}: mypy said {actual_message!r}"
