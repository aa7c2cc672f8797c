"""A W4A16 backend listed among the W4A4 choices without the degradation step: its route takes other weights."""

from moe_core import NVFP4, NVFP4_W4A16, FormatRoute, Nvfp4MoeWeights
from moe_core.backends.reference import REFERENCE_NVFP4
from moe_core.backends.triton import TRITON_NVFP4_W4A16

ROUTES: list[FormatRoute[Nvfp4MoeWeights]] = [REFERENCE_NVFP4.route(NVFP4), TRITON_NVFP4_W4A16.route(NVFP4_W4A16)]  # expect: [arg-type] Argument 1 to "route" of "BackendKey" has incompatible type "WeightFormat[Nvfp4W4A16MoeWeights]"; expected "WeightFormat[Nvfp4MoeWeights]"
