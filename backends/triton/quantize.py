"""FP8 quantization of a GEMM input's rows (or their 128-column groups), on the device, for the W8A8 runners."""

from __future__ import annotations

from typing import final

import attrs
import torch

from moe_core.backends.triton.kernels import INTERPRETED, quantize_groups_kernel, quantize_rows_kernel
from moe_core.backends.triton.launcher import THROUGH_TRITON, KernelLauncher
from moe_core.backends.triton.scratch import FRESH, Scratch
from moe_core.backends.triton.sorting import next_power_of_2
from moe_core.fp8 import FP8_BLOCK, MIN_DYNAMIC_SCALE


@final
@attrs.frozen(eq=False)
class LocalPairs:
    """The (token, slot) pairs' expert ids ``[T * K]`` and this rank's experts ``[offset, offset + num_local)``."""

    topk_ids: torch.Tensor
    offset: int
    num_local: int


MAX_BLOCK = 4096
"""Columns per step of the one program per row."""


def quantize_fp8_rows(
    x: torch.Tensor, static_scale: torch.Tensor | None, pairs: LocalPairs | None = None, scratch: Scratch = FRESH,
    name: str = "x", launcher: KernelLauncher = THROUGH_TRITON,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``x [M, K]`` as E4M3 codes and the scales that dequantize them.

    With ``static_scale`` (float32 ``[1]``) every row takes it and it is
    returned as the scales; otherwise each row gets its own
    ``max(amax / 448, MIN_DYNAMIC_SCALE)``, returned as ``[M]`` float32.
    With ``pairs`` the rows are (token, slot) pairs and only this rank's are
    quantized (the others' codes and scales are left unwritten). The codes
    and scales are ``scratch``'s buffers ``<name>_codes`` and ``<name>_scales``; ``launcher`` launches the kernel
    (a forward's, at its site ``quantize_<name>``).
    """
    rows, cols = x.shape
    codes = scratch(f"{name}_codes", (rows, cols), torch.float8_e4m3fn, x.device)
    scales = static_scale if static_scale is not None else scratch(f"{name}_scales", (rows,), torch.float32, x.device)
    ids = scales if pairs is None else pairs.topk_ids
    offset, num_local = (0, 0) if pairs is None else (pairs.offset, pairs.num_local)
    launcher(
        f"quantize_{name}", quantize_rows_kernel,
        (x, codes, scales, scales, ids, cols, x.stride(0), codes.stride(0), MIN_DYNAMIC_SCALE, offset, num_local),
        lambda: ((rows,), dict(
            DYNAMIC=static_scale is None, PAIRS=pairs is not None, ROUND_FIRST=INTERPRETED,
            BLOCK=min(MAX_BLOCK, next_power_of_2(cols)),
        )),
    )
    return codes, scales


def quantize_fp8_groups(
    x: torch.Tensor, pairs: LocalPairs | None = None, scratch: Scratch = FRESH, name: str = "x",
    launcher: KernelLauncher = THROUGH_TRITON,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``x [M, K]`` (K a multiple of 128) as E4M3 codes and one scale per row and 128-column group, ``[M, K / 128]``.

    ``pairs``, ``scratch``, ``name`` and ``launcher`` as in :func:`quantize_fp8_rows`.
    """
    rows, cols = x.shape
    if cols % FP8_BLOCK:
        raise ValueError(f"x: expected a multiple of {FP8_BLOCK} columns, got {cols}")
    codes = scratch(f"{name}_codes", (rows, cols), torch.float8_e4m3fn, x.device)
    scales = scratch(f"{name}_scales", (rows, cols // FP8_BLOCK), torch.float32, x.device)
    ids = scales if pairs is None else pairs.topk_ids
    offset, num_local = (0, 0) if pairs is None else (pairs.offset, pairs.num_local)
    launcher(
        f"quantize_{name}", quantize_groups_kernel,
        (x, codes, scales, ids, x.stride(0), codes.stride(0), scales.stride(0), MIN_DYNAMIC_SCALE, offset, num_local),
        lambda: ((rows, cols // FP8_BLOCK), dict(PAIRS=pairs is not None, ROUND_FIRST=INTERPRETED, GROUP=FP8_BLOCK)),
    )
    return codes, scales
