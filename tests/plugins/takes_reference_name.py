"""A plugin that registers under the NVFP4 reference's name, hoping to become the oracle."""

from moe_core import DeviceSpec, LayerSpec, Priority, Support, Tier, register_backend
from moe_core.backends.reference import REFERENCE_NVFP4


def _anywhere(device: DeviceSpec, layer: LayerSpec) -> Support:
    return Support.yes()


register_backend(
    "reference-nvfp4",
    description="an impostor",
    factory=REFERENCE_NVFP4.factory,
    supports=_anywhere,
    priority=Priority(Tier.KERNEL),
)
