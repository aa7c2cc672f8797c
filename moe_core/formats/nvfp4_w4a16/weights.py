"""The NVFP4 W4A16 format's weights: NVFP4 codes and scales, no activation quantization."""

from __future__ import annotations

from typing import final

import attrs
import torch

from moe_core._checks import require_same_device
from moe_core.formats._experts import ExpertSizes, check_expert_shapes
from moe_core.formats.dense.weights import DenseMoeWeights
from moe_core.nvfp4 import Nvfp4ExpertWeights, Nvfp4GateUpWeights


@final
@attrs.frozen(eq=False, kw_only=True)
class Nvfp4W4A16MoeWeights(ExpertSizes):
    """NVFP4 expert weights run with bf16/fp16 activations (W4A16): no input scales, nothing quantizes activations.

    A different computation from :class:`Nvfp4MoeWeights` (W4A4), so a
    different type: a W4A4 quant info cannot reach a W4A16 runner, nor the
    reverse, without the named step
    :meth:`Nvfp4MoeWeights.without_activation_quantization`.
    """

    w13: Nvfp4GateUpWeights
    w2: Nvfp4ExpertWeights

    def __attrs_post_init__(self) -> None:
        if not isinstance(self.w13, Nvfp4GateUpWeights):
            raise TypeError(f"Nvfp4W4A16MoeWeights.w13: expected Nvfp4GateUpWeights, got {type(self.w13).__name__}")
        if not isinstance(self.w2, Nvfp4ExpertWeights):
            raise TypeError(f"Nvfp4W4A16MoeWeights.w2: expected Nvfp4ExpertWeights, got {type(self.w2).__name__}")
        check_expert_shapes("Nvfp4W4A16MoeWeights", self.w13.shape, self.w2.shape)
        require_same_device([("w13", self.w13.gate.packed), ("w2", self.w2.packed)])

    @property
    def device(self) -> torch.device:
        """Where the weights live."""
        return self.w2.packed.device

    def dequantize(self, dtype: torch.dtype = torch.float32) -> DenseMoeWeights:
        """The dense weights the codes stand for."""
        return DenseMoeWeights(w13=self.w13.dequantize(dtype), w2=self.w2.dequantize(dtype))
