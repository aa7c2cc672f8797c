"""The ``moe-core`` command as a user runs it, faulty plugins included."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from importlib.metadata import EntryPoint, entry_points
from pathlib import Path

import pytest
import torch

from moe_core import DenseMoeWeights, Fp8MoeWeights, MoeRunnerConfig, StandardDispatchOutput, registry
from moe_core.backends.reference import REFERENCE_FP8
from moe_core.check import FORMAT_CHECKS, CheckRun, FormatCheck
from moe_core.cli import format_table, main
from moe_core.formats import FP8
from moe_core.formats import fp8_block_size_refusal
from moe_core.registry import ENTRY_POINT_GROUP
from moe_core.synthetic import random_dense_layer

FIXTURES = Path(__file__).resolve().parent / "fixtures"
SMALL = ["--tokens", "6", "--experts", "4", "--hidden", "32", "--intermediate", "32", "--iters", "1"]


def table_lines(out: str, which: int = -1) -> list[list[str]]:
    """Rows of table ``which`` (default: the last) in ``out``, each split into cells on runs of 2+ spaces."""
    lines = out.splitlines()
    rule = [index for index, line in enumerate(lines) if line.startswith("---")][which]
    body = []
    for line in lines[rule + 1 :]:
        if not line.strip():
            break
        body.append([cell.strip() for cell in line.split("  ") if cell.strip()])
    return body


def table_rows(out: str, which: int = -1) -> dict[str, list[str]]:
    """The first row of each '<first cell> <second cell>' key in table ``which`` (default: the last) of ``out``."""
    rows: dict[str, list[str]] = {}
    for cells in table_lines(out, which):
        rows.setdefault(" ".join(cells[:2]), cells)
    return rows


@pytest.fixture
def plugins(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Faulty plugins beside the real entry points; everything they register vanishes after the test."""
    monkeypatch.setattr(registry, "_REGISTRY", dict(registry._REGISTRY))
    extra = [
        EntryPoint("faulty", "tests.plugins.faulty_backends", ENTRY_POINT_GROUP),
        EntryPoint("half", "tests.plugins.raises_after_register", ENTRY_POINT_GROUP),
        EntryPoint("impostor", "tests.plugins.takes_reference_name", ENTRY_POINT_GROUP),
    ]
    real = list(entry_points(group=ENTRY_POINT_GROUP))
    monkeypatch.setattr(registry, "entry_points", lambda group: [*extra, *real])
    yield
    for name in [name for name in sys.modules if name.startswith("tests.plugins.")]:
        del sys.modules[name]


