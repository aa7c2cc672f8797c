"""A plugin that registers a backend and then fails while still importing."""

from moe_core import register_backend
from moe_core.backends.reference import ReferenceNvfp4Runner, reference_availability

register_backend(
    "half-made",
    description="registered, then its module raised",
    factory=ReferenceNvfp4Runner,
    availability=reference_availability,
)
raise ImportError("missing its kernel library")
