"""NVFP4 E4M3 block scales built through attrs' private alias (``_data=``), which once passed mypy and every run-time check."""

import torch

from moe_core import LinearBlockScales, SwizzledBlockScales


def build(t: torch.Tensor) -> None:
    LinearBlockScales(_data=t)  # expect: [call-arg] Unexpected keyword argument "_data" for "LinearBlockScales"
    SwizzledBlockScales(_tiles=t)  # expect: [call-arg] Unexpected keyword argument "_tiles" for "SwizzledBlockScales"
