"""The ``moe-core`` command as a user runs it, faulty plugins included."""

from __future__ import annotations

import io
import json
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from importlib.metadata import EntryPoint, entry_points, version
from pathlib import Path

import pytest
import torch

from moe_core import DenseMoeWeights, Fp8MoeWeights, MoeRunnerConfig, StandardDispatchOutput, registry
from moe_core.backends.reference import REFERENCE_FP8
from moe_core.check import FORMAT_CHECKS, CheckRun, FormatCheck
from moe_core.config import example_routings
from moe_core import cli
from moe_core.cli import format_table, main, plain_text
from moe_core.formats import FP8
from moe_core.formats import fp8_block_size_refusal
from moe_core.registry import ENTRY_POINT_GROUP
from moe_core.synthetic import random_dense_layer

FIXTURES = Path(__file__).resolve().parent / "fixtures"
SMALL = ["--tokens", "6", "--experts", "4", "--hidden", "32", "--intermediate", "32", "--iters", "1"]
SEEDS = "an integer from -2**63 to 2**64 - 1 (torch.Generator.manual_seed's range)"


def table_lines(out: str, which: int = -1) -> list[list[str]]:
    """Rows of table ``which`` (default: the last) in ``out``, split into cells at the columns of its rule line.

    A line whose first cell is blank continues the row above: its cells are
    appended to that row's, one space apart (``format_table`` wraps at spaces).
    """
    lines = out.splitlines()
    rule = [index for index, line in enumerate(lines) if line.startswith("---")][which]
    starts = [match.start() for match in re.finditer(r"-+", lines[rule])]
    body: list[list[str]] = []
    for line in lines[rule + 1 :]:
        if not line.strip():
            break
        cells = [line[start:end].strip() for start, end in zip(starts, [*starts[1:], None])]
        if cells[0]:
            body.append(cells)
        else:
            body[-1] = [f"{cell} {more}" if more else cell for cell, more in zip(body[-1], cells)]
    return body


def table_text(out: str) -> list[str]:
    """The lines of every table in ``out``: from the header above each rule line to the next blank line."""
    lines = out.splitlines()
    found = []
    for rule in [index for index, line in enumerate(lines) if line.startswith("---")]:
        end = next((index for index in range(rule, len(lines)) if not lines[index].strip()), len(lines))
        found += lines[rule - 1 : end]
    return found


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
    monkeypatch.setattr(registry, "_DISCOVERY", registry._Discovered())
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


