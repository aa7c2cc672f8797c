"""The NVFP4 W4A4 format with per-expert input scales: each expert's GEMM inputs quantized with its own global scale."""

from __future__ import annotations

from typing import final

import attrs
import torch

from moe_core._checks import require_int, require_same_device
from moe_core.config import MoeRunnerConfig
from moe_core.formats._experts import ExpertSizes, check_expert_shapes
from moe_core.formats.dense.weights import DenseMoeWeights
from moe_core.formats.nvfp4.weights import Nvfp4MoeWeights
from moe_core.formats.nvfp4_w4a16.weights import Nvfp4W4A16MoeWeights
from moe_core.global_scales import ExpertInputScales, ExpertScalePolicy, QuantizeGlobalScale
from moe_core.nvfp4 import Nvfp4ExpertWeights, Nvfp4GateUpWeights


@final
@attrs.frozen(eq=False, kw_only=True)
class Nvfp4PerExpertMoeWeights(ExpertSizes):
    """NVFP4 W4A4 expert weights whose GEMM inputs are quantized per expert, each with its own static global scale.

    A layer-wide scalar leaves an expert calibrated on small inputs to the
    others' scale: its block scales coarsen, or round to zero and its inputs
    with them. Here each expert keeps its own. The input scales cover every
    expert of the layer (``[num_experts]``, quantize side), the codes only this
    rank's (``local_expert_offset`` on): so the layer-wide scalars, for kernels
    that take one per GEMM input (the format's named degradation to
    :class:`~moe_core.formats.nvfp4.Nvfp4MoeWeights`), are derived here from
    every expert under ``policy``, and cannot come from some of them.
    """

    w13: Nvfp4GateUpWeights
    w2: Nvfp4ExpertWeights
    w13_input_scales: ExpertInputScales
    """The first GEMM's input scale of every expert of the layer."""
    w2_input_scales: ExpertInputScales
    """The second GEMM's, likewise."""
    local_expert_offset: int = 0
    """The layer's expert that is this rank's first (``w13``/``w2`` hold the experts from here on)."""
    policy: ExpertScalePolicy = ExpertScalePolicy.CONSERVATIVE
    """How every expert's input scale becomes the layer-wide scalar."""
    w13_input_scale: QuantizeGlobalScale = attrs.field(init=False)
    """The first GEMM's layer-wide scalar, derived from every expert under ``policy``."""
    w2_input_scale: QuantizeGlobalScale = attrs.field(init=False)
    """The second GEMM's, likewise."""

    def __attrs_post_init__(self) -> None:
        name = "Nvfp4PerExpertMoeWeights"
        if not isinstance(self.w13, Nvfp4GateUpWeights):
            raise TypeError(f"{name}.w13: expected Nvfp4GateUpWeights, got {type(self.w13).__name__}")
        if not isinstance(self.w2, Nvfp4ExpertWeights):
            raise TypeError(f"{name}.w2: expected Nvfp4ExpertWeights, got {type(self.w2).__name__}")
        check_expert_shapes(name, self.w13.shape, self.w2.shape)
        require_int(f"{name}.local_expert_offset", self.local_expert_offset, minimum=0)
        for field in ("w13_input_scales", "w2_input_scales"):
            scales = getattr(self, field)
            if not isinstance(scales, ExpertInputScales):
                raise TypeError(f"{name}.{field}: expected ExpertInputScales, got {type(scales).__name__}")
        layer = self.w13_input_scales.num_experts
        if self.w2_input_scales.num_experts != layer:
            raise ValueError(
                f"{name}.w2_input_scales: expected one scale per expert of the layer like w13_input_scales ({layer}), "
                f"got {self.w2_input_scales.num_experts}"
            )
        if self.local_expert_offset + self.num_experts > layer:
            raise ValueError(
                f"{name}: experts [{self.local_expert_offset}, {self.local_expert_offset + self.num_experts}) are "
                f"not all among the layer's {layer} that the input scales cover (they cover every expert of the layer)"
            )
        require_same_device(
            [
                ("w13", self.w13.gate.packed),
                ("w2", self.w2.packed),
                ("w13_input_scales", self.w13_input_scales.value),
                ("w2_input_scales", self.w2_input_scales.value),
            ]
        )
        for field, scales in (("w13_input_scale", self.w13_input_scales), ("w2_input_scale", self.w2_input_scales)):
            object.__setattr__(self, field, QuantizeGlobalScale.from_experts(scales, policy=self.policy))

    @property
    def device(self) -> torch.device:
        """Where the weights live."""
        return self.w2.packed.device

    def check_layer(self, config: MoeRunnerConfig) -> None:
        """Refuse a layer of another expert count than the input scales cover, or whose rank's first expert is not
        :attr:`local_expert_offset` (its experts would be quantized with other experts' scales)."""
        name = "Nvfp4PerExpertMoeWeights"
        if self.w13_input_scales.num_experts != config.num_experts:
            raise ValueError(
                f"{name}.w13_input_scales: one per expert of a layer of {self.w13_input_scales.num_experts}, but the "
                f"layer has {config.num_experts} experts"
            )
        if self.local_expert_offset != config.local_expert_offset:
            raise ValueError(
                f"{name}.local_expert_offset: {self.local_expert_offset}, but this rank's experts start at "
                f"{config.local_expert_offset}: its experts would be quantized with other experts' input scales"
            )

    def own_input_scales(self, expert: int) -> tuple[QuantizeGlobalScale, QuantizeGlobalScale]:
        """Local expert ``expert``'s own input scales of both GEMMs, as the scalars its rows are quantized with."""
        if isinstance(expert, bool) or not 0 <= expert < self.num_experts:
            raise ValueError(f"expert: expected a local expert 0 <= expert < {self.num_experts}, got {expert}")
        index = self.local_expert_offset + expert

        def own(scales: ExpertInputScales) -> QuantizeGlobalScale:
            return QuantizeGlobalScale.from_experts(scales.experts(index, index + 1), policy=ExpertScalePolicy.REQUIRE_EQUAL)

        return own(self.w13_input_scales), own(self.w2_input_scales)

    def to(self, device: torch.device | str) -> Nvfp4PerExpertMoeWeights:
        """The same weights and scales on ``device``."""
        return Nvfp4PerExpertMoeWeights(
            w13=self.w13.to(device),
            w2=self.w2.to(device),
            w13_input_scales=self.w13_input_scales.to(device),
            w2_input_scales=self.w2_input_scales.to(device),
            local_expert_offset=self.local_expert_offset,
            policy=self.policy,
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
