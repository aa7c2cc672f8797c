"""Token sorting by expert, padded to the GEMM's row block, in Triton.

The grouped GEMMs read one expert's rows per block of ``block_m`` rows, so the
``T * K`` (token, slot) pairs are grouped by local expert and each group is
padded to a multiple of ``block_m`` with a sentinel (``T * K``). Pairs routed
to another rank's experts are left out. Everything stays on the device and
every size is a static bound (``T * K + E_local * (block_m - 1)`` rows), so a
forward can be captured in a CUDA graph: no value is read back to the host.

Up to :data:`ONE_PROGRAM_PAIRS` pairs (decode) the sort is one launch of one
program. Beyond, three launches (the kernels are in :mod:`.kernels`): a
per-expert count (one histogram per program, added with atomics), a
one-program scan that pads the counts and writes each block's expert, and a
scatter that places every pair in its expert's range.
"""

from __future__ import annotations

import functools
from typing import final

import attrs
import torch

from moe_core.backends.triton.kernels import count_kernel, scan_kernel, scatter_kernel, sort_one_program_kernel
from moe_core.backends.triton.launcher import THROUGH_TRITON, KernelLauncher
from moe_core.backends.triton.scratch import FRESH, Scratch

CHUNK = 1024
"""(token, slot) pairs per program in the count and scatter kernels."""
ONE_PROGRAM_PAIRS = 4096
"""The most pairs sorted by one program in one launch (each launch costs ~15 us of host time on the H200 machine)."""
STEP_ELEMENTS = 8192
"""The most (block, expert) comparisons per step of the one program that finds each row block's expert: the
``[blocks, bins]`` tile stays in registers. Seen on the H200: 1024 blocks x 256 bins at once spilled, and the scan took
312 us of Qwen3's (128 experts) 1.3 ms bf16 forward at T=4096."""


def cdiv(a: int, b: int) -> int:
    """``ceil(a / b)`` for positive ints."""
    return -(-a // b)


def next_power_of_2(n: int) -> int:
    """The smallest power of two >= ``n`` (Triton's block shapes are powers of two)."""
    return 1 << max(n - 1, 0).bit_length()


@final
@attrs.frozen(eq=False)
class SortedTokens:
    """The (token, slot) pairs of one forward grouped by local expert, on the device.

    ``sorted_ids[r]`` is a flat pair index ``t * K + k`` or the sentinel
    ``T * K`` (padding); ``expert_ids[b]`` is the local expert of rows
    ``[b * block_m, (b + 1) * block_m)`` or -1 past ``num_rows``.
    """

    sorted_ids: torch.Tensor
    """int32 ``[max_rows]``."""
    expert_ids: torch.Tensor
    """int32 ``[max_rows / block_m]``."""
    num_rows: torch.Tensor
    """int32 ``[1]``: rows in use (padded), read only on the device."""
    block_m: int
    """Rows per block."""

    @property
    def max_blocks(self) -> int:
        """The static number of row blocks a GEMM launch covers."""
        return int(self.expert_ids.shape[0])


def max_rows(num_pairs: int, num_local_experts: int, block_m: int) -> int:
    """The static bound on padded rows: every pair, plus up to ``block_m - 1`` padding per expert."""
    return cdiv(num_pairs + num_local_experts * (block_m - 1), block_m) * block_m


@functools.lru_cache(maxsize=1024)
def _sizes(numel: int, num_local_experts: int, block_m: int) -> tuple[int, int, int, int]:
    """The padded rows, their blocks, the histogram's bins and the blocks the scan takes per step (every forward of a
    token count asks the same)."""
    rows = max_rows(numel, num_local_experts, block_m)
    blocks = rows // block_m
    bins = next_power_of_2(num_local_experts + 1)
    return rows, blocks, bins, max(1, min(1024, next_power_of_2(blocks), STEP_ELEMENTS // bins))


def sort_tokens(
    topk_ids: torch.Tensor, num_local_experts: int, local_expert_offset: int, block_m: int,
    launcher: KernelLauncher = THROUGH_TRITON, scratch: Scratch = FRESH,
) -> SortedTokens:
    """Group ``topk_ids [T, K]`` (global ids) by this rank's experts, each group padded to ``block_m`` rows; the one-launch
    sort's buffers from ``scratch`` (it writes every element it reads)."""
    ids = topk_ids.reshape(-1)
    numel = ids.numel()
    device = ids.device
    rows, blocks, bins, blocks_per_step = _sizes(numel, num_local_experts, block_m)
    if numel <= ONE_PROGRAM_PAIRS:
        int32 = torch.int32
        sorted_ids, expert_ids = scratch("sorted_ids", (rows,), int32, device), scratch("expert_ids", (blocks,), int32, device)
        total, cursors = scratch("num_rows", (1,), int32, device), scratch("cursors", (bins,), int32, device)
        launcher(
            "sort", sort_one_program_kernel,
            (ids, cursors, sorted_ids, expert_ids, total, numel, local_expert_offset, num_local_experts, rows, blocks),
            lambda: ((1,), dict(
                BLOCK_M=block_m, BINS=bins, PAIRS=next_power_of_2(numel), ROWS=min(4096, next_power_of_2(rows)),
                BLOCKS=blocks_per_step,
            )),
        )
        return SortedTokens(sorted_ids, expert_ids, total, block_m)
    sorted_ids = torch.empty(rows, dtype=torch.int32, device=device)
    expert_ids = torch.empty(blocks, dtype=torch.int32, device=device)
    total = torch.empty(1, dtype=torch.int32, device=device)
    counts = torch.zeros(bins, dtype=torch.int32, device=device)
    starts = torch.empty(bins, dtype=torch.int32, device=device)
    cursors = torch.zeros(bins, dtype=torch.int32, device=device)
    sorted_ids.fill_(numel)
    chunks = (cdiv(numel, CHUNK),)
    launcher(
        "count", count_kernel, (ids, counts, numel, local_expert_offset, num_local_experts),
        lambda: (chunks, dict(CHUNK=CHUNK, BINS=bins)),
    )
    launcher(
        "scan", scan_kernel, (counts, starts, expert_ids, total, num_local_experts, blocks),
        lambda: ((1,), dict(BLOCK_M=block_m, BINS=bins, BLOCKS=blocks_per_step)),
    )
    launcher(
        "scatter", scatter_kernel, (ids, starts, cursors, sorted_ids, numel, local_expert_offset, num_local_experts),
        lambda: (chunks, dict(CHUNK=CHUNK)),
    )
    return SortedTokens(sorted_ids, expert_ids, total, block_m)
