"""Tuned block-size tables: where they are read from, which entry serves a token count, when the heuristic does."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from moe_core.backends.triton.configs import (
    CONFIG_DIR,
    CONFIG_DIR_VARIABLE,
    NVFP4_DEQUANTIZE_ROWS,
    KernelConfig,
    checked_entry,
    choose,
    crossover_file,
    device_file,
    heuristic,
    layer_key,
    nvfp4_dequantizes,
)

W13 = KernelConfig(32, 128, 64, 8, 8, 5)
W2 = KernelConfig(32, 64, 128, 4, 4, 2)


def _write_table(directory: Path, device: str) -> None:
    entry = {"w13": W13.as_dict(), "w2": W2.as_dict(), "ms": 0.1}
    table = {layer_key(8, 1024, 512, 2, "fp8"): {"64": entry}}
    (directory / (device.replace(" ", "_") + ".json")).write_text(json.dumps(table))


def test_the_variable_names_the_table_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert device_file("NVIDIA H200") == CONFIG_DIR / "NVIDIA_H200.json"
    monkeypatch.setenv(CONFIG_DIR_VARIABLE, str(tmp_path))
    device = "Test GPU tables"
    _write_table(tmp_path, device)
    assert device_file(device) == tmp_path / "Test_GPU_tables.json"
    for tokens in (32, 64, 128):  # within one doubling of the tuned 64
        assert choose(device, tokens, 2, 8, 1024, 512, "fp8", False) == (W13, W2)
    assert choose(device, 512, 2, 8, 1024, 512, "fp8", False) == heuristic(512, 2, 8, 1024, 512, "fp8", False)
    assert choose(device, 64, 2, 8, 1024, 512, "bf16", False) == heuristic(64, 2, 8, 1024, 512, "bf16", False)
    assert choose(device, 64, 2, 8, 1024, 512, "fp8", True) == heuristic(64, 2, 8, 1024, 512, "fp8", True)


def test_a_missing_directory_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(CONFIG_DIR_VARIABLE, str(tmp_path / "absent"))
    with pytest.raises(ValueError, match="is not a directory"):
        device_file("Test GPU missing")


@pytest.mark.parametrize(
    ("tokens", "block_m", "group_m"), [(1, 16, 1), (16, 16, 1), (32, 16, 1), (48, 32, 8), (64, 32, 8), (256, 64, 8)]
)
def test_heuristic_row_blocks_hold_an_experts_decode_rows(tokens: int, block_m: int, group_m: int) -> None:
    """Mixtral (8 experts, top-2): 16-row blocks up to 8 rows per expert, then 32 rows side by side, then 64."""
    for fmt in ("bf16", "fp8", "fp8-block", "nvfp4"):
        for config in heuristic(tokens, 2, 8, 4096, 14336, fmt, False):
            assert (config.block_m, config.group_m) == (block_m, group_m)


def test_nvfp4_crossover_is_read_per_layer_with_the_rows_heuristic_elsewhere(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A measured crossover (rows per expert) decides its layer's NVFP4 W4A16 path; other layers and the interpreter
    take :data:`NVFP4_DEQUANTIZE_ROWS`."""
    monkeypatch.setenv(CONFIG_DIR_VARIABLE, str(tmp_path))
    device = "Test GPU crossovers"
    assert crossover_file(device) == tmp_path / "Test_GPU_crossovers.nvfp4_dequantize.json"
    crossover_file(device).write_text(json.dumps({layer_key(128, 2048, 768, 8, "nvfp4"): {"rows_per_expert": 128}}))
    qwen3 = (8, 128, 2048, 768)
    assert not nvfp4_dequantizes(device, 1024, *qwen3, False)  # 64 rows per expert: under the measured 128
    assert nvfp4_dequantizes(device, 2048, *qwen3, False)
    assert nvfp4_dequantizes(device, 1024, *qwen3, True)  # the interpreter: the heuristic's 32
    mixtral = (2, 8, 4096, 14336)
    assert not nvfp4_dequantizes(device, 64, *mixtral, False) and nvfp4_dequantizes(device, 128, *mixtral, False)
    assert NVFP4_DEQUANTIZE_ROWS == 32


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("{", "not a table of crossovers"),
        ("[1]", "expected a JSON object of layer keys, got list"),
        ('{"k": {"rows": 4}}', r"k: expected \{\"rows_per_expert\": a positive int, ...\}, got \{'rows': 4\}"),
        ('{"k": {"rows_per_expert": "16"}}', "k: expected"),
        ('{"k": 16}', "k: expected"),
    ],
)
def test_a_malformed_crossover_table_is_refused_naming_the_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, text: str, match: str
) -> None:
    """Raw error (adversarial pass 19, t02): ``KeyError: 'rows_per_expert'`` or a bare ``JSONDecodeError``, naming
    neither the file nor the variable that points at it."""
    monkeypatch.setenv(CONFIG_DIR_VARIABLE, str(tmp_path))
    device = f"Test GPU malformed {len(text)} {text.count('1')}"
    crossover_file(device).write_text(text)
    with pytest.raises(ValueError, match=re.escape(str(crossover_file(device))) + ": " + match):
        nvfp4_dequantizes(device, 64, 8, 128, 2048, 768, False)


