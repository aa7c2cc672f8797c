"""The tuning script's launches run for every format it tunes, as the runner would launch them.

The script itself needs a CUDA GPU (``do_bench``); here its per-format
operands (``gemm_for``, ``gemm_case``) run under Triton's CPU interpreter at a
tiny shape, so a wrong dtype, scale or buffer fails before a GPU session is
spent on it. The bf16 case also checks the gated output against float32 math.
"""

from __future__ import annotations

import math

import pytest
import torch

from benchmarks.tune_triton_moe import candidates, gemm_case, gemm_for
from moe_core import MoeRunnerConfig
from moe_core.backends.triton.configs import KernelConfig
from moe_core.backends.triton.sorting import sort_tokens

CONFIG = MoeRunnerConfig(num_experts=4, hidden_size=128, intermediate_size_per_partition=128, top_k=2)


@pytest.mark.parametrize("fmt", ["bf16", "fp8", "fp8-block", "nvfp4", "mxfp4"])
def test_each_format_launches_both_gemms(gen: torch.Generator, fmt: str) -> None:
    hidden, inter = CONFIG.hidden_size, CONFIG.intermediate_size_per_partition
    w13 = (torch.randn(4, 2 * inter, hidden, generator=gen) / math.sqrt(hidden)).to(torch.bfloat16)
    w2 = (torch.randn(4, hidden, inter, generator=gen) / math.sqrt(inter)).to(torch.bfloat16)
    tokens = 3
    case = gemm_case(fmt, gemm_for(fmt, CONFIG, w13, w2), CONFIG, tokens, gen, "cpu")
    block_m, configs = next(iter(candidates(tokens * CONFIG.top_k / 4, hidden, fmt).items()))
    second = candidates(tokens * CONFIG.top_k / 4, inter, fmt)[block_m]
    assert configs and second, "at least one candidate fits K=128"
    sorted_tokens = sort_tokens(case.topk_ids, 4, 0, block_m)
    case.first(configs[0], sorted_tokens)
    case.second(second[0], sorted_tokens)
    assert bool(torch.isfinite(case.inter_out.float()).all()) and bool(torch.isfinite(case.down.float()).all())
    assert float(case.down.float().abs().max()) > 0
    if fmt == "bf16":
        pairs = torch.arange(tokens * CONFIG.top_k)
        gate_up = torch.einsum("ph,poh->po", case.x.float()[pairs // 2], w13.float()[case.topk_ids.reshape(-1).long()])
        expected = torch.nn.functional.silu(gate_up[:, :inter]) * gate_up[:, inter:]
        torch.testing.assert_close(case.inter_out.float(), expected, rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("fmt", ["bf16", "fp8", "fp8-block", "nvfp4"])
@pytest.mark.parametrize(
    ("rows_per_expert", "row_blocks"), [(0.25, {16}), (8.0, {16}), (16.0, {16, 32}), (64.0, {16, 64}), (1024.0, {64, 128})]
)
def test_candidates_follow_the_regime(fmt: str, rows_per_expert: float, row_blocks: set[int]) -> None:
    """Decode sizes get 16-row blocks, prefill sizes big ones, for every format; block-scaled K tiles stay in a block."""
    table = candidates(rows_per_expert, 4096, fmt)
    assert set(table) == row_blocks
    for block_m, configs in table.items():
        assert configs, f"no candidate for block_m={block_m}"
        assert all(c.block_m == block_m and 4096 % c.block_k == 0 for c in configs)
        if fmt == "fp8-block":
            assert all(c.block_k <= 128 for c in configs)


@pytest.mark.parametrize("fmt", ["bf16", "fp8", "fp8-block", "nvfp4"])
def test_32_row_blocks_grouped_match_16_row_blocks(gen: torch.Generator, fmt: str) -> None:
    """The decode tiles of 32 rows with GROUP_M=8 compute what 16-row ones do, where experts span several blocks."""
    hidden, inter = CONFIG.hidden_size, CONFIG.intermediate_size_per_partition
    w13 = (torch.randn(4, 2 * inter, hidden, generator=gen) / math.sqrt(hidden)).to(torch.bfloat16)
    w2 = (torch.randn(4, hidden, inter, generator=gen) / math.sqrt(inter)).to(torch.bfloat16)
    case = gemm_case(fmt, gemm_for(fmt, CONFIG, w13, w2), CONFIG, 40, gen, "cpu")
    assert int(torch.bincount(case.topk_ids.reshape(-1).long(), minlength=4).max()) > 16
    outputs = []
    for config in (KernelConfig(16, 64, 128, 1, 4, 1), KernelConfig(32, 64, 128, 8, 4, 1)):
        sorted_tokens = sort_tokens(case.topk_ids, 4, 0, config.block_m)
        case.first(config, sorted_tokens)
        case.second(config, sorted_tokens)
        outputs.append((case.inter_out.float().clone(), case.down.float().clone()))
    for first, second in zip(*outputs):
        torch.testing.assert_close(second, first, rtol=1e-5, atol=1e-5)
    assert float(outputs[1][1].abs().max()) > 0


@pytest.mark.parametrize("fmt", ["bf16", "fp8", "nvfp4"])
@pytest.mark.parametrize("rows_per_expert", [0.25, 16.0, 64.0, 1024.0])
def test_candidates_exist_for_k_off_the_power_of_two_grid(fmt: str, rows_per_expert: float) -> None:
    """gpt-oss's K = 2880 (64 x 45) divides no 128 or 256 tile: every regime still gets tiles that divide it."""
    table = candidates(rows_per_expert, 2880, fmt)
    assert all(configs for configs in table.values())
    assert all(2880 % c.block_k == 0 and c.block_k >= 32 for configs in table.values() for c in configs)


def test_candidates_keep_the_widest_tiles_where_k_allows() -> None:
    """K = 4096 keeps bf16's 256-wide decode tiles (the tuned H200 table holds several)."""
    assert {c.block_k for c in candidates(0.25, 4096, "bf16")[16]} == {128, 256}
