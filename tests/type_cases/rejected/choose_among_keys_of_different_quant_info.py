"""Choosing by name among keys of different quant info types: no one key type fits them (choose among routes)."""

import torch

from moe_core import select_backend
from moe_core.backends.reference import REFERENCE_DENSE, REFERENCE_NVFP4


def choose(name: str) -> None:
    select_backend([REFERENCE_NVFP4, REFERENCE_DENSE], torch.device("cpu"), name=name)  # expect: [type-var] Value of type variable "C" of "select_backend" cannot be "object"