def test_info_lists_reference_backends(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["info"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("moe-core backends on cpu")
    rows = table_rows(out, 0)
    assert rows["reference-dense yes"][2] == "dense" and rows["reference-nvfp4 yes"][2] == "nvfp4"


def test_check_verifies_each_reference_against_float64(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check", *SMALL]) == 0
    captured = capsys.readouterr()
    assert "moe-core check on cpu" in captured.err and "seed 0" in captured.err
    rows = table_rows(captured.out)
    dense, nvfp4 = rows["dense reference-dense"], rows["nvfp4 reference-nvfp4"]
    (quant,) = [row for row in table_lines(captured.out) if row[0] == "nvfp4" and "unquantized" in row[2]]
    assert dense[2] == "float64 MoE" and dense[-1] == "ok" and 0 < float(dense[3]) < 7.8e-3
    assert nvfp4[2] == "float64 W4A4 MoE" and nvfp4[-1] == "ok" and 0 < float(nvfp4[3]) < 7.8e-3
    assert quant[-1] == "info" and 0.05 < float(quant[3]) < 0.5, "W4A4 must cost a visible error against the float layer"
    assert float(nvfp4[6]) > 0
    w4a16 = rows["nvfp4-w4a16 reference-nvfp4-w4a16"]
    assert w4a16[2] == "float64 MoE, dequantized" and w4a16[-1] == "ok" and 0 < float(w4a16[3]) < 7.8e-3
    # the Triton backends run here under Triton's CPU interpreter, each against its format's reference
    assert rows["dense triton-dense"][2] == "reference-dense" and rows["dense triton-dense"][-1] == "ok"
    assert rows["nvfp4-w4a16 triton-nvfp4-w4a16"][2] == "reference-nvfp4-w4a16"
    assert rows["nvfp4-w4a16 triton-nvfp4-w4a16"][-1] == "ok"
    for fmt, reference in (("fp8", "reference-fp8"), ("fp8-channel", "reference-fp8-channel")):
        assert rows[f"{fmt} {reference}"][-1] == "ok" and rows[f"{fmt} triton-fp8"][2] == reference
        assert rows[f"{fmt} triton-fp8"][-1] == "ok"
    # SMALL's sizes are off the 128 grid of block-scaled FP8: one skipped row says so instead of a crash
    assert rows["fp8-block reference-fp8-block"][-1].startswith("skipped: Fp8BlockMoeWeights: expected hidden and")


def test_check_in_fp32_pins_the_references_to_float32_rounding(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check", *SMALL, "--dtype", "fp32"]) == 0
    rows = table_rows(capsys.readouterr().out)
    assert float(rows["dense reference-dense"][3]) < 1e-5 and float(rows["nvfp4 reference-nvfp4"][3]) < 1e-5


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["check", "--hidden", "40"], "argument --hidden: expected a positive multiple of 16 (NVFP4 blocks), got 40"),
        (["check", "--tokens", "1.5"], "argument --tokens: expected a positive integer, got '1.5'"),
        (["check", "--tokens", "0"], "argument --tokens: expected a positive integer, got 0"),
        (["check", "--tolerance", "-1"], "argument --tolerance: expected a finite number > 0, got '-1'"),
        (["check", "--tolerance", "nan"], "argument --tolerance: expected a finite number > 0, got 'nan'"),
        (["check", "--experts", "2", "--top-k", "3"], "argument --top-k: expected at most --experts=2, got 3"),
        (["info", "--device", "tpu-ish"], "argument --device: expected a torch device, got 'tpu-ish'"),
    ],
)
def test_bad_flags_are_named_as_the_user_typed_them(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


@pytest.mark.usefixtures("plugins")
def test_info_reports_faulty_plugins_as_rows_and_exits_1(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["info"]) == 1
    captured = capsys.readouterr()
    rows = table_rows(captured.out, 0)
    assert rows["faulty-availability broken"][3] == "availability check raised RuntimeError: driver probe crashed"
    assert rows["reference-nvfp4 yes"][-1] == "PyTorch, NVFP4 W4A4 (FP4 activations), float32 math"
    assert "half-made" not in captured.out
    assert "entry point 'half' (moe_core.backends) failed to load: ImportError: missing its kernel library" in captured.out
    assert "entry point 'impostor' (moe_core.backends) failed to load: ValueError: name: a backend named 'reference-nvfp4' is already registered" in captured.out


@pytest.mark.usefixtures("plugins")
def test_check_reports_faulty_plugins_as_rows_and_exits_1(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check", *SMALL]) == 1
    rows = table_rows(capsys.readouterr().out)
    assert rows["nvfp4 reference-nvfp4"][-1] == "ok", "the oracle is ours, whatever a plugin registers"
    assert rows["nvfp4 faulty-availability"][-1] == "FAILED: availability check raised RuntimeError: driver probe crashed"
    assert rows["nvfp4 faulty-broadcast-shape"][-1] == "FAILED: output shape (1, 32), expected (6, 32)"
    assert rows["nvfp4 faulty-wrong-shape"][-1] == "FAILED: output shape (6, 33), expected (6, 32)"
    assert rows["- entry point half"][-1] == "FAILED: did not load: ImportError: missing its kernel library"
    assert rows["- entry point impostor"][-1].startswith("FAILED: did not load: ValueError")


def test_check_refuses_a_device_the_reference_cannot_use(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check", "--device", "meta"]) == 2
    assert "the reference backends cannot run on meta: meta tensors hold no values" in capsys.readouterr().err


def test_module_entry_point_runs() -> None:
    result = subprocess.run([sys.executable, "-m", "moe_core", "info"], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr
    assert "reference-nvfp4" in result.stdout


def test_format_table_aligns_columns() -> None:
    assert format_table(["a", "bb"], [["xyz", "1"]]).splitlines() == ["a    bb", "---  --", "xyz  1"]


def test_info_lists_schemes_and_the_backend_each_would_choose(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["info"]) == 0
    rows = table_rows(capsys.readouterr().out)
    choices = "flashinfer-trtllm-fp4, flashinfer-cutlass-nvfp4, reference-nvfp4"
    assert rows["compressed-tensors-w4a4-nvfp4 nvfp4"][2:] == ["reference-nvfp4", choices]
    assert rows["modelopt-nvfp4 nvfp4"][2] == "reference-nvfp4"
    assert rows["unquantized dense"][2] == "reference-dense"


@pytest.mark.parametrize(
    ("fixture", "layer", "scheme"),
    [
        ("qwen3_moe_nvfp4", "0", "compressed-tensors-w4a4-nvfp4"),
        ("mixtral_nvfp4_split", "1", "compressed-tensors-w4a4-nvfp4"),
        ("qwen3_moe_nvfp4_modelopt", "1", "modelopt-nvfp4"),
        ("qwen3_moe_bf16", "0", "unquantized"),
    ],
)
def test_check_runs_a_checkpoint_layer(
    capsys: pytest.CaptureFixture[str], fixture: str, layer: str, scheme: str
) -> None:
    directory = FIXTURES / fixture
    assert main(["check", "--checkpoint", str(directory), "--layer", layer, "--tokens", "8", "--iters", "1"]) == 0
    out = capsys.readouterr().out
    assert f"{directory}, layer {layer}" in out and f"{scheme}: backend reference-" in out
    rows = table_lines(out)
    assert rows[0][2] in ("float64 MoE", "float64 W4A4 MoE") and rows[0][-1] == "ok"
    if scheme != "unquantized":
        assert rows[1][2] == "float64 MoE, dequantized weights, no activation quantization" and rows[1][-1] == "info"
        assert 0.05 < float(rows[1][3]) < 0.3


def test_check_checkpoint_errors(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert main(["check", "--checkpoint", str(tmp_path)]) == 2
    assert "config.json: not found" in capsys.readouterr().err
    assert main(["check", "--checkpoint", str(FIXTURES / "qwen3_moe_bf16"), "--layer", "7"]) == 2
    assert "has MoE experts in layers [0, 1], not in layer 7" in capsys.readouterr().err
    for argv, message in (
        (["--checkpoint", "x", "--experts", "4"], "argument --experts: not allowed with --checkpoint"),
        (["--layer", "1"], "argument --layer: only with --checkpoint"),
        (["--checkpoint", "x", "--layer", "-1"], "argument --layer: expected an integer >= 0, got -1"),
    ):
        with pytest.raises(SystemExit):
            main(["check", *argv])
        assert message in capsys.readouterr().err


def test_check_skips_only_the_sizes_a_format_refuses() -> None:
    """A size the format refuses is one skipped row; any other failure to build the weights is raised, not skipped."""
    config = MoeRunnerConfig(num_experts=4, hidden_size=32, intermediate_size_per_partition=256, top_k=2)
    dense, dispatch = random_dense_layer(config, 3, torch.float32, torch.device("cpu"), 0)
    run = CheckRun(config, dense, dispatch, (), 0.05, 1, lambda line: None)
    (block,) = [check for check in FORMAT_CHECKS if check.format.name == "fp8-block"]
    (row,) = block.rows(run)
    assert row.verdict == f"skipped: {fp8_block_size_refusal(32, 256)}"
    assert fp8_block_size_refusal(128, 256) is None and "got 32 and 256" in row.verdict

    def broken(config: MoeRunnerConfig, dense: DenseMoeWeights, dispatch: StandardDispatchOutput) -> Fp8MoeWeights:
        raise ValueError("a bug in the build")

    check = FormatCheck(FP8, REFERENCE_FP8, broken, lambda config, dispatch, weights: dispatch.hidden_states, "none")
    with pytest.raises(ValueError, match="a bug in the build"):
        check.rows(run)
