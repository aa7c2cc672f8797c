"""NVFP4 E4M3 block scales given another raw tensor by ``attrs.evolve``, by the field's name or its private alias."""

import attrs
import torch

from moe_core import LinearBlockScales, SwizzledBlockScales


def rebuild(
    t: torch.Tensor,
    linear_block_scales: LinearBlockScales,
    swizzled_block_scales: SwizzledBlockScales,
) -> None:
    attrs.evolve(linear_block_scales, data=t)  # expect: [call-arg] Unexpected keyword argument "data" for "evolve" of "LinearBlockScales"
    attrs.evolve(linear_block_scales, _data=t)  # expect: [call-arg] Unexpected keyword argument "_data" for "evolve" of "LinearBlockScales"
    attrs.evolve(swizzled_block_scales, tiles=t)  # expect: [call-arg] Unexpected keyword argument "tiles" for "evolve" of "SwizzledBlockScales"
    attrs.evolve(swizzled_block_scales, _tiles=t)  # expect: [call-arg] Unexpected keyword argument "_tiles" for "evolve" of "SwizzledBlockScales"
    attrs.evolve(swizzled_block_scales, rows=3)  # expect: [call-arg] Unexpected keyword argument "rows" for "evolve" of "SwizzledBlockScales"
    attrs.evolve(swizzled_block_scales, _rows=3)  # expect: [call-arg] Unexpected keyword argument "_rows" for "evolve" of "SwizzledBlockScales"
