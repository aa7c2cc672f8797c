"""The CUTLASS fused-MoE kernel's quant infos, one per weight format.

FC1 rows are ``[up; gate]`` for this kernel (FlashInfer's
``tests/moe/test_trtllm_cutlass_fused_moe.py``, ``compute_with_experts``:
``w3_expert, w1_expert = torch.chunk(w31_weight, 2)``; measured on the H200,
``../shared/flashinfer-h200``: the other order gives a relative error of 0.77).

- :class:`CutlassBf16Weights`: bf16/fp16 experts (SM90 and later).
- :class:`CutlassFp8Weights`: FP8 per-tensor W8A8 (SM90 and later). One FC1
  scale per expert, so w1/w3 are fused onto the larger of their scales
  (:meth:`~moe_core.Fp8GateUpWeights.with_shared_scale`); the four
  ``quant_scales`` are the named :class:`CutlassFp8QuantScales`, laid out as
  the binding reads them (``getQuantParams``, FP8 branch: ``fc1_dequant [E]``,
  ``fc2_quant`` 0-d, ``fc2_dequant [E]``, ``fc1_input_dequant`` 0-d); the
  runner quantizes the hidden states with the static input scale.
- :class:`CutlassNvfp4Weights`: NVFP4 W4A4 (SM100/SM110/SM120). The weights go
  as the int64 views the API takes (16 codes each), the E4M3 block scales
  128x4-swizzled as int32 views, and the six ``quant_scales`` as the named,
  typed :class:`CutlassNvfp4QuantScales`. The kernel has one FC1 alpha per
  expert, so w1 and w3 whose global scales differ need reconciling. The
  registered conversion (:meth:`CutlassNvfp4Weights.from_nvfp4_folded`) keeps
  both halves' codes and block scales as they are, gives FC1 the gate's
  global scale, and moves the up half's ratio into FC2's per-expert input
  scale: exact, where rescaling the up half's E4M3 block scales
  (``GateUpScalePolicy.RESCALE_BLOCK_SCALES``, :meth:`~CutlassNvfp4Weights.from_nvfp4`)
  leaves errors of 8e-2 to 9e-2 on llmcompressor's split-scale checkpoint
  (``tests/test_gate_up_policies.py``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import final

import attrs
import torch

from moe_core import (
    DenseMoeWeights,
    ExpertFp8Scales,
    Fp8MoeWeights,
    Fp8TensorScale,
    ExpertQuantizeGlobalScales,
    GateUpScalePolicy,
    LinearBlockScales,
    Nvfp4ExpertWeights,
    Nvfp4MoeWeights,
    QuantizeGlobalScale,
    SwizzledBlockScales,
)
from moe_core._checks import reduce_rebuilt, require_dtype, require_ndim, require_same_device, require_tensor
from moe_core.backends._flashinfer import ExpertKernelScalars, require_row_alignment
from moe_core.fp8 import quantize_fp8

KERNEL_DTYPES = (torch.bfloat16, torch.float16)
"""Dense weight dtypes the kernel multiplies; float32 canonical weights are rounded to bf16."""

CODES_PER_INT64 = 16
"""E2M1 codes in one int64 of the weights' view."""


def _up_gate(w13: torch.Tensor) -> torch.Tensor:
    """Canonical ``[gate; up]`` rows (dim 1) as the kernel's ``[up; gate]``."""
    gate, up = w13.chunk(2, dim=1)
    return torch.cat((up, gate), dim=1).contiguous()


