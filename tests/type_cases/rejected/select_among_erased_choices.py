"""Keys held as ``BackendChoice``: the selection's choice would be one, and ``isinstance(chosen, BackendKey)`` would
recover ``BackendKey[Any]``, whose ``bind`` takes any quant info. Choices are keys of one ``Q`` or routes of one ``W``."""

from collections.abc import Sequence

import torch

from moe_core import BackendChoice, LayerSpec, select_backend


def pick(choices: Sequence[BackendChoice], layer: LayerSpec) -> None:
    select_backend(choices, torch.device("cpu"), layer)  # expect: [arg-type] Argument 1 to "select_backend" has incompatible type "Sequence[BackendChoice]"
