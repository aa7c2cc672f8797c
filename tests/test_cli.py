"""The ``moe-core`` command as a user runs it."""

from __future__ import annotations

import subprocess
import sys

import pytest

from backends.reference import ReferenceNvfp4Runner, reference_availability
from moe_core import BackendKey, Nvfp4MoeWeights, registry
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


def test_check_reports_a_failing_backend_and_exits_1(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(weights: Nvfp4MoeWeights) -> Nvfp4MoeWeights:
        raise RuntimeError("kernel launch failed")

    key = BackendKey("broken-nvfp4", "always fails", ReferenceNvfp4Runner, reference_availability, broken)
    monkeypatch.setitem(registry._REGISTRY, key.name, key)  # registered for this test only

    assert main(["check", "--tokens", "4", "--experts", "2", "--hidden", "16", "--intermediate", "16", "--iters", "1"]) == 1
    row = [line for line in capsys.readouterr().out.splitlines() if line.startswith("broken-nvfp4")]
    assert row and row[0].endswith("FAILED: RuntimeError: kernel launch failed")


def test_check_refuses_a_device_the_reference_cannot_use(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check", "--device", "meta"]) == 2
    assert "the reference backend cannot run on meta: meta tensors hold no values" in capsys.readouterr().err


def test_module_entry_point_runs() -> None:
    result = subprocess.run([sys.executable, "-m", "moe_core", "info"], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr
    assert "reference-nvfp4" in result.stdout


def test_format_table_aligns_columns() -> None:
    assert format_table(["a", "bb"], [["xyz", "1"]]).splitlines() == ["a    bb", "---  --", "xyz  1"]