@attrs.frozen(eq=False, kw_only=True)
class _UnpackedExperts:
    """Experts one element per weight: ``fc1 [E, 2I, H]`` rows ``[up; gate]``, ``fc2 [E, H, I]`` (bf16/fp16 or FP8)."""

    fc1: torch.Tensor
    fc2: torch.Tensor

    def _check_experts(self, dtypes: tuple[torch.dtype, ...]) -> None:
        """Both tensors of ``dtypes``, 3-D, of matching shapes, on one device."""
        owner = type(self).__name__
        for name, tensor in (("fc1", self.fc1), ("fc2", self.fc2)):
            require_tensor(f"{owner}.{name}", tensor)
            require_dtype(f"{owner}.{name}", tensor, dtypes)
            require_ndim(f"{owner}.{name}", tensor, 3, "[num_experts, out_features, in_features]")
        experts, rows, hidden = (int(d) for d in self.fc1.shape)
        if rows % 2 or tuple(self.fc2.shape) != (experts, hidden, rows // 2):
            raise ValueError(
                f"{owner}.fc2: expected shape {(experts, hidden, rows // 2)} to match fc1 "
                f"{tuple(self.fc1.shape)}, got {tuple(self.fc2.shape)}"
            )

    def __reduce__(self) -> tuple[Callable[..., object], tuple[object, ...]]:
        """Copies and pickles are built again through the constructor, FP8 experts carried as bytes (plain pickle
        cannot load a float8 tensor)."""
        return reduce_rebuilt(self, type(self).__name__)

    @property
    def num_experts(self) -> int:
        """Experts held."""
        return int(self.fc1.shape[0])

    @property
    def hidden_size(self) -> int:
        """H."""
        return int(self.fc1.shape[2])

    @property
    def intermediate_size(self) -> int:
        """I."""
        return int(self.fc2.shape[2])

    @property
    def device(self) -> torch.device:
        """Where the weights live."""
        return self.fc1.device


@final
@attrs.frozen(eq=False, kw_only=True)
class CutlassBf16Weights(_UnpackedExperts):
    """bf16/fp16 experts: ``fc1 [E, 2I, H]`` rows ``[up; gate]``, ``fc2 [E, H, I]``, contiguous."""

    def __attrs_post_init__(self) -> None:
        self._check_experts(KERNEL_DTYPES)
        for name, tensor in (("fc1", self.fc1), ("fc2", self.fc2)):
            if not tensor.is_contiguous():
                raise ValueError(f"CutlassBf16Weights.{name}: expected a contiguous tensor")
        if self.fc1.dtype != self.fc2.dtype:
            raise TypeError(f"CutlassBf16Weights.fc2: expected dtype {self.fc1.dtype} like fc1, got {self.fc2.dtype}")
        require_same_device([("fc1", self.fc1), ("fc2", self.fc2)])

    @classmethod
    def from_dense(cls, weights: DenseMoeWeights) -> CutlassBf16Weights:
        """The canonical dense weights with FC1 as ``[up; gate]``; float32 weights are rounded to bf16."""
        dtype = weights.w13.dtype if weights.w13.dtype in KERNEL_DTYPES else torch.bfloat16
        return cls(fc1=_up_gate(weights.w13.to(dtype)), fc2=weights.w2.to(dtype).contiguous())

    def kernel_input(self, hidden_states: torch.Tensor) -> torch.Tensor:
        """The hidden states in the weights' dtype."""
        return hidden_states.to(self.fc1.dtype)

    def kernel_operands(self) -> tuple[torch.Tensor, torch.Tensor, list[torch.Tensor] | None]:
        """``fc1_expert_weights``, ``fc2_expert_weights`` and ``quant_scales`` (none for bf16)."""
        return self.fc1, self.fc2, None


@final
@attrs.frozen(eq=False)
class CutlassAlphas(ExpertKernelScalars):
    """One GEMM's per-expert dequantize factor ``1 / (input_global * weight_global)`` (quantize-side scales)."""

    @classmethod
    def from_global_scales(
        cls, *, weights: ExpertQuantizeGlobalScales, inputs: QuantizeGlobalScale
    ) -> CutlassAlphas:
        """From the weights' per-expert scales and the scalar that quantizes the GEMM's input."""
        return cls._of(1.0 / (weights.value.to(torch.float32) * inputs.value.to(torch.float32)))


@final
@attrs.frozen(eq=False)
class CutlassActivationScales(ExpertKernelScalars):
    """FC2's per-expert input scale (quantize side): the scalar that quantizes the gated activation, over each
    expert's factor by which FC1 scales its up half (the kernel takes a 0-d scalar or one per expert)."""

    @classmethod
    def uniform(cls, inputs: QuantizeGlobalScale, *, num_experts: int) -> CutlassActivationScales:
        """The layer's one scalar for every expert (FC1 computes both halves at their own scale)."""
        return cls._of(inputs.value.to(torch.float32).expand(num_experts).contiguous())

    @classmethod
    def folding_up_ratio(
        cls, inputs: QuantizeGlobalScale, *, gate: ExpertQuantizeGlobalScales, up: ExpertQuantizeGlobalScales
    ) -> CutlassActivationScales:
        """``inputs * gate / up``: FC1 ran the up half at the gate's global scale, so its output, and the gated
        activation linear in it, come out ``up / gate`` times too large; quantizing with this scale gives the codes
        and block scales of the true activation at ``inputs``."""
        ratio = gate.value.to(torch.float32) / up.value.to(torch.float32)
        return cls._of(inputs.value.to(torch.float32) * ratio)


@final
@attrs.frozen(eq=False, kw_only=True)
class CutlassNvfp4QuantScales:
    """The six ``quant_scales`` of NVFP4 W4A4, by name (FlashInfer's ``cutlass_fused_moe`` docstring order)."""

    fc1_input_scale: QuantizeGlobalScale
    """Quantizes the hidden states (the kernel takes a 0-d scalar or one per expert)."""
    fc1_weight_scales: SwizzledBlockScales
    """FC1 E4M3 block scales ``[E, 2I, H / 16]``, rows ``[up; gate]``, 128x4-swizzled."""
    fc1_alphas: CutlassAlphas
    fc2_input_scales: CutlassActivationScales
    """Quantize the gated activation, one per expert."""
    fc2_weight_scales: SwizzledBlockScales
    """FC2 E4M3 block scales ``[E, H, I / 16]``, 128x4-swizzled."""
    fc2_alphas: CutlassAlphas
    in_kernel_order: tuple[torch.Tensor, ...] = attrs.field(init=False, repr=False)
    """The six in the kernel's order, the input scales as 0-d scalars and the block scales as int32 views (built once)."""

    def __attrs_post_init__(self) -> None:
        order = (
            self.fc1_input_scale.value.reshape(()),
            self.fc1_weight_scales._tiles.view(torch.int32),
            self.fc1_alphas.value,
            self.fc2_input_scales.value,
            self.fc2_weight_scales._tiles.view(torch.int32),
            self.fc2_alphas.value,
        )
        object.__setattr__(self, "in_kernel_order", order)


@final
@attrs.frozen(eq=False, kw_only=True)
class CutlassNvfp4Weights:
    """NVFP4 W4A4 experts for the CUTLASS kernel, built once by :meth:`from_nvfp4`."""

    fc1: torch.Tensor
    """int64 view ``[E, 2I, H / 16]`` of the packed codes, rows ``[up; gate]``."""
    fc2: torch.Tensor
    """int64 view ``[E, H, I / 16]``."""
    scales: CutlassNvfp4QuantScales

    def __attrs_post_init__(self) -> None:
        for name, tensor in (("fc1", self.fc1), ("fc2", self.fc2)):
            require_tensor(f"CutlassNvfp4Weights.{name}", tensor)
            require_dtype(f"CutlassNvfp4Weights.{name}", tensor, (torch.int64,))
            require_ndim(f"CutlassNvfp4Weights.{name}", tensor, 3, "[num_experts, rows, cols / 16]")
        experts, rows, hidden = int(self.fc1.shape[0]), int(self.fc1.shape[1]), int(self.fc1.shape[2]) * CODES_PER_INT64
        inter = rows // 2
        if tuple(self.fc2.shape) != (experts, hidden, inter // CODES_PER_INT64):
            raise ValueError(
                f"CutlassNvfp4Weights.fc2: expected shape {(experts, hidden, inter // CODES_PER_INT64)}, "
                f"got {tuple(self.fc2.shape)}"
            )
        require_row_alignment("CutlassNvfp4Weights", intermediate_size=inter, hidden_size=hidden)
        scales = self.scales
        per_expert = (("fc1_alphas", scales.fc1_alphas), ("fc2_input_scales", scales.fc2_input_scales), ("fc2_alphas", scales.fc2_alphas))
        for name, alphas in per_expert:
            if alphas.num_experts != experts:
                raise ValueError(f"CutlassNvfp4Weights.scales.{name}: expected {experts} experts, got {alphas.num_experts}")
        for name, block, shape in (
            ("fc1_weight_scales", scales.fc1_weight_scales, (experts, rows, hidden // 16)),
            ("fc2_weight_scales", scales.fc2_weight_scales, (experts, hidden, inter // 16)),
        ):
            if block.shape != shape:
                raise ValueError(f"CutlassNvfp4Weights.scales.{name}: expected shape {shape}, got {block.shape}")
        require_same_device(
            [("fc1", self.fc1), ("fc2", self.fc2), ("fc1_alphas", scales.fc1_alphas.value)]
        )

    @classmethod
    def _build(cls, weights: Nvfp4MoeWeights, fc1: Nvfp4ExpertWeights, fc2_input_scales: CutlassActivationScales) -> CutlassNvfp4Weights:
        """The kernel's tensors from the fused FC1 ``[gate; up]`` and FC2's per-expert input scales."""
        fc1_scales = LinearBlockScales.from_checkpoint(_up_gate(fc1.block_scales.data))
        hidden_scale, activation_scale = weights.w13_input_scale, weights.w2_input_scale
        return cls(
            fc1=_up_gate(fc1.packed).view(torch.int64),
            fc2=weights.w2.packed.contiguous().view(torch.int64),
            scales=CutlassNvfp4QuantScales(
                fc1_input_scale=hidden_scale,
                fc1_weight_scales=fc1_scales.swizzle(),
                fc1_alphas=CutlassAlphas.from_global_scales(weights=fc1.global_scales, inputs=hidden_scale),
                fc2_input_scales=fc2_input_scales,
                fc2_weight_scales=weights.w2.block_scales.swizzle(),
                fc2_alphas=CutlassAlphas.from_global_scales(weights=weights.w2.global_scales, inputs=activation_scale),
            ),
        )

    @classmethod
    def from_nvfp4(cls, weights: Nvfp4MoeWeights, *, gate_up: GateUpScalePolicy) -> CutlassNvfp4Weights:
        """The conversion fusing w1/w3 onto one global scale per expert under ``gate_up`` (FC2 as it is)."""
        _, inter, hidden = weights.w13.gate.shape
        require_row_alignment("CUTLASS NVFP4 MoE", intermediate_size=inter, hidden_size=hidden)
        fused = weights.w13.with_shared_global_scales(gate_up)
        uniform = CutlassActivationScales.uniform(weights.w2_input_scale, num_experts=weights.num_experts)
        return cls._build(weights, fused, uniform)

    @classmethod
    def from_nvfp4_rescaled(cls, weights: Nvfp4MoeWeights) -> CutlassNvfp4Weights:
        """:meth:`from_nvfp4` under ``RESCALE_BLOCK_SCALES`` (exact where w1/w3 agree; see the module's docstring)."""
        return cls.from_nvfp4(weights, gate_up=GateUpScalePolicy.RESCALE_BLOCK_SCALES)

    @classmethod
    def from_nvfp4_folded(cls, weights: Nvfp4MoeWeights) -> CutlassNvfp4Weights:
        """The registered conversion: w1/w3 keep their codes and block scales, FC1 takes the gate's global scale,
        and each expert's ``up / gate`` ratio moves into FC2's input scale.

        Exact for a gated activation linear in its up half, ``act(gate) * up``
        (the runner passes SwiGLU only): the kernel's FC1 computes the gate
        exactly and the up half ``up / gate`` times too large, so the
        activation is too, and quantizing it with the layer's scale times
        ``gate / up`` (:meth:`CutlassActivationScales.folding_up_ratio`) gives
        the true activation's codes and block scales; FC2's alpha keeps the
        layer's scale. No E4M3 block scale is rounded again.
        """
        _, inter, hidden = weights.w13.gate.shape
        require_row_alignment("CUTLASS NVFP4 MoE", intermediate_size=inter, hidden_size=hidden)
        gate, up = weights.w13.gate, weights.w13.up
        fc1 = Nvfp4ExpertWeights(
            torch.cat((gate.packed, up.packed), dim=1),
            LinearBlockScales.from_checkpoint(torch.cat((gate.block_scales.data, up.block_scales.data), dim=1)),
            gate.global_scales,
        )
        folded = CutlassActivationScales.folding_up_ratio(weights.w2_input_scale, gate=gate.global_scales, up=up.global_scales)
        return cls._build(weights, fc1, folded)

    def kernel_input(self, hidden_states: torch.Tensor) -> torch.Tensor:
        """The hidden states in bf16; the kernel quantizes them with ``fc1_input_scale``."""
        return hidden_states.to(torch.bfloat16)

    def kernel_operands(self) -> tuple[torch.Tensor, torch.Tensor, list[torch.Tensor] | None]:
        """``fc1_expert_weights``, ``fc2_expert_weights`` and the six ``quant_scales``."""
        return self.fc1, self.fc2, list(self.scales.in_kernel_order)

    @property
    def num_experts(self) -> int:
        """Experts held."""
        return int(self.fc1.shape[0])

    @property
    def hidden_size(self) -> int:
        """H."""
        return int(self.fc1.shape[2]) * CODES_PER_INT64

    @property
    def intermediate_size(self) -> int:
        """I."""
        return int(self.fc1.shape[1]) // 2

    @property
    def device(self) -> torch.device:
        """Where the tensors live."""
        return self.fc1.device


@final
@attrs.frozen(eq=False)
class CutlassFp8Dequant(ExpertKernelScalars):
    """One GEMM's per-expert dequantize factor ``weight_scale * input_scale`` (dequantize-side FP8 scales)."""

    @classmethod
    def from_scales(cls, *, weights: ExpertFp8Scales, inputs: Fp8TensorScale) -> CutlassFp8Dequant:
        """From the weights' per-expert scales and the GEMM input's static scale."""
        return cls._of(weights.value.to(torch.float32) * inputs.value.to(torch.float32))


@final
@attrs.frozen(eq=False, kw_only=True)
class CutlassFp8QuantScales:
    """The four ``quant_scales`` of FP8 per-tensor W8A8, by name (the binding's order)."""

    fc1_dequant: CutlassFp8Dequant
    fc2_input_scale: Fp8TensorScale
    """Quantizes the gated activation (the kernel multiplies by its reciprocal)."""
    fc2_dequant: CutlassFp8Dequant
    fc1_input_scale: Fp8TensorScale
    """The hidden states' static scale (the runner quantizes with it)."""
    in_kernel_order: tuple[torch.Tensor, ...] = attrs.field(init=False, repr=False)
    """``(fc1_dequant [E], 1 / fc2_input 0-d, fc2_dequant [E], fc1_input 0-d)``, built once (no per-forward reciprocal)."""

    def __attrs_post_init__(self) -> None:
        order = (
            self.fc1_dequant.value,
            torch.reciprocal(self.fc2_input_scale.value).reshape(()),
            self.fc2_dequant.value,
            self.fc1_input_scale.value.reshape(()),
        )
        object.__setattr__(self, "in_kernel_order", order)


@final
@attrs.frozen(eq=False, kw_only=True)
class CutlassFp8Weights(_UnpackedExperts):
    """FP8 per-tensor W8A8 experts for the CUTLASS kernel: ``fc1 [E, 2I, H]`` rows ``[up; gate]``, ``fc2 [E, H, I]``."""

    scales: CutlassFp8QuantScales

    def __attrs_post_init__(self) -> None:
        self._check_experts((torch.float8_e4m3fn,))
        experts = self.num_experts
        for name, dequant in (("fc1_dequant", self.scales.fc1_dequant), ("fc2_dequant", self.scales.fc2_dequant)):
            if dequant.num_experts != experts:
                raise ValueError(f"CutlassFp8Weights.scales.{name}: expected {experts} experts, got {dequant.num_experts}")
        require_same_device([("fc1", self.fc1), ("fc2", self.fc2), ("fc1_dequant", self.scales.fc1_dequant.value)])

    @classmethod
    def from_fp8(cls, weights: Fp8MoeWeights) -> CutlassFp8Weights:
        """The once-after-loading conversion: w1/w3 on one scale per expert, ``[up; gate]``, the four scales."""
        fused = weights.w13.with_shared_scale()
        hidden_scale, activation_scale = weights.w13_input_scale, weights.w2_input_scale
        return cls(
            fc1=_up_gate(fused.codes),
            fc2=weights.w2.codes.contiguous(),
            scales=CutlassFp8QuantScales(
                fc1_dequant=CutlassFp8Dequant.from_scales(weights=fused.scales, inputs=hidden_scale),
                fc2_input_scale=activation_scale,
                fc2_dequant=CutlassFp8Dequant.from_scales(weights=weights.w2.scales, inputs=activation_scale),
                fc1_input_scale=hidden_scale,
            ),
        )

    def kernel_input(self, hidden_states: torch.Tensor) -> torch.Tensor:
        """The hidden states quantized to FP8 with the static input scale (the kernel takes FP8 input)."""
        return quantize_fp8(hidden_states, self.scales.fc1_input_scale.value)

    def kernel_operands(self) -> tuple[torch.Tensor, torch.Tensor, list[torch.Tensor] | None]:
        """``fc1_expert_weights``, ``fc2_expert_weights`` and the four ``quant_scales``."""
        return self.fc1, self.fc2, list(self.scales.in_kernel_order)
