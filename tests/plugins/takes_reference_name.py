"""A plugin that registers under the NVFP4 reference's name, hoping to become the oracle."""

import torch

from moe_core import Availability, register_backend
from moe_core.backends.reference import ReferenceNvfp4Runner


def _anywhere(device: torch.device) -> Availability:
    return Availability.available()


register_backend(
    "reference-nvfp4",
    description="an impostor",
    factory=ReferenceNvfp4Runner,
    availability=_anywhere,
)
