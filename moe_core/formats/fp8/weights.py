"""The FP8 per-tensor W8A8 format's weights: E4M3 codes, per-expert scales, static input scales."""

from __future__ import annotations

from typing import final

import attrs
import torch

from moe_core._checks import require_same_device
from moe_core.formats._experts import ExpertSizes, check_expert_shapes
from moe_core.formats.dense.weights import DenseMoeWeights
from moe_core.config import MoeRunnerConfig
from moe_core.fp8 import Fp8ExpertWeights, Fp8GateUpWeights, Fp8TensorScale
from moe_core.global_scales import require_layer_experts


@final
@attrs.frozen(eq=False, kw_only=True)
class Fp8MoeWeights(ExpertSizes):
    """FP8 E4M3 W8A8 expert weights: per-expert per-tensor weight scales and the static input scales of both GEMMs.

    ``w13`` keeps the gate and up halves' scales apart (checkpoints store one
    per matrix); ``w13_input_scale`` quantizes the hidden states,
    ``w2_input_scale`` the gated activation; each is one dequantize-side scalar.
    """

    w13: Fp8GateUpWeights
    w2: Fp8ExpertWeights
    w13_input_scale: Fp8TensorScale
    w2_input_scale: Fp8TensorScale

    def __attrs_post_init__(self) -> None:
        if not isinstance(self.w13, Fp8GateUpWeights):
            raise TypeError(f"Fp8MoeWeights.w13: expected Fp8GateUpWeights, got {type(self.w13).__name__}")
        if not isinstance(self.w2, Fp8ExpertWeights):
            raise TypeError(f"Fp8MoeWeights.w2: expected Fp8ExpertWeights, got {type(self.w2).__name__}")
        for name, scale in (("w13_input_scale", self.w13_input_scale), ("w2_input_scale", self.w2_input_scale)):
            if not isinstance(scale, Fp8TensorScale):
                raise TypeError(f"Fp8MoeWeights.{name}: expected Fp8TensorScale, got {type(scale).__name__}")
        check_expert_shapes("Fp8MoeWeights", self.w13.shape, self.w2.shape)
        require_same_device([
            ("w13.gate", self.w13.gate.codes), ("w13.up", self.w13.up.codes), ("w2", self.w2.codes),
            ("w13_input_scale", self.w13_input_scale.value), ("w2_input_scale", self.w2_input_scale.value),
        ])

    @property
    def device(self) -> torch.device:
        """Where the weights live."""
        return self.w2.codes.device

    def dequantize(self, dtype: torch.dtype = torch.float32) -> DenseMoeWeights:
        """The dense weights the codes stand for (each half with its own scales); the input scales are not used."""
        return DenseMoeWeights(w13=self.w13.dequantize(dtype), w2=self.w2.dequantize(dtype))

    def check_layer(self, config: MoeRunnerConfig) -> None:
        """Refuse input scales collapsed from another count of experts than the layer's."""
        require_layer_experts("Fp8MoeWeights.w13_input_scale", self.w13_input_scale, config.num_experts)
        require_layer_experts("Fp8MoeWeights.w2_input_scale", self.w2_input_scale, config.num_experts)
