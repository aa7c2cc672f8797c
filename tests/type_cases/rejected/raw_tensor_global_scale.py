"""A raw tensor where the scalar global input scale belongs."""

import torch

from moe_core import Nvfp4ExpertWeights, Nvfp4GateUpWeights, Nvfp4MoeWeights, QuantizeGlobalScale


def build(w13: Nvfp4GateUpWeights, w2: Nvfp4ExpertWeights, a2: QuantizeGlobalScale) -> Nvfp4MoeWeights:
    return Nvfp4MoeWeights(w13=w13, w2=w2, w13_input_scale=torch.ones(1), w2_input_scale=a2)  # expect: [arg-type] Argument "w13_input_scale" to "Nvfp4MoeWeights" has incompatible type "Tensor"; expected "QuantizeGlobalScale"
