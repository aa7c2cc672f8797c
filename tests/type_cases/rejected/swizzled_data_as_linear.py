"""Swizzled scale bytes re-wrapped as the row-major layout."""

from moe_core import LinearBlockScales, SwizzledBlockScales


def relabel(swizzled: SwizzledBlockScales) -> LinearBlockScales:
    return LinearBlockScales(swizzled.data)  # expect: [call-arg] Too many positional arguments for "LinearBlockScales"
