"""The NVFP4 W4A4 format with per-expert input scales: each expert's GEMM inputs quantized with its own global scale."""

from __future__ import annotations

from typing import final

import attrs
import torch

from moe_core._checks import require_same_device, values_readable
from moe_core.formats._experts import ExpertSizes, check_expert_shapes
from moe_core.formats.dense.weights import DenseMoeWeights
from moe_core.formats.nvfp4.weights import Nvfp4MoeWeights
from moe_core.formats.nvfp4_w4a16.weights import Nvfp4W4A16MoeWeights
from moe_core.global_scales import ExpertQuantizeGlobalScales, QuantizeGlobalScale
from moe_core.nvfp4 import Nvfp4ExpertWeights, Nvfp4GateUpWeights


def _require_not_above(name: str, scalar: QuantizeGlobalScale, experts: ExpertQuantizeGlobalScales) -> None:
    """Refuse a layer-wide scalar above an expert's own quantize-side scale: the collapse is conservative (the
    smallest over the layer's experts), so a larger one was not made from these experts' values and would clip."""
    if not (values_readable(scalar.value) and values_readable(experts.value)):
        return
    above = torch.nonzero(experts.value.to(scalar.value.device) < scalar.value)
    if above.shape[0]:
        expert = int(above[0])
        raise ValueError(
            f"Nvfp4PerExpertMoeWeights.{name}: expected the layer's conservative scalar (at most every expert's own "
            f"quantize-side scale), got {scalar.item():.6g} above local expert {expert}'s {float(experts.value[expert]):.6g}"
        )


@final
@attrs.frozen(eq=False, kw_only=True)
class Nvfp4PerExpertMoeWeights(ExpertSizes):
    """NVFP4 W4A4 expert weights whose GEMM inputs are quantized per expert, each with its own static global scale.

    A layer-wide scalar leaves an expert calibrated on small inputs to the
    others' scale: its block scales coarsen, or round to zero and its inputs
    with them. Here each local expert keeps its own (``w13_input_scales``,
    ``w2_input_scales``, ``[local experts]``, quantize side). The layer-wide
    conservative scalars (over every expert of the layer, whatever a rank
    holds) ride along for kernels that take one: the format degrades to
    :class:`~moe_core.formats.nvfp4.Nvfp4MoeWeights` with them, by name.
    """

    w13: Nvfp4GateUpWeights
    w2: Nvfp4ExpertWeights
    w13_input_scales: ExpertQuantizeGlobalScales
    w2_input_scales: ExpertQuantizeGlobalScales
    w13_input_scale: QuantizeGlobalScale
    """The first GEMM's input scale collapsed over every expert of the layer (for one-scalar kernels)."""
    w2_input_scale: QuantizeGlobalScale
    """The second GEMM's, likewise."""

    def __attrs_post_init__(self) -> None:
        name = "Nvfp4PerExpertMoeWeights"
        if not isinstance(self.w13, Nvfp4GateUpWeights):
            raise TypeError(f"{name}.w13: expected Nvfp4GateUpWeights, got {type(self.w13).__name__}")
        if not isinstance(self.w2, Nvfp4ExpertWeights):
            raise TypeError(f"{name}.w2: expected Nvfp4ExpertWeights, got {type(self.w2).__name__}")
        check_expert_shapes(name, self.w13.shape, self.w2.shape)
        for field, experts, scalar in (
            ("w13_input_scales", self.w13_input_scales, self.w13_input_scale),
            ("w2_input_scales", self.w2_input_scales, self.w2_input_scale),
        ):
            if not isinstance(experts, ExpertQuantizeGlobalScales):
                raise TypeError(f"{name}.{field}: expected ExpertQuantizeGlobalScales, got {type(experts).__name__}")
            if not isinstance(scalar, QuantizeGlobalScale):
                raise TypeError(f"{name}.{field[:-1]}: expected QuantizeGlobalScale, got {type(scalar).__name__}")
            if experts.num_experts != self.num_experts:
                raise ValueError(
                    f"{name}.{field}: expected one scale per local expert ({self.num_experts}), got {experts.num_experts}"
                )
            _require_not_above(field[:-1], scalar, experts)
        require_same_device(
            [
                ("w13", self.w13.gate.packed),
                ("w2", self.w2.packed),
                ("w13_input_scales", self.w13_input_scales.value),
                ("w2_input_scales", self.w2_input_scales.value),
                ("w13_input_scale", self.w13_input_scale.value),
                ("w2_input_scale", self.w2_input_scale.value),
            ]
        )

    @property
    def device(self) -> torch.device:
        """Where the weights live."""
        return self.w2.packed.device

    def to(self, device: torch.device | str) -> Nvfp4PerExpertMoeWeights:
        """The same weights and scales on ``device``."""
        return Nvfp4PerExpertMoeWeights(
            w13=self.w13.to(device),
            w2=self.w2.to(device),
            w13_input_scales=self.w13_input_scales.to(device),
            w2_input_scales=self.w2_input_scales.to(device),
            w13_input_scale=self.w13_input_scale.to(device),
            w2_input_scale=self.w2_input_scale.to(device),
        )

    def dequantize(self, dtype: torch.dtype = torch.float32) -> DenseMoeWeights:
        """The dense weights the codes stand for (the input scales are dropped)."""
        return DenseMoeWeights(w13=self.w13.dequantize(dtype), w2=self.w2.dequantize(dtype))

    def with_layer_input_scales(self) -> Nvfp4MoeWeights:
        """The same weights (shared, not copied) with the layer-wide scalars: the degradation to one-scalar kernels."""
        return Nvfp4MoeWeights(
            w13=self.w13, w2=self.w2, w13_input_scale=self.w13_input_scale, w2_input_scale=self.w2_input_scale
        )

    def without_activation_quantization(self) -> Nvfp4W4A16MoeWeights:
        """The same weights (shared, not copied) for 16-bit activations: the W4A4 -> W4A16 degradation."""
        return Nvfp4W4A16MoeWeights(w13=self.w13, w2=self.w2)
