"""A backend fed from dense weights listed among the routes that take NVFP4 weights."""

from moe_core import DENSE, FormatRoute, Nvfp4MoeWeights
from moe_core.backends.reference import REFERENCE_DENSE

ROUTES: list[FormatRoute[Nvfp4MoeWeights]] = [REFERENCE_DENSE.route(DENSE)]  # expect: [arg-type] Argument 1 to "route" of "BackendKey" has incompatible type "WeightFormat[DenseMoeWeights]"; expected "WeightFormat[Nvfp4MoeWeights]"
