"""NVFP4 E4M3 block scales built positionally from a raw tensor: no positional spelling reaches a scale's tensor."""

import torch

from moe_core import LinearBlockScales, SwizzledBlockScales


def build(t: torch.Tensor) -> None:
    LinearBlockScales(t)  # expect: [call-arg] Too many arguments for "LinearBlockScales"
    SwizzledBlockScales(t)  # expect: [call-arg] Too many arguments for "SwizzledBlockScales"
