"""NVFP4 per-tensor global scales, one type per shape and per convention.

NVFP4 stores the same number two ways, and mixing them up silently scales a
layer's output by the square of the scale:

- quantize side, ``448 * 6 / amax``: what the quantizer multiplies by
  (compressed-tensors' ``weight_global_scale`` / ``input_global_scale``, and
  the scale FlashInfer's ``fp4_quantize`` takes);
- dequantize side, ``amax / (448 * 6)``: what dequantization multiplies by
  (ModelOpt's ``weight_scale_2`` and ``input_scale``).

The class names the convention, and there is no public constructor from a
raw tensor: checkpoint tensors enter through ``from_checkpoint`` of the class
whose convention they follow, and a scalar (shape ``[1]``, what a kernel
takes) is made from several values only under a named
:class:`ExpertScalePolicy`. Each scale owns a private copy of its small
tensor, so writing to the checkpoint tensor later cannot change it.
"""

from __future__ import annotations

import enum
from typing import final

import attrs
import torch
from typing_extensions import Self

from moe_core._checks import require_dtype, require_ndim, require_positive, require_shape, require_tensor, values_readable

E2M1_MAX = 6.0
"""Largest magnitude an FP4 E2M1 value holds."""
E4M3_MAX = 448.0
"""Largest magnitude an FP8 E4M3 (fn) value holds."""
NVFP4_RANGE = E4M3_MAX * E2M1_MAX
"""``448 * 6``: the amax a block scale of 448 and a code of 6 reach together."""


class ExpertScalePolicy(enum.Enum):
    """How several global scales (one per expert or shard) become the one scalar a kernel takes."""

    REQUIRE_EQUAL = "require_equal"
    """Every value must be the same (bit for bit); otherwise raise. Checked where values exist (not on meta)."""
    CONSERVATIVE = "conservative"
    """Take the scale of the largest amax, so no expert's values clip
    (the smallest quantize-side or the largest dequantize-side value)."""


def _owned_copy(value: torch.Tensor) -> torch.Tensor:
    """A detached private copy, so the caller's tensor can be written without changing the scale."""
    return value.detach().clone() if isinstance(value, torch.Tensor) else value


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


def _float_tensor(name: str, value: float | torch.Tensor) -> torch.Tensor:
    """``value`` as a detached float32 tensor; refuses bools, strings and integer or bool tensors."""
    if isinstance(value, bool) or not isinstance(value, (int, float, torch.Tensor)):
        raise TypeError(f"{name}: expected a float or a floating-point tensor, got {type(value).__name__}")
    if isinstance(value, torch.Tensor):
        if not value.is_floating_point():
            raise TypeError(f"{name}: expected a floating-point tensor, got dtype {value.dtype}")
        return value.detach().to(torch.float32)
    return torch.tensor(float(value), dtype=torch.float32)


def _scalar_amax(amax: float | torch.Tensor) -> torch.Tensor:
    tensor = _float_tensor("amax", amax)
    if tensor.dim() > 1 or tensor.numel() != 1:
        raise ValueError(
            f"amax: expected one value (a float, or a tensor of shape () or (1,)), got shape {tuple(tensor.shape)}; "
            "per-expert amax values go through the Expert*GlobalScales classes"
        )
    require_positive("amax", tensor)
    return tensor.reshape(1)


def _expert_amax(amax: torch.Tensor) -> torch.Tensor:
    tensor = _float_tensor("amax", amax)
    require_ndim("amax", tensor, 1, "[num_experts]")
    require_positive("amax", tensor)
    return tensor


def _checkpoint_values(cls_name: str, tensor: torch.Tensor) -> torch.Tensor:
    """A checkpoint's scale values, flattened; refuses a one-element view into a larger tensor."""
    name = f"{cls_name}.from_checkpoint"
    require_tensor(name, tensor)
    require_dtype(name, tensor, (torch.float32,))
    if tensor.numel() == 0:
        raise ValueError(f"{name}: expected at least one value, got shape {tuple(tensor.shape)}")
    if tensor.numel() == 1 and tensor.untyped_storage().nbytes() > tensor.element_size():
        raise ValueError(
            f"{name}: got a one-element view into a larger tensor (like per_expert[:1], which takes "
            "expert 0's scale for all); pass the whole tensor and name a policy"
        )
    return tensor.reshape(-1)


