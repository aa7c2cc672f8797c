"""A raw tensor where the scalar global input scale belongs."""

import torch

from moe_core import Nvfp4ExpertWeights, Nvfp4MoeWeights, QuantizeGlobalScale


def build(w13: Nvfp4ExpertWeights, w2: Nvfp4ExpertWeights, a2: QuantizeGlobalScale) -> Nvfp4MoeWeights:
    return Nvfp4MoeWeights(w13, w2, torch.ones(1), a2)  # expect: [arg-type] Argument 3 to "Nvfp4MoeWeights" has incompatible type "Tensor"; expected "QuantizeGlobalScale"
