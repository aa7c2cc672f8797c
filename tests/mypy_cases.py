"""The typing cases and how to read mypy's verdicts on them, shared by the in-repo and installed-wheel runs.

Each file in ``type_cases/rejected`` marks the line mypy must reject with
``# expect: [code] message``; each file in ``type_cases/accepted`` must
type-check, as must every Python example in README.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CASES = ROOT / "tests" / "type_cases"
ACCEPTED = sorted((CASES / "accepted").glob("[!_]*.py"))
REJECTED = sorted((CASES / "rejected").glob("[!_]*.py"))
EXPECT = re.compile(r"# expect: \[(?P<code>[a-z-]+)\] (?P<message>.+)$")
ERROR = re.compile(r"^(?P<path>[^:]+):(?P<line>\d+): error: (?P<message>.+?)  \[(?P<code>[a-z-]+)\]$")

Verdict = set[tuple[int, str, str]]
"""mypy errors of one file: (line, code, message)."""


def readme_examples() -> list[str]:
    """README's Python blocks, the examples a new user copies, in order."""
    blocks = re.findall(r"```python\n(.*?)```", (ROOT / "README.md").read_text(), flags=re.DOTALL)
    assert blocks, "README has no python example"
    return [str(block) for block in blocks]


def expected_errors(path: Path) -> Verdict:
    """The errors ``path`` marks with ``# expect:`` comments."""
    expected = set()
    for number, text in enumerate(path.read_text().splitlines(), start=1):
        match = EXPECT.search(text)
        if match:
            expected.add((number, match["code"], match["message"]))
    assert expected, f"{path.name} marks no line with '# expect: [code] message'"
    return expected


def errors_by_file(mypy_stdout: str) -> dict[str, Verdict]:
    """mypy's errors keyed by the path as mypy printed it."""
    errors: dict[str, Verdict] = {}
    for line in mypy_stdout.splitlines():
        match = ERROR.match(line)
        if match:
            errors.setdefault(match["path"], set()).add((int(match["line"]), match["code"], match["message"]))
    return errors


def check_verdict(path: Path, actual: Verdict) -> None:
    """Assert that mypy said exactly what ``path`` expects: same lines and codes, messages containing the marks."""
    expected = expected_errors(path)
    assert {(line, code) for line, code, _ in actual} == {(line, code) for line, code, _ in expected}, actual
    for line, _, message in expected:
        (actual_message,) = [m for n, _, m in actual if n == line]
        assert message in actual_message, f"{path.name} line {line}: mypy said {actual_message!r}"
