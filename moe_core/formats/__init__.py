"""moe-core's weight formats, one kit (folder) each: dense, NVFP4 W4A4 (one input scale per GEMM, or one per expert),
NVFP4 W4A16, FP8 per tensor, per channel and per 128x128 block, MXFP4.

A kit holds its weights type (``weights.py``), its reference recipe for the
one generic reference forward (``reference.py``, see
:mod:`moe_core.formats.reference`) and its :class:`~moe_core.conversion.WeightFormat`
constant (``__init__.py``) with any degradation it declares. Shared numerics
(NVFP4, FP8, scales) live in :mod:`moe_core.nvfp4`, :mod:`moe_core.fp8`,
:mod:`moe_core.global_scales` and :mod:`moe_core.block_scales`. ``docs/adding-a-format.md``
says how to add one.
"""

from moe_core.formats.dense import DENSE, DenseMoeWeights, DenseRecipe
from moe_core.formats.fp8 import FP8, Fp8MoeWeights, Fp8Recipe
from moe_core.formats.fp8_block import FP8_BLOCK_SCALED, Fp8BlockMoeWeights, Fp8BlockRecipe, fp8_block_size_refusal
from moe_core.formats.fp8_channel import FP8_CHANNEL, Fp8ChannelMoeWeights, Fp8ChannelRecipe
from moe_core.formats.mxfp4 import MXFP4, Mxfp4MoeWeights, Mxfp4Recipe
from moe_core.formats.nvfp4 import NVFP4, NVFP4_TO_W4A16, Nvfp4MoeWeights, Nvfp4Recipe
from moe_core.formats.nvfp4_per_expert import NVFP4_PER_EXPERT, Nvfp4PerExpertMoeWeights, Nvfp4PerExpertRecipe
from moe_core.formats.nvfp4_w4a16 import NVFP4_W4A16, Nvfp4W4A16MoeWeights, Nvfp4W4A16Recipe

__all__ = [
    "DENSE",
    "FP8",
    "FP8_BLOCK_SCALED",
    "FP8_CHANNEL",
    "MXFP4",
    "NVFP4",
    "NVFP4_PER_EXPERT",
    "NVFP4_TO_W4A16",
    "NVFP4_W4A16",
    "DenseMoeWeights",
    "DenseRecipe",
    "Fp8BlockMoeWeights",
    "Fp8BlockRecipe",
    "Fp8ChannelMoeWeights",
    "Fp8ChannelRecipe",
    "Fp8MoeWeights",
    "Fp8Recipe",
    "Mxfp4MoeWeights",
    "Mxfp4Recipe",
    "Nvfp4PerExpertMoeWeights",
    "Nvfp4PerExpertRecipe",
    "Nvfp4MoeWeights",
    "Nvfp4Recipe",
    "Nvfp4W4A16MoeWeights",
    "Nvfp4W4A16Recipe",
    "fp8_block_size_refusal",
]
