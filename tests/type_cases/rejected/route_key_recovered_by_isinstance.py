"""``isinstance`` on a chosen ``FormatRoute[W]`` gives ``Route[Any, Any]``: no key (nor conversion, nor quant info)
typed ``Any`` comes out of it, only ``bind``, which checks the weights at run time."""

import torch

from moe_core import NVFP4, LayerSpec, MoeRunnerConfig, Route, choose


def key_of(config: MoeRunnerConfig) -> None:
    chosen = choose(NVFP4, torch.device("cpu"), LayerSpec(config, NVFP4)).chosen
    if isinstance(chosen, Route):
        print(chosen.key)  # expect: [attr-defined] "Route[Any, Any]" has no attribute "key"
