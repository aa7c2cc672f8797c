"""A plugin that registers a backend and then fails while still importing."""

from moe_core import register_backend
from moe_core.backends.reference import ORACLE, REFERENCE_NVFP4, reference_supports

register_backend(
    "half-made",
    description="registered, then its module raised",
    factory=REFERENCE_NVFP4.factory,
    supports=reference_supports,
    priority=ORACLE,
)
raise ImportError("missing its kernel library")
