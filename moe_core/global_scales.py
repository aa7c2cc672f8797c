"""NVFP4 per-tensor global scales, one type per shape and per convention.

NVFP4 stores the same number two ways, and mixing them up silently scales a
layer's output by the square of the scale:

- quantize side, ``448 * 6 / amax``: what the quantizer multiplies by
  (compressed-tensors' ``weight_global_scale`` / ``input_global_scale``, and
  the scale FlashInfer's ``fp4_quantize`` takes);
- dequantize side, ``amax / (448 * 6)``: what dequantization multiplies by
  (ModelOpt's ``weight_scale_2`` and ``input_scale``).

A kernel input that takes one scalar (shape ``[1]``) is typed with a scalar
class; collapsing per-expert ``[E]`` values into it is a named step with a
named :class:`ExpertScalePolicy`, never an implicit slice.
"""

from __future__ import annotations

import enum

import attrs
import torch
from typing_extensions import Self

from moe_core._checks import require_dtype, require_ndim, require_positive, require_shape, require_tensor

E2M1_MAX = 6.0
"""Largest magnitude an FP4 E2M1 value holds."""
E4M3_MAX = 448.0
"""Largest magnitude an FP8 E4M3 (fn) value holds."""
NVFP4_RANGE = E4M3_MAX * E2M1_MAX
"""``448 * 6``: the amax a block scale of 448 and a code of 6 reach together."""


class ExpertScalePolicy(enum.Enum):
    """How per-expert global scales become the one scalar a kernel takes."""

    REQUIRE_EQUAL = "require_equal"
    """Every expert must hold the same value (bit for bit); otherwise raise."""
    CONSERVATIVE = "conservative"
    """Take the scale of the largest amax, so no expert's values clip
    (the smallest quantize-side or the largest dequantize-side value)."""


def _check_values(cls_name: str, value: torch.Tensor, *, scalar: bool) -> None:
    name = f"{cls_name}.value"
    require_tensor(name, value)
    require_dtype(name, value, (torch.float32,))
    if scalar:
        require_shape(name, value, (1,), "(one scalar for the whole tensor)")
    else:
        require_ndim(name, value, 1, "[num_experts]")
        if value.numel() == 0:
            raise ValueError(f"{name}: expected at least one expert, got shape (0,)")
    require_positive(name, value)


def _amax_tensor(name: str, amax: float | torch.Tensor) -> torch.Tensor:
    tensor = amax if isinstance(amax, torch.Tensor) else torch.tensor(amax)
    tensor = tensor.detach().to(torch.float32)
    require_positive(name, tensor)
    return tensor


@attrs.frozen
class _ScalarScale:
    value: torch.Tensor
    """float32 tensor of shape ``[1]``, finite and > 0."""

    def __attrs_post_init__(self) -> None:
        _check_values(type(self).__name__, self.value, scalar=True)

    def to(self, device: torch.device | str) -> Self:
        """The same scale with its tensor on ``device``."""
        return type(self)(self.value.to(device))

    def item(self) -> float:
        """The scale as a Python float (synchronizes with the device)."""
        return float(self.value.item())


@attrs.frozen
class _ExpertScales:
    value: torch.Tensor
    """float32 tensor of shape ``[num_experts]``, finite and > 0."""

    def __attrs_post_init__(self) -> None:
        _check_values(type(self).__name__, self.value, scalar=False)

    @property
    def num_experts(self) -> int:
        """E, the number of experts the scales cover."""
        return int(self.value.shape[0])

    def to(self, device: torch.device | str) -> Self:
        """The same scales with their tensor on ``device``."""
        return type(self)(self.value.to(device))


