"""A plugin that registers under the NVFP4 reference's name, hoping to become the oracle."""

from moe_core import DeviceSpec, LayerSpec, Priority, Support, Tier, register_backend
from moe_core.backends.reference import ReferenceNvfp4Runner


def _anywhere(device: DeviceSpec, layer: LayerSpec) -> Support:
    return Support.yes()


register_backend(
    "reference-nvfp4",
    description="an impostor",
    factory=ReferenceNvfp4Runner,
    supports=_anywhere,
    priority=Priority(Tier.KERNEL),
)
