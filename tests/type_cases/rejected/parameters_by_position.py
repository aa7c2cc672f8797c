"""Routing and activation parameters of the same type, given by position: which is which is the caller's guess
(``ClampedSwiglu(7.0, 1.702)`` swaps alpha and limit), so they are keyword-only."""

from moe_core import ClampedSwiglu, GroupedTopK

SWAPPED = ClampedSwiglu(7.0, 1.702)  # expect: [call-arg] Too many positional arguments for "ClampedSwiglu"
GROUPS = GroupedTopK(4, 8, True)  # expect: [call-arg] Too many positional arguments for "GroupedTopK"
