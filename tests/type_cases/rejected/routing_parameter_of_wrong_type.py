"""Routing and activation values are typed with their parameters: a wrong parameter, or one kind where the other
belongs, is a type error."""

from moe_core.config import ClampedSwiglu, GroupedTopK, MoeRunnerConfig

DEEPSEEK = GroupedTopK(n_group="8", topk_group=4, renormalize=True)  # expect: [arg-type] Argument "n_group" to "GroupedTopK" has incompatible type "str"; expected "int"
GPT_OSS = MoeRunnerConfig(32, 64, 32, 4, routing_method=ClampedSwiglu())  # expect: [arg-type] Argument "routing_method" to "MoeRunnerConfig" has incompatible type "ClampedSwiglu"