def _collapse(cls_name: str, value: torch.Tensor, policy: ExpertScalePolicy, conservative: torch.Tensor) -> torch.Tensor:
    if not isinstance(policy, ExpertScalePolicy):
        raise TypeError(f"policy: expected an ExpertScalePolicy, got {policy!r}")
    if policy is ExpertScalePolicy.CONSERVATIVE:
        return conservative.reshape(1).clone()
    if not torch.equal(value, value[:1].expand_as(value)):
        raise ValueError(
            f"{cls_name}: experts disagree (min {float(value.min())}, max {float(value.max())} "
            f"over {value.numel()} experts); a kernel with one global scale needs them equal, "
            "or pass policy=ExpertScalePolicy.CONSERVATIVE to take the largest amax"
        )
    return value[:1].clone()


@attrs.frozen
class QuantizeGlobalScale(_ScalarScale):
    """Quantize-side scalar global scale ``448 * 6 / amax`` (compressed-tensors)."""

    @classmethod
    def from_amax(cls, amax: float | torch.Tensor) -> QuantizeGlobalScale:
        """The scale that maps ``amax`` (> 0) onto the top of the NVFP4 range."""
        return cls((NVFP4_RANGE / _amax_tensor("amax", amax)).reshape(1))

    @classmethod
    def from_dequantize(cls, scale: DequantizeGlobalScale) -> QuantizeGlobalScale:
        """Convert a dequantize-side scale (its reciprocal)."""
        return cls(torch.reciprocal(scale.value))

    @classmethod
    def from_experts(cls, scales: ExpertQuantizeGlobalScales, *, policy: ExpertScalePolicy) -> QuantizeGlobalScale:
        """Collapse per-expert scales into one scalar under ``policy``."""
        return cls(_collapse("ExpertQuantizeGlobalScales", scales.value, policy, scales.value.min()))


@attrs.frozen
class DequantizeGlobalScale(_ScalarScale):
    """Dequantize-side scalar global scale ``amax / (448 * 6)`` (ModelOpt)."""

    @classmethod
    def from_amax(cls, amax: float | torch.Tensor) -> DequantizeGlobalScale:
        """The scale that maps the top of the NVFP4 range back to ``amax`` (> 0)."""
        return cls((_amax_tensor("amax", amax) / NVFP4_RANGE).reshape(1))

    @classmethod
    def from_quantize(cls, scale: QuantizeGlobalScale) -> DequantizeGlobalScale:
        """Convert a quantize-side scale (its reciprocal)."""
        return cls(torch.reciprocal(scale.value))

    @classmethod
    def from_experts(
        cls, scales: ExpertDequantizeGlobalScales, *, policy: ExpertScalePolicy
    ) -> DequantizeGlobalScale:
        """Collapse per-expert scales into one scalar under ``policy``."""
        return cls(_collapse("ExpertDequantizeGlobalScales", scales.value, policy, scales.value.max()))


@attrs.frozen
class ExpertQuantizeGlobalScales(_ExpertScales):
    """Quantize-side global scales, one per expert (``[E]`` float32)."""

    @classmethod
    def from_amax(cls, amax: torch.Tensor) -> ExpertQuantizeGlobalScales:
        """Per-expert scales from per-expert amax values (``[E]``, each > 0)."""
        return cls(NVFP4_RANGE / _amax_tensor("amax", amax))

    @classmethod
    def from_dequantize(cls, scales: ExpertDequantizeGlobalScales) -> ExpertQuantizeGlobalScales:
        """Convert dequantize-side per-expert scales (their reciprocals)."""
        return cls(torch.reciprocal(scales.value))


@attrs.frozen
class ExpertDequantizeGlobalScales(_ExpertScales):
    """Dequantize-side global scales, one per expert (``[E]`` float32)."""

    @classmethod
    def from_amax(cls, amax: torch.Tensor) -> ExpertDequantizeGlobalScales:
        """Per-expert scales from per-expert amax values (``[E]``, each > 0)."""
        return cls(_amax_tensor("amax", amax) / NVFP4_RANGE)

    @classmethod
    def from_quantize(cls, scales: ExpertQuantizeGlobalScales) -> ExpertDequantizeGlobalScales:
        """Convert quantize-side per-expert scales (their reciprocals)."""
        return cls(torch.reciprocal(scales.value))