def _collapse(cls_name: str, value: torch.Tensor, policy: ExpertScalePolicy, conservative: torch.Tensor) -> torch.Tensor:
    if not isinstance(policy, ExpertScalePolicy):
        raise TypeError(f"policy: expected an ExpertScalePolicy, got {policy!r}")
    if policy is ExpertScalePolicy.CONSERVATIVE:
        return conservative.reshape(1)
    if values_readable(value) and not torch.equal(value, value[:1].expand_as(value)):
        raise ValueError(
            f"{cls_name}: experts disagree (min {float(value.min())}, max {float(value.max())} "
            f"over {value.numel()} values); a kernel with one global scale needs them equal, "
            "or pass policy=ExpertScalePolicy.CONSERVATIVE to take the largest amax"
        )
    return value[:1]


@attrs.frozen(eq=False)
class _ScalarScale:
    value: torch.Tensor = attrs.field(alias="_value", kw_only=True, converter=_owned_copy)
    """float32 tensor of shape ``[1]``, finite and > 0 (read it; never write to it)."""

    def __attrs_post_init__(self) -> None:
        _check_values(type(self).__name__, self.value, scalar=True)

    def to(self, device: torch.device | str) -> Self:
        """The same scale with its tensor on ``device``."""
        return type(self)(_value=self.value.to(device))

    def item(self) -> float:
        """The scale as a Python float (synchronizes with the device)."""
        return float(self.value.item())


@attrs.frozen(eq=False)
class _ExpertScales:
    value: torch.Tensor = attrs.field(alias="_value", kw_only=True, converter=_owned_copy)
    """float32 tensor of shape ``[num_experts]``, finite and > 0 (read it; never write to it)."""

    def __attrs_post_init__(self) -> None:
        _check_values(type(self).__name__, self.value, scalar=False)

    @property
    def num_experts(self) -> int:
        """E, the number of experts the scales cover."""
        return int(self.value.shape[0])

    def to(self, device: torch.device | str) -> Self:
        """The same scales with their tensor on ``device``."""
        return type(self)(_value=self.value.to(device))

    def experts(self, start: int, stop: int) -> Self:
        """The scales of experts ``[start, stop)`` (this rank's, under expert parallelism)."""
        if isinstance(start, bool) or isinstance(stop, bool) or not (0 <= start < stop <= self.num_experts):
            raise ValueError(f"experts: expected 0 <= start < stop <= {self.num_experts}, got [{start}, {stop})")
        return type(self)(_value=self.value[start:stop])

    @classmethod
    def from_checkpoint(cls, tensor: torch.Tensor) -> Self:
        """Per-expert scales as a checkpoint stores them in this class's convention, ``[E]`` float32."""
        require_tensor(f"{cls.__name__}.from_checkpoint", tensor)
        return cls(_value=tensor)


@final
@attrs.frozen(eq=False)
class QuantizeGlobalScale(_ScalarScale):
    """Quantize-side scalar global scale ``448 * 6 / amax`` (compressed-tensors), shape ``[1]``."""

    @classmethod
    def from_amax(cls, amax: float | torch.Tensor) -> QuantizeGlobalScale:
        """The scale that maps ``amax`` (one value > 0) onto the top of the NVFP4 range."""
        return cls(_value=NVFP4_RANGE / _scalar_amax(amax))

    @classmethod
    def from_checkpoint(cls, tensor: torch.Tensor, *, policy: ExpertScalePolicy) -> QuantizeGlobalScale:
        """The scalar from quantize-side checkpoint values of any shape (``[1]``, ``[E]``, ``[E, 2]``).

        Several values become one under ``policy``, named even where there is
        one value, so that every call site says what it does with many.
        """
        values = _checkpoint_values(cls.__name__, tensor)
        return cls(_value=_collapse(cls.__name__, values, policy, values.min()))

    @classmethod
    def from_dequantize(cls, scale: DequantizeGlobalScale) -> QuantizeGlobalScale:
        """Convert a dequantize-side scale (its reciprocal)."""
        if not isinstance(scale, DequantizeGlobalScale):
            raise TypeError(f"scale: expected a DequantizeGlobalScale, got {type(scale).__name__}")
        return cls(_value=torch.reciprocal(scale.value))

    @classmethod
    def from_experts(cls, scales: ExpertQuantizeGlobalScales, *, policy: ExpertScalePolicy) -> QuantizeGlobalScale:
        """Collapse per-expert scales into one scalar under ``policy``."""
        if not isinstance(scales, ExpertQuantizeGlobalScales):
            raise TypeError(f"scales: expected ExpertQuantizeGlobalScales, got {type(scales).__name__}")
        return cls(_value=_collapse("ExpertQuantizeGlobalScales", scales.value, policy, scales.value.min()))


