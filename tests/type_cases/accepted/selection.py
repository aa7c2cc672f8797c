"""Selection by capability keeps the format's type: the chosen route binds only that format's weights."""

import torch
from typing_extensions import assert_type

from moe_core import NVFP4, DeviceSpec, FormatRoute, LayerSpec, MoeForward, MoeRunnerConfig, Nvfp4MoeWeights, candidates, choose


def choose_on_hopper(config: MoeRunnerConfig, weights: Nvfp4MoeWeights) -> MoeForward:
    routes = candidates(NVFP4)
    assert_type(routes, list[FormatRoute[Nvfp4MoeWeights]])
    selection = choose(NVFP4, DeviceSpec.parse("sm90"), LayerSpec(config, NVFP4, torch.bfloat16), strict=False)
    return selection.chosen.bind(config, weights)
