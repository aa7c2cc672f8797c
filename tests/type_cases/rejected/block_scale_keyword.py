"""NVFP4 E4M3 block scales built from a raw tensor by the field's name: the field is not an ``__init__`` argument."""

import torch

from moe_core import LinearBlockScales, SwizzledBlockScales


def build(t: torch.Tensor) -> None:
    LinearBlockScales(data=t)  # expect: [call-arg] Unexpected keyword argument "data" for "LinearBlockScales"
    SwizzledBlockScales(tiles=t)  # expect: [call-arg] Unexpected keyword argument "tiles" for "SwizzledBlockScales"
