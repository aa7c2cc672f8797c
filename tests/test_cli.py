"""The ``moe-core`` command as a user runs it."""

from __future__ import annotations

import subprocess
import sys

import pytest

from moe_core.cli import format_table, main


def test_info_lists_reference_backends(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["info"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("moe-core backends on cpu")
    rows = {line.split()[0]: line.split()[1] for line in out.splitlines()[3:]}
    assert rows["reference-dense"] == "yes" and rows["reference-nvfp4"] == "yes"


def test_check_runs_the_reference_and_reports_errors(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check", "--tokens", "8", "--experts", "4", "--hidden", "32", "--intermediate", "64", "--iters", "2"]) == 0
    captured = capsys.readouterr()
    assert "building a random NVFP4 layer: 8 tokens, 4 experts (top 2)" in captured.err
    lines = {line.split()[0]: line.split() for line in captured.out.splitlines()[3:]}
    assert lines["reference-nvfp4"][1:3] == ["0.00e+00", "0.00e+00"] and lines["reference-nvfp4"][-1] == "reference"
    assert float(lines["reference-nvfp4"][3]) > 0
    assert "skipped: runs no NVFP4" in " ".join(lines["reference-dense"])


def test_check_reports_bad_sizes_clearly(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check", "--hidden", "40"]) == 2
    assert "multiple of 16" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["check", "--tokens", "0"])
    assert "expected a positive integer, got 0" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["info", "--device", "tpu-ish"])
    assert "not a torch device" in capsys.readouterr().err


def test_module_entry_point_runs() -> None:
    result = subprocess.run([sys.executable, "-m", "moe_core", "info"], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr
    assert "reference-nvfp4" in result.stdout


def test_format_table_aligns_columns() -> None:
    assert format_table(["a", "bb"], [["xyz", "1"]]).splitlines() == ["a    bb", "---  --", "xyz  1"]
