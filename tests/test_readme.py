"""README's Python example runs as written, and its commands match .ci/run."""

from __future__ import annotations

import re
from pathlib import Path

from tests.mypy_cases import readme_example

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()


def test_readme_example_runs() -> None:
    exec(compile(readme_example(), "README.md", "exec"), {})


def test_ci_runs_the_readme_test_command() -> None:
    commands = re.findall(r"```sh\n(.*?)\n```", README, flags=re.DOTALL)
    assert len(commands) == 2, commands
    ci_lines = [line for line in (ROOT / ".ci" / "run").read_text().splitlines() if line and not line.startswith("#")]
    assert commands[1] in ci_lines, (commands[1], ci_lines)
