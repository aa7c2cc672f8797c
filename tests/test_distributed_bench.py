"""``benchmarks/ep_bench.py`` runs on whatever the tests run on (gloo on the CPU here) and prints its table."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.mypy_cases import ROOT


@pytest.mark.distributed
def test_ep_bench_prints_a_row_per_token_count_and_dispatcher_with_its_bytes() -> None:
    command = [sys.executable, "benchmarks/ep_bench.py", "--shapes", "mixtral", "--tokens", "1,3", "--iters", "1"]
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=120, check=False)
    assert result.returncode == 0, result.stderr
    cells = [line.strip("| ").split(" | ") for line in result.stdout.splitlines() if line.startswith("| mixtral |")]
    dispatchers = ("local", "all-to-all", "all-gather", "replicated", "fp8-all-to-all", "fp8-all-gather", "nvfp4-all-to-all")
    assert [(row[1], row[2]) for row in cells] == [(tokens, name) for tokens in ("1", "3") for name in dispatchers]
    assert all(float(row[3]) >= 0 and float(row[4]) >= 0 for row in cells)
    assert [row[5] for row in cells if row[2] == "local"] == ["2", "6"]  # top-2: a slot row per (token, slot)
    sent = {(row[1], row[2]): int(row[6]) for row in cells}
    # Mixtral, H = 4096, top-2: a slot row is the bf16 token (8192 B), its FP8 codes and scale (4100 B) or its NVFP4
    # codes and block scales (2048 + 256 B), then its expert id and weight (8 B)
    assert [sent["3", name] for name in ("all-to-all", "fp8-all-to-all", "nvfp4-all-to-all")] == [
        3 * 2 * 8200, 3 * 2 * 4108, 3 * 2 * 2312
    ]
    assert (sent["1", "all-gather"], sent["1", "fp8-all-gather"]) == (8192 + 16, 4100 + 16)
    assert sent["1", "local"] == sent["1", "replicated"] == 0
