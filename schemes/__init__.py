"""Quantization schemes, one module each: they load a layer's checkpoint tensors, build the
canonical weights and a backend's quant info once after loading, and delegate the forward
pass to its runner. ``SCHEMES`` is what the checkpoint loader matches a checkpoint against."""

from moe_core.scheme import SchemeSpec
from moe_core.schemes import (
    compressed_tensors_fp8,
    compressed_tensors_w4a4_nvfp4,
    deepseek_fp8,
    gpt_oss_mxfp4,
    modelopt_nvfp4,
    unquantized,
)

SCHEMES: tuple[SchemeSpec, ...] = (
    compressed_tensors_w4a4_nvfp4.SCHEME,
    compressed_tensors_fp8.STATIC_SCHEME,
    compressed_tensors_fp8.DYNAMIC_SCHEME,
    modelopt_nvfp4.SCHEME,
    gpt_oss_mxfp4.SCHEME,
    deepseek_fp8.SCHEME,
    unquantized.SCHEME,
)
"""Every scheme moe-core ships, in the order a checkpoint is matched against them."""

OPT_IN_SCHEMES: tuple[SchemeSpec, ...] = (
    compressed_tensors_w4a4_nvfp4.PER_EXPERT_SCHEME,
    modelopt_nvfp4.PER_EXPERT_SCHEME,
)
"""Schemes a checkpoint is never matched to by itself, only when named (``load_layer(layer, scheme=...)``): NVFP4 with
each expert's own input scales, which only the reference computes (kernels run it through a named degradation)."""