def test_info_lists_each_formats_candidates_and_the_one_chosen(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["info"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("moe-core on cpu")
    rows = table_rows(out, 0)
    assert rows["dense reference-dense"][2:5] == ["oracle", "yes", "ok"]
    assert rows["nvfp4 reference-nvfp4"][3] == "yes" and rows["nvfp4 triton-nvfp4-w4a16"][3] == "-"
    assert rows["nvfp4 triton-nvfp4-w4a16"][5].startswith("-> nvfp4-w4a16: activations stay 16-bit")
    assert all(len(line) <= 100 for line in out.splitlines()), max(out.splitlines(), key=len)


@pytest.mark.parametrize(
    ("device", "chosen"),
    [
        ("sm90", {"dense": "triton-dense", "fp8": "triton-fp8", "fp8-channel": "triton-fp8", "fp8-block": "triton-fp8-block",
                  "nvfp4": "triton-nvfp4-w4a16", "nvfp4-w4a16": "triton-nvfp4-w4a16"}),
        ("sm90-flashinfer", {"dense": "triton-dense", "fp8": "triton-fp8", "fp8-channel": "triton-fp8",
                             "fp8-block": "triton-fp8-block", "nvfp4": "triton-nvfp4-w4a16", "nvfp4-w4a16": "triton-nvfp4-w4a16"}),
        ("cpu", {"dense": "reference-dense", "fp8": "reference-fp8", "fp8-channel": "reference-fp8-channel",
                 "fp8-block": "reference-fp8-block", "nvfp4": "reference-nvfp4", "nvfp4-w4a16": "reference-nvfp4-w4a16"}),
    ],
)
def test_info_json_on_described_devices(device: str, chosen: dict[str, str], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["info", "--device", device, "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert all(set(row) >= {"format", "backend", "chosen", "supported", "reasons", "degradation"} for row in rows)
    picked = {row["format"]: row["backend"] for row in rows if row["chosen"]}
    assert {fmt: picked.get(fmt) for fmt in chosen} == chosen
    nvfp4 = next(row for row in rows if row["chosen"] and row["format"] == "nvfp4")
    assert (nvfp4["degradation"] is not None) == device.startswith("sm90")
    for row in rows:
        assert row["supported"] == (not row["reasons"]) and isinstance(row["reasons"], list)


def test_info_json_on_blackwell_with_flashinfer_picks_its_fp4_moe(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["info", "--device", "sm100+flashinfer", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    (nvfp4,) = [row for row in rows if row["chosen"] and row["format"] == "nvfp4"]
    assert nvfp4["backend"].startswith("flashinfer-") and nvfp4["degradation"] is None


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
        (["info", "--device", "tpu-ish"], "argument --device: device 'tpu-ish': expected a torch device"),
        (["check", "--seed", "99999999999999999999999"], f"argument --seed: expected {SEEDS}, got 99999999999999999999999"),
        (["check", "--seed", str(-(2**63) - 1)], f"argument --seed: expected {SEEDS}, got -9223372036854775809"),
        (["check", "--seed", "0x10"], f"argument --seed: expected {SEEDS}, got '0x10'"),
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
    assert rows["nvfp4 faulty-supports"][4] == "supports check raised RuntimeError: driver probe crashed"
    assert rows["nvfp4 reference-nvfp4"][3] == "yes", "the oracle is ours, whatever a plugin registers"
    assert "half-made" not in captured.out
    broken = {cells[0]: cells[1] for cells in table_lines(captured.out)}
    assert broken["faulty-supports"] == "supports check raised RuntimeError: driver probe crashed"
    assert broken["entry point half"] == "failed to load: ImportError: missing its kernel library"
    assert broken["entry point impostor"] == (
        "failed to load: ValueError: name: a backend named 'reference-nvfp4' is already registered"
    )


@pytest.mark.usefixtures("plugins")
def test_check_reports_faulty_plugins_as_rows_and_exits_1(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check", *SMALL]) == 1
    rows = table_rows(capsys.readouterr().out)
    assert rows["nvfp4 reference-nvfp4"][-1] == "ok", "the oracle is ours, whatever a plugin registers"
    assert rows["nvfp4 faulty-supports"][-1] == "FAILED: supports check raised RuntimeError: driver probe crashed"
    assert rows["nvfp4 faulty-broadcast-shape"][-1] == (
        "FAILED: RuntimeError: FirstRowRunner.run returned (1, 32) torch.bfloat16 on cpu, not the hidden states' (6, 32) "
        "torch.bfloat16 on cpu (the Runner contract)"
    )
    assert rows["nvfp4 faulty-wrong-shape"][-1] == (
        "FAILED: RuntimeError: ExtraColumnRunner.run returned (6, 33) torch.bfloat16 on cpu, not the hidden states' "
        "(6, 32) torch.bfloat16 on cpu (the Runner contract)"
    )
    assert rows["- entry point half"][-1] == "FAILED: did not load: ImportError: missing its kernel library"
    assert rows["- entry point impostor"][-1].startswith("FAILED: did not load: ValueError")


def test_check_refuses_a_device_the_reference_cannot_use(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check", "--device", "meta"]) == 2
    assert "the reference backends cannot run on meta: meta tensors hold no values" in capsys.readouterr().err


def test_check_refuses_a_random_layer_larger_than_the_devices_memory(capsys: pytest.CaptureFixture[str]) -> None:
    """Raw error (adversarial pass 18, c08): ``--hidden 100000000 --intermediate 100000000`` ended in torch's
    allocator traceback and exit 1 (a FAILED row's code). The layer's size is refused before anything is allocated."""
    with pytest.raises(SystemExit) as exit_info:
        main(["check", "--hidden", "100000000", "--intermediate", "100000000"])
    assert exit_info.value.code == 2
    assert "the random layer's float32 weights alone take 8.94e+08 GiB, more than the" in capsys.readouterr().err


def test_module_entry_point_runs() -> None:
    result = subprocess.run([sys.executable, "-m", "moe_core", "info"], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr
    assert "reference-nvfp4" in result.stdout


def test_seed_range_is_the_generators() -> None:
    """The extremes --seed takes are seeds torch takes, and one past either end is not."""
    low, high = cli.SEED_RANGE
    for seed in (low, high):
        torch.Generator().manual_seed(cli._seed(str(seed)))
    for seed in (low - 1, high + 1):
        with pytest.raises((RuntimeError, ValueError)):
            torch.Generator().manual_seed(seed)


def test_dtype_names_are_torch_dtypes() -> None:
    assert [cli._dtype(name) for name in cli.DTYPE_NAMES] == [torch.bfloat16, torch.float16, torch.float32]


def test_format_table_aligns_columns() -> None:
    assert format_table(["a", "bb"], [["xyz", "1"]]).splitlines() == ["a    bb", "---  --", "xyz  1"]


def test_format_table_wraps_the_widest_columns_to_the_width() -> None:
    reasons = "needs a CUDA GPU of SM100 or SM103, not cpu; no TRT-LLM-gen cubins: FLASHINFER_CUBIN_DIR is unset"
    description = "FlashInfer TRT-LLM-gen fused MoE, NVFP4 W4A4, separate gate/up scalars (SM100/SM103)"
    rows = [["flashinfer-trtllm-fp4", "no", reasons, description], ["reference-nvfp4", "yes", "-", "PyTorch"]]
    headers = ["backend", "available", "reasons", "description"]
    for width in (70, 80, 100):
        table = format_table(headers, rows, width=width)
        lines = table.splitlines()
        assert max(len(line) for line in lines) <= width and len(lines) > 4, table
        assert table_lines(table) == rows, "wrapped at spaces only, continuation lines start blank"
        assert lines[2].startswith("flashinfer-trtllm-fp4  no         "), "narrow columns keep their width"
    assert format_table(headers, rows, width=400) == format_table(headers, rows, width=10**6), "no wrap where it fits"
    assert len(format_table(headers, rows, width=400).splitlines()) == 4


def test_format_table_never_breaks_a_word_or_a_header() -> None:
    """Where even the longest words do not fit, the table is wider than asked rather than break them."""
    table = format_table(["name", "a long header"], [["flashinfer-cutlass-nvfp4", "x y"]], width=20)
    assert table.splitlines() == [
        "name                      a long header",
        "------------------------  -------------",
        "flashinfer-cutlass-nvfp4  x y",
    ]


def test_info_tables_fit_100_columns_where_stdout_is_no_terminal(capsys: pytest.CaptureFixture[str]) -> None:
    main(["info"])
    lines = table_text(capsys.readouterr().out)
    assert len(lines) > 10 and max(len(line) for line in lines) <= cli.TABLE_WIDTH == 100, "\n".join(lines)


def test_tables_fit_the_terminal_when_stdout_is_one(monkeypatch: pytest.MonkeyPatch) -> None:
    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    monkeypatch.setenv("COLUMNS", "60")  # shutil.get_terminal_size reads it first
    assert cli.output_width() == cli.TABLE_WIDTH, "a pipe or a file has no width"
    monkeypatch.setattr(sys, "stdout", Terminal())
    assert cli.output_width() == 60 == shutil.get_terminal_size().columns
    reasons = "needs a CUDA GPU of SM100 or SM103, not cpu; no TRT-LLM-gen cubins: FLASHINFER_CUBIN_DIR is unset"
    lines = format_table(["backend", "reasons"], [["flashinfer-trtllm-fp4", reasons]]).splitlines()
    assert 50 < max(len(line) for line in lines) <= 60 and len(lines) == 5, lines


def test_help_is_plain_text_and_lists_the_exit_codes(capsys: pytest.CaptureFixture[str]) -> None:
    helps = {}
    for command in ("", "check", "info"):
        with pytest.raises(SystemExit) as exit_info:
            main([command, "--help"] if command else ["--help"])
        assert exit_info.value.code == 0
        helps[command] = out = capsys.readouterr().out
        assert "``" not in out and not re.search(r":\w+:`", out), out
        assert "exit codes:\n  0  ok\n  1  check: a row FAILED; info: a plugin failed to load" in out
        assert "\n  3  check --checkpoint: a damaged checkpoint file" in out
    assert "The moe-core command: list backends" in helps[""]
    assert "independent float64 MoE written token by token (moe_core.float64_moe)" in helps["check"]
    assert "With --checkpoint DIR, the layer is one MoE layer" in helps["check"]


def test_plain_text_keeps_what_the_markup_says() -> None:
    marked = "``moe-core check``: :mod:`moe_core.float64_moe`, :class:`~moe_core.check.CheckRow`, :func:`the oracle <moe_core.x.f>`"
    assert plain_text(marked) == "moe-core check: moe_core.float64_moe, CheckRow, the oracle"


def test_version_is_the_installed_distributions(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["--version"])
    assert exit_info.value.code == 0
    assert capsys.readouterr().out == f"moe-core {version('moe-core')}\n"


def test_help_and_version_do_not_import_torch() -> None:
    """The entry point imports moe_core.cli, and so the package: neither may import torch before parsing."""
    program = (
        "import sys\n"
        "import moe_core.cli\n"
        "for argv in (['--help'], ['--version'], ['check', '--help'], ['info', '--help']):\n"
        "    try:\n"
        "        moe_core.cli.main(argv)\n"
        "    except SystemExit as exit:\n"
        "        assert exit.code == 0, (argv, exit.code)\n"
        "    print('torch imported' if 'torch' in sys.modules else 'no torch', argv, file=sys.stderr)\n"
    )
    result = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr
    assert result.stderr.splitlines() == [
        "no torch ['--help']",
        "no torch ['--version']",
        "no torch ['check', '--help']",
        "no torch ['info', '--help']",
    ]


def test_info_lists_schemes_and_the_backend_each_would_choose(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["info"]) == 0
    out = capsys.readouterr().out
    capabilities = {cells[0]: cells[1:] for cells in table_lines(out, 2)}
    assert capabilities["triton-dense"][0] == "silu, gelu, gelu_tanh, relu2, clamped_swiglu, swiglu_limit, swiglu_limit_after_silu", (
        "the activations Triton's fused epilogue computes"
    )
    assert "llama4_sigmoid" in capabilities["reference-dense"][1]
    rows = table_rows(out, 1)
    assert rows["compressed-tensors-w4a4-nvfp4 nvfp4"][2:] == ["reference-nvfp4"]
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


@pytest.mark.parametrize(
    ("fixture", "damaged", "damage"),
    [
        ("qwen3_moe_nvfp4", "model-00002-of-00003.safetensors", "truncated"),
        ("qwen3_moe_nvfp4_modelopt", "model.safetensors", "truncated"),
        ("qwen3_moe_nvfp4", "model-00002-of-00003.safetensors", "garbage"),
        ("qwen3_moe_nvfp4_modelopt", "model.safetensors", "garbage"),
    ],
)
def test_check_exits_3_naming_a_damaged_file(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, fixture: str, damaged: str, damage: str
) -> None:
    directory = tmp_path / fixture
    shutil.copytree(FIXTURES / fixture, directory)
    path = directory / damaged
    path.write_bytes(path.read_bytes()[:-4096] if damage == "truncated" else bytes(range(256)) * 16)
    assert main(["check", "--checkpoint", str(directory), "--tokens", "4", "--iters", "1"]) == cli.EXIT_CORRUPT_CHECKPOINT == 3
    err = capsys.readouterr().err
    expected = "truncated: " if damage == "truncated" else "not a safetensors file, or cut inside its header: 4096 bytes"
    assert f"moe-core check: CorruptCheckpoint: {path}: {expected}" in err, err


def test_check_checkpoint_errors(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert main(["check", "--checkpoint", str(tmp_path)]) == 2
    assert "config.json: not found" in capsys.readouterr().err
    assert main(["check", "--checkpoint", str(FIXTURES / "qwen3_moe_bf16" / "config.json")]) == 2
    assert "config.json: expected a checkpoint directory (holding config.json" in capsys.readouterr().err
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


@pytest.mark.parametrize("device", ["sm90", "sm90-triton", "cpu"])
def test_info_says_what_computes_each_routing_methods_top_k(device: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["info", "--device", device]) == 0
    out = capsys.readouterr().out
    assert "what computes each routing method's top-k (route, MoeLayer) on" in out
    rows = {cells[0]: cells[1] for cells in table_lines(out, 3)}
    methods = [method.value for method in example_routings(8, 2)]
    assert list(rows) == methods
    for method in methods:
        if device == "sm90" and method != "sparsemixer":
            assert rows[method] == "fused Triton kernel"
        elif device == "sm90" or device == "sm90-triton":
            assert rows[method].startswith("select_experts (sparsemixer routing is not fused" if device == "sm90" else
                                           "select_experts (no triton on the device)")
        else:
            assert rows[method] == "select_experts (the fused routing kernel runs on CUDA devices (logits on cpu))"
