"""The per-channel FP8 format's weights (compressed-tensors ``FP8_DYNAMIC``)."""

from __future__ import annotations

from typing import final

import attrs
import torch

from moe_core._checks import require_same_device
from moe_core.formats._experts import ExpertSizes, check_expert_shapes
from moe_core.formats.dense.weights import DenseMoeWeights
from moe_core.fp8 import Fp8ChannelExpertWeights


@final
@attrs.frozen(eq=False, kw_only=True)
class Fp8ChannelMoeWeights(ExpertSizes):
    """FP8 E4M3 expert weights with per-channel scales, for activations quantized per token at run time.

    The compressed-tensors ``FP8_DYNAMIC`` scheme: ``w13 [E, 2I, H]`` (gate
    rows first) and ``w2 [E, H, I]``, each row with its own scale; there are
    no input scales, each GEMM input's rows are quantized with their own amax
    (:func:`~moe_core.fp8.dynamic_fp8_scales`).
    """

    w13: Fp8ChannelExpertWeights
    w2: Fp8ChannelExpertWeights

    def __attrs_post_init__(self) -> None:
        for name, weights in (("w13", self.w13), ("w2", self.w2)):
            if not isinstance(weights, Fp8ChannelExpertWeights):
                raise TypeError(f"Fp8ChannelMoeWeights.{name}: expected Fp8ChannelExpertWeights, got {type(weights).__name__}")
        check_expert_shapes("Fp8ChannelMoeWeights", self.w13.shape, self.w2.shape)
        require_same_device([("w13", self.w13.codes), ("w2", self.w2.codes)])

    @property
    def device(self) -> torch.device:
        """Where the weights live."""
        return self.w2.codes.device

    def dequantize(self, dtype: torch.dtype = torch.float32) -> DenseMoeWeights:
        """The dense weights the codes stand for."""
        return DenseMoeWeights(w13=self.w13.dequantize(dtype), w2=self.w2.dequantize(dtype))
