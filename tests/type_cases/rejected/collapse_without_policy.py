"""Collapsing per-expert scales without naming the policy."""

from moe_core import ExpertQuantizeGlobalScales, QuantizeGlobalScale


def collapse(scales: ExpertQuantizeGlobalScales) -> QuantizeGlobalScale:
    return QuantizeGlobalScale.from_experts(scales)  # expect: [call-arg] Missing named argument "policy" for "from_experts" of "QuantizeGlobalScale"
