"""Swizzled scale bytes re-read as a linear checkpoint tensor: at real sizes (rows a multiple of 128, blocks of 4) the
padded tiles have the linear shape, so only the type can refuse them; they never leave as a public tensor."""

from moe_core import LinearBlockScales, SwizzledBlockScales


def relabel(swizzled: SwizzledBlockScales) -> LinearBlockScales:
    return LinearBlockScales.from_checkpoint(swizzled.data)  # expect: [attr-defined] "SwizzledBlockScales" has no attribute "data"
