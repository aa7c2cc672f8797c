"""Every code block of README runs as written: its Python examples, its CLI lines, its entry-point snippet, and its
two commands are .ci/run's and the main job's."""

from __future__ import annotations

import re
import shlex
import tomllib
from pathlib import Path

import pytest

from moe_core.cli import main
from moe_core.registry import ENTRY_POINT_GROUP
from tests.mypy_cases import readme_examples

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()
FENCE = re.compile(r"```(?P<lang>\w+)\n(?P<body>.*?)```", flags=re.DOTALL)
BLOCKS = [(match["lang"], match["body"]) for match in FENCE.finditer(README)]


def test_every_block_is_of_a_language_the_tests_run() -> None:
    assert {lang for lang, _ in BLOCKS} <= {"python", "sh", "console", "toml"}, {lang for lang, _ in BLOCKS}


@pytest.mark.parametrize("number", range(len(readme_examples())))
def test_readme_python_example_runs(number: int, isolated_registry: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)
    exec(compile(readme_examples()[number], f"README.md python block {number}", "exec"), {"__name__": "readme"})


def test_readme_cli_lines_run(capsys: pytest.CaptureFixture[str]) -> None:
    lines = [line for lang, body in BLOCKS if lang == "console" for line in body.splitlines()]
    assert lines and all(line.startswith("$ moe-core ") for line in lines), lines
    for line in lines:
        assert main(shlex.split(line)[2:]) == 0, line
    assert '"chosen": true' in capsys.readouterr().out


def test_readme_entry_point_snippet_names_the_group() -> None:
    (snippet,) = [body for lang, body in BLOCKS if lang == "toml"]
    groups = tomllib.loads(snippet)["project"]["entry-points"]
    assert list(groups) == [ENTRY_POINT_GROUP]


def test_ci_runs_the_readme_test_command() -> None:
    commands = [body.strip() for lang, body in BLOCKS if lang == "sh"]
    assert len(commands) == 2, commands
    ci_lines = [line for line in (ROOT / ".ci" / "run").read_text().splitlines() if line and not line.startswith("#")]
    assert commands[1] in ci_lines, (commands[1], ci_lines)
    assert commands[0].endswith("moe-core info && .venv/bin/moe-core check"), "the main job: what runs where, then check"