@final
@attrs.frozen(eq=False)
class DequantizeGlobalScale(_ScalarScale):
    """Dequantize-side scalar global scale ``amax / (448 * 6)`` (ModelOpt), shape ``[1]``."""

    @classmethod
    def from_amax(cls, amax: float | torch.Tensor) -> DequantizeGlobalScale:
        """The scale that maps the top of the NVFP4 range back to ``amax`` (one value > 0)."""
        return cls(_value=_scalar_amax(amax) / NVFP4_RANGE)

    @classmethod
    def from_checkpoint(cls, tensor: torch.Tensor, *, policy: ExpertScalePolicy) -> DequantizeGlobalScale:
        """The scalar from dequantize-side checkpoint values of any shape, under ``policy``."""
        values = _checkpoint_values(cls.__name__, tensor)
        return cls(_value=_collapse(cls.__name__, values, policy, values.max()))

    @classmethod
    def from_quantize(cls, scale: QuantizeGlobalScale) -> DequantizeGlobalScale:
        """Convert a quantize-side scale (its reciprocal)."""
        if not isinstance(scale, QuantizeGlobalScale):
            raise TypeError(f"scale: expected a QuantizeGlobalScale, got {type(scale).__name__}")
        return cls(_value=torch.reciprocal(scale.value))

    @classmethod
    def from_experts(
        cls, scales: ExpertDequantizeGlobalScales, *, policy: ExpertScalePolicy
    ) -> DequantizeGlobalScale:
        """Collapse per-expert scales into one scalar under ``policy``."""
        if not isinstance(scales, ExpertDequantizeGlobalScales):
            raise TypeError(f"scales: expected ExpertDequantizeGlobalScales, got {type(scales).__name__}")
        return cls(_value=_collapse("ExpertDequantizeGlobalScales", scales.value, policy, scales.value.max()))


@final
@attrs.frozen(eq=False)
class ExpertQuantizeGlobalScales(_ExpertScales):
    """Quantize-side global scales, one per expert (``[E]`` float32)."""

    @classmethod
    def from_amax(cls, amax: torch.Tensor) -> ExpertQuantizeGlobalScales:
        """Per-expert scales from per-expert amax values (``[E]``, each > 0)."""
        return cls(_value=NVFP4_RANGE / _expert_amax(amax))

    @classmethod
    def from_dequantize(cls, scales: ExpertDequantizeGlobalScales) -> ExpertQuantizeGlobalScales:
        """Convert dequantize-side per-expert scales (their reciprocals)."""
        if not isinstance(scales, ExpertDequantizeGlobalScales):
            raise TypeError(f"scales: expected ExpertDequantizeGlobalScales, got {type(scales).__name__}")
        return cls(_value=torch.reciprocal(scales.value))


@final
@attrs.frozen(eq=False)
class ExpertDequantizeGlobalScales(_ExpertScales):
    """Dequantize-side global scales, one per expert (``[E]`` float32)."""

    @classmethod
    def from_amax(cls, amax: torch.Tensor) -> ExpertDequantizeGlobalScales:
        """Per-expert scales from per-expert amax values (``[E]``, each > 0)."""
        return cls(_value=_expert_amax(amax) / NVFP4_RANGE)

    @classmethod
    def from_quantize(cls, scales: ExpertQuantizeGlobalScales) -> ExpertDequantizeGlobalScales:
        """Convert quantize-side per-expert scales (their reciprocals)."""
        if not isinstance(scales, ExpertQuantizeGlobalScales):
            raise TypeError(f"scales: expected ExpertQuantizeGlobalScales, got {type(scales).__name__}")
        return cls(_value=torch.reciprocal(scales.value))