def test_committed_crossovers_name_tuned_layers() -> None:
    data = json.loads((CONFIG_DIR / "NVIDIA_H200.nvfp4_dequantize.json").read_text())
    tuned = json.loads((CONFIG_DIR / "NVIDIA_H200.json").read_text())
    for key, entry in data.items():  # the workspace path runs the layer's tuned bf16 tiles
        layer, _, fmt = key.rpartition(",")
        assert fmt in ("nvfp4", "mxfp4") and f"{layer},bf16" in tuned and int(entry["rows_per_expert"]) > 0


def test_every_committed_table_entry_is_one_the_kernels_compute_with() -> None:
    checked = 0
    for path in CONFIG_DIR.glob("*.json"):
        if path.name.endswith(".nvfp4_dequantize.json"):
            continue
        for key, entries in json.loads(path.read_text()).items():
            for count, entry in entries.items():
                checked_entry(entry, key.rsplit(",", 1)[1], f"{path.name}: {key}[{count}]")
                checked += 1
    assert checked > 0


BAD_ENTRIES: dict[str, tuple[str, object, str]] = {
    "block-m-differs": ("bf16", {"w13": W13.as_dict(), "w2": {**W2.as_dict(), "block_m": 64}}, "w13's block_m 32 and w2's 64 differ"),
    "fp8-block-k-256": ("fp8-block", {"w13": {**W13.as_dict(), "block_k": 256}, "w2": W2.as_dict()}, r"w13.block_k: fp8-block K tiles hold 32 to 128 elements, got 256"),
    "mxfp4-k-16": ("mxfp4", {"w13": W13.as_dict(), "w2": {**W2.as_dict(), "block_k": 16}}, r"w2.block_k: mxfp4 K tiles hold 32 to 256"),
    "vllm-keys": ("bf16", {"w13": {"BLOCK_SIZE_M": 32, "BLOCK_SIZE_N": 64, "BLOCK_SIZE_K": 64}, "w2": W2.as_dict()}, r"w13: expected the fields"),
    "no-w2": ("bf16", {"w13": W13.as_dict()}, r"expected a 'w2' config, got None"),
    "not-a-power": ("bf16", {"w13": {**W13.as_dict(), "block_n": 96}, "w2": W2.as_dict()}, r"w13.block_n: expected a positive int \(a power of 2\), got 96"),
    "three-warps": ("bf16", {"w13": W13.as_dict(), "w2": {**W2.as_dict(), "num_warps": 3}}, r"w2.num_warps: expected a positive int \(a power of 2\), got 3"),
    "eight-rows": ("bf16", {"w13": {**W13.as_dict(), "block_m": 8}, "w2": {**W2.as_dict(), "block_m": 8}}, r"w13: tiles of at least 16 rows and columns .*, got 8 x 128"),
}


@pytest.mark.parametrize("case", [*BAD_ENTRIES, "truncated-json"])
def test_a_malformed_tuned_table_is_refused_naming_the_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, case: str) -> None:
    """Adversarial pass 16, c13: entries whose GEMMs disagree on block_m ran 1.1-1.3 off (NaN at times), 256-deep
    block-FP8 K tiles 0.16-0.52 off; vLLM's keys, a missing w2, a 16-deep MXFP4 tile and truncated JSON were raw
    errors naming no table. Each is refused naming the table file, the layer and the token count."""
    monkeypatch.setenv(CONFIG_DIR_VARIABLE, str(tmp_path))
    device = f"Malformed {case}"
    path = device_file(device)
    if case == "truncated-json":
        path.write_text(json.dumps({layer_key(8, 1024, 512, 2, "bf16"): {"64": {"w13": W13.as_dict()}}})[:-7])
        fmt, match = "bf16", r"Malformed_truncated-json.json: not a tuned table"
    else:
        fmt, entry, match = BAD_ENTRIES[case]
        path.write_text(json.dumps({layer_key(8, 1024, 512, 2, fmt): {"64": entry}}))
        match = re.escape(f"{path}: '8,1024,512,2,{fmt}'['64']") + r".*" + match
    with pytest.raises(ValueError, match=match):
        choose(device, 64, 2, 8, 1024, 512, fmt, False)
