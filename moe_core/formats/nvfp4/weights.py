"""The NVFP4 W4A4 format's weights: NVFP4 codes and scales, and the static input scales of both GEMMs."""

from __future__ import annotations

from typing import final

import attrs
import torch

from moe_core._checks import require_same_device
from moe_core.formats._experts import ExpertSizes, check_expert_shapes
from moe_core.formats.dense.weights import DenseMoeWeights
from moe_core.formats.nvfp4_w4a16.weights import Nvfp4W4A16MoeWeights
from moe_core.config import MoeRunnerConfig
from moe_core.global_scales import QuantizeGlobalScale, require_layer_experts
from moe_core.nvfp4 import Nvfp4ExpertWeights, Nvfp4GateUpWeights


@final
@attrs.frozen(eq=False, kw_only=True)
class Nvfp4MoeWeights(ExpertSizes):
    """NVFP4 W4A4 expert weights with the static input scales of both GEMMs.

    ``w13`` keeps the gate and up halves' global scales apart;
    ``w13_input_scale`` quantizes the hidden states entering the first GEMM,
    ``w2_input_scale`` the gated activation entering the second; each is the
    one scalar the FP4 kernels take, not a per-expert tensor.
    """

    w13: Nvfp4GateUpWeights
    w2: Nvfp4ExpertWeights
    w13_input_scale: QuantizeGlobalScale
    w2_input_scale: QuantizeGlobalScale

    def __attrs_post_init__(self) -> None:
        if not isinstance(self.w13, Nvfp4GateUpWeights):
            raise TypeError(f"Nvfp4MoeWeights.w13: expected Nvfp4GateUpWeights, got {type(self.w13).__name__}")
        if not isinstance(self.w2, Nvfp4ExpertWeights):
            raise TypeError(f"Nvfp4MoeWeights.w2: expected Nvfp4ExpertWeights, got {type(self.w2).__name__}")
        for name, scale in (("w13_input_scale", self.w13_input_scale), ("w2_input_scale", self.w2_input_scale)):
            if not isinstance(scale, QuantizeGlobalScale):
                raise TypeError(f"Nvfp4MoeWeights.{name}: expected QuantizeGlobalScale, got {type(scale).__name__}")
        check_expert_shapes("Nvfp4MoeWeights", self.w13.shape, self.w2.shape)
        require_same_device(
            [
                ("w13", self.w13.gate.packed),
                ("w2", self.w2.packed),
                ("w13_input_scale", self.w13_input_scale.value),
                ("w2_input_scale", self.w2_input_scale.value),
            ]
        )

    @property
    def device(self) -> torch.device:
        """Where the weights live."""
        return self.w2.packed.device

    def check_layer(self, config: MoeRunnerConfig) -> None:
        """Refuse input scales collapsed from another count of experts than the layer's."""
        require_layer_experts("Nvfp4MoeWeights.w13_input_scale", self.w13_input_scale, config.num_experts)
        require_layer_experts("Nvfp4MoeWeights.w2_input_scale", self.w2_input_scale, config.num_experts)

    def to(self, device: torch.device | str) -> Nvfp4MoeWeights:
        """The same weights and scales on ``device``."""
        return Nvfp4MoeWeights(
            w13=self.w13.to(device),
            w2=self.w2.to(device),
            w13_input_scale=self.w13_input_scale.to(device),
            w2_input_scale=self.w2_input_scale.to(device),
        )

    def dequantize(self, dtype: torch.dtype = torch.float32) -> DenseMoeWeights:
        """The dense weights the codes stand for (the input scales are dropped)."""
        return DenseMoeWeights(w13=self.w13.dequantize(dtype), w2=self.w2.dequantize(dtype))

    def without_activation_quantization(self) -> Nvfp4W4A16MoeWeights:
        """The same weights (shared, not copied) for 16-bit activations: the W4A4 -> W4A16 degradation."""
        return Nvfp4W4A16MoeWeights(w13=self.w13, w2=self.w2)
