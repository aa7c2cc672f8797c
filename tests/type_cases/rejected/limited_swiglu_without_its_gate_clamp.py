"""SiLU with limits names where its gate is clamped: DeepSeek-V4 / GLM-5-Next clamp before the SiLU, Step 3.7
after, and the two differ wherever the gate passes the limit, so there is no default to forget; and its parameters
are keyword-only."""

from moe_core import GateClamp, LimitedSwiglu

FORGOTTEN = LimitedSwiglu(limit=10.0)  # expect: [call-arg] Missing named argument "gate_clamp" for "LimitedSwiglu"
AS_TEXT = LimitedSwiglu(limit=10.0, gate_clamp="before_silu")  # expect: [arg-type] Argument "gate_clamp" to "LimitedSwiglu" has incompatible type "str"; expected "GateClamp"
BY_POSITION = LimitedSwiglu(10.0, GateClamp.AFTER_SILU)  # expect: [call-arg] Too many positional arguments for "LimitedSwiglu"
