"""Choosing by name among keys of different quant info types: no one key type fits them (choose among routes)."""

import torch

from moe_core import NVFP4, LayerSpec, MoeRunnerConfig, select_backend
from moe_core.backends.reference import REFERENCE_DENSE, REFERENCE_NVFP4


def choose(name: str, config: MoeRunnerConfig) -> None:
    select_backend([REFERENCE_NVFP4, REFERENCE_DENSE], torch.device("cpu"), LayerSpec(config, NVFP4), name=name)  # expect: [arg-type] Argument 1 to "select_backend" has incompatible type "list[object]"
