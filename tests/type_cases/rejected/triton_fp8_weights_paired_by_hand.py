"""A static FP8 checkpoint run with per-token activation scales (0.055 off its oracle): the activations' scheme
follows from the canonical format (``from_fp8`` static, ``from_fp8_channel`` dynamic), never paired by hand."""

import attrs

from moe_core import Fp8MoeWeights
from moe_core.backends.triton.quant_info import DynamicFp8Activations, TritonFp8Weights


def dynamic(weights: Fp8MoeWeights) -> TritonFp8Weights:
    return attrs.evolve(TritonFp8Weights.from_fp8(weights), activations=DynamicFp8Activations())  # expect: [call-arg] Unexpected keyword argument "activations" for "evolve" of "TritonFp8Weights"


def by_hand() -> TritonFp8Weights:
    return TritonFp8Weights(activations=DynamicFp8Activations())  # expect: [call-arg] Unexpected keyword argument "activations" for "TritonFp8Weights"
