"""A DeepSeek-style FP8 layer built with per-tensor (per-expert) scales where its 128x128 block scales belong.

Both are float32 tensors of dequantize-side scales; only their types tell a
per-expert ``[E]`` vector from an ``[E, rows / 128, cols / 128]`` grid.
"""

import torch

from moe_core import ExpertFp8Scales, Fp8BlockScales
from moe_core.backends.triton.quant_info import TritonFp8BlockWeights


def build(w13: torch.Tensor, w13_scales: Fp8BlockScales, w2: torch.Tensor, per_tensor: ExpertFp8Scales) -> TritonFp8BlockWeights:
    return TritonFp8BlockWeights(w13=w13, w13_scales=w13_scales, w2=w2, w2_scales=per_tensor)  # expect: [arg-type] Argument "w2_scales" to "TritonFp8BlockWeights" has incompatible type "ExpertFp8Scales"; expected "Fp8BlockScales"
