"""NVFP4 per-tensor global scales, one type per shape and per convention.

NVFP4 stores the same number two ways, and mixing them up silently scales a
layer's output by the square of the scale:

- quantize side, ``448 * 6 / amax``: what the quantizer multiplies by
  (compressed-tensors' ``weight_global_scale`` / ``input_global_scale``, and
  the scale FlashInfer's ``fp4_quantize`` takes);
- dequantize side, ``amax / (448 * 6)``: what dequantization multiplies by
  (ModelOpt's ``weight_scale_2`` and ``input_scale``).

The class names the convention, and there is no public constructor from a
raw tensor (:class:`_TensorScale`): checkpoint tensors enter through
``from_checkpoint`` of the class whose convention they follow, which refuses
values on the other convention's side of 1 (:func:`_require_convention`),
and a scalar (shape ``[1]``, what a kernel takes) is made from several
values only under a named :class:`ExpertScalePolicy`. Each scale owns a private copy of its small
tensor, so writing to the checkpoint tensor later cannot change it.

Per-expert values are refused where one is NaN, infinite, zero or negative,
and the conservative collapse refuses a lone outlier that would silently
zero the layer (:func:`_refuse_layer_zeroing_outlier`); both errors name the
expert (and the shard, for ``[E, 2]`` gate/up values), counted from the first
expert given (under expert parallelism, this rank's first).
"""

from __future__ import annotations

import abc
import enum
import math
from collections.abc import Callable
from typing import final

import attrs
import torch
from typing_extensions import Self

from moe_core._checks import (
    require_dtype,
    require_int,
    require_ndim,
    require_positive,
    require_shape,
    require_tensor,
    require_unwritten,
    values_readable,
    write_count,
)

E2M1_MAX = 6.0
"""Largest magnitude an FP4 E2M1 value holds."""
E4M3_MAX = 448.0
"""Largest magnitude an FP8 E4M3 (fn) value holds."""
NVFP4_RANGE = E4M3_MAX * E2M1_MAX
"""``448 * 6``: the amax a block scale of 448 and a code of 6 reach together."""
E4M3_FLUSH = 2.0**-10
"""Half of E4M3's smallest subnormal ``2**-9``: a block scale at or below it rounds to zero (ties to even),
and its whole block quantizes to zero."""


class ExpertScalePolicy(enum.Enum):
    """How several global scales (one per expert or shard) become the one scalar a kernel takes."""

    REQUIRE_EQUAL = "require_equal"
    """Every value must be the same (bit for bit); otherwise raise. Checked where values exist (not on meta)."""
    CONSERVATIVE = "conservative"
    """Take the scale of the largest amax, so no expert's values clip
    (the smallest quantize-side or the largest dequantize-side value);
    refuses a lone expert whose amax would zero every other expert's inputs."""


def _owned_copy(value: torch.Tensor) -> torch.Tensor:
    """A detached private copy, so the caller's tensor can be written without changing the scale; a normal tensor
    even inside inference mode, so that writes into it are counted (:func:`~moe_core._checks.write_count`)."""
    with torch.inference_mode(False):
        return value.detach().clone()


def _per_expert(value: torch.Tensor) -> torch.Tensor:
    """``value`` as ``[experts, shards]``: dim 0 counts experts (a scalar is one expert), the rest are its shards."""
    return value.reshape(value.shape[0] if value.dim() else 1, -1)


def _position(experts: torch.Tensor, expert: int, shard: int) -> str:
    """``expert`` (and ``shard``, where an expert has several) of ``experts [experts, shards]``, in words."""
    return f"expert {expert}" if experts.shape[1] == 1 else f"expert {expert}, shard {shard}"


def _require_positive_experts(name: str, value: torch.Tensor) -> None:
    """Raise ``ValueError`` naming the first expert (and shard) whose scale is NaN, infinite or <= 0 (where read)."""
    if not values_readable(value):
        return
    experts = _per_expert(value)
    bad = torch.nonzero(~(torch.isfinite(experts) & (experts > 0)))
    if bad.shape[0]:
        expert, shard = (int(i) for i in bad[0])
        more = f" (and {bad.shape[0] - 1} more)" if bad.shape[0] > 1 else ""
        raise ValueError(
            f"{name}: expected finite values > 0, got {float(experts[expert, shard])} at "
            f"{_position(experts, expert, shard)}{more} of shape {tuple(value.shape)}"
        )


def _check_values(cls_name: str, value: torch.Tensor, *, scalar: bool) -> None:
    name = f"{cls_name}.value"
    require_tensor(name, value)
    require_dtype(name, value, (torch.float32,))
    if scalar:
        require_shape(name, value, (1,), "(one scalar for the whole tensor)")
        require_positive(name, value)
    else:
        require_ndim(name, value, 1, "[num_experts]")
        if value.numel() == 0:
            raise ValueError(f"{name}: expected at least one expert, got shape (0,)")
        _require_positive_experts(name, value)


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
    if isinstance(amax, torch.Tensor) and amax.numel() == 1 and amax.untyped_storage().nbytes() > amax.element_size():
        raise ValueError(
            "amax: got a one-element view into a larger tensor (like per_expert_amax[:1] or [0], one expert's amax "
            "for all); the layer's amax is the largest of every expert's (per_expert_amax.max())"
        )
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


def _checkpoint_values(cls_name: str, tensor: torch.Tensor, num_experts: int) -> torch.Tensor:
    """A checkpoint's scale values as ``[experts, shards]``, each finite and > 0, with one row for each of the
    layer's ``num_experts`` experts; refuses a one-element view into a larger tensor.

    A scalar made from fewer experts' values than the layer has (a slice,
    copied or not, like ``per_expert[:1].clone()``) would stand for experts
    it never saw: the largest amax may be among those left out.
    """
    name = f"{cls_name}.from_checkpoint"
    require_tensor(name, tensor)
    require_int(f"{name}: num_experts", num_experts, minimum=1)
    require_dtype(name, tensor, (torch.float32,))
    if tensor.numel() == 0:
        raise ValueError(f"{name}: expected at least one value, got shape {tuple(tensor.shape)}")
    if (tensor.shape[0] if tensor.dim() else 1) != num_experts:  # a 0-d value: one expert's
        raise ValueError(
            f"{name}: expected one row of values per expert of the layer (dim 0 of size num_experts={num_experts}), "
            f"got shape {tuple(tensor.shape)}: a scalar from some experts' values (like per_expert[:1].clone()) "
            "stands for experts it never saw; pass every expert's values and name a policy"
        )
    if tensor.numel() == 1 and tensor.untyped_storage().nbytes() > tensor.element_size():
        raise ValueError(
            f"{name}: got a one-element view into a larger tensor (like per_expert[:1], which takes "
            "expert 0's scale for all); pass the whole tensor and name a policy"
        )
    if any(stride == 0 and size > 1 for stride, size in zip(tensor.stride(), tensor.shape)):
        raise ValueError(
            f"{name}: got a broadcast tensor of shape {tuple(tensor.shape)} (like per_expert[:1].expand(E): one value "
            "repeated for every expert); pass every expert's own values"
        )
    _require_positive_experts(name, tensor)
    return _per_expert(tensor)


def _layer_value(cls_name: str, tensor: torch.Tensor) -> torch.Tensor:
    """A checkpoint's one value for the whole layer (shape ``()`` or ``[1]``, its own tensor), as ``[1]`` float32."""
    name = f"{cls_name}.from_layer_checkpoint"
    require_tensor(name, tensor)
    require_dtype(name, tensor, (torch.float32,))
    if tensor.numel() != 1 or tensor.dim() > 1:
        raise ValueError(
            f"{name}: expected the layer's one value (shape () or (1,)), got shape {tuple(tensor.shape)}; per-expert "
            "values go through from_checkpoint with num_experts and a policy"
        )
    if tensor.untyped_storage().nbytes() > tensor.element_size():
        raise ValueError(
            f"{name}: got a one-element view into a larger tensor (like per_expert[:1]: one expert's value, not the "
            "layer's); per-expert values go through from_checkpoint with num_experts and a policy"
        )
    _require_positive_experts(name, tensor)
    return tensor.reshape(1)


_SIDES = {
    True: "quantize-side, 448 * 6 / amax, as compressed-tensors stores weight_global_scale and input_global_scale",
    False: "dequantize-side, amax / (448 * 6), as ModelOpt stores weight_scale_2 and input_scale",
}


def _require_convention(name: str, tensor: torch.Tensor, *, quantize_side: bool) -> None:
    """Refuse checkpoint NVFP4 global scales on the other convention's side of 1, naming the first such expert.

    A tensor's convention is whatever class reads it, and read as the other
    one it runs with the square of its scale off (ModelOpt's ``weight_scale_2``
    read as quantize-side gives an all-zero layer). Real files keep the two
    far apart on either side of 1: compressed-tensors' ``weight_global_scale``
    2e4-4e7 and ``input_global_scale`` 632-7e9; ModelOpt's ``weight_scale_2``
    about 3e-5 and ``input_scale`` 1e-4-2e-3. 1 itself reads the same both
    ways (compressed-tensors writes it for an expert calibration never
    reached), and passes; so do NaN, infinite and non-positive values, for
    the checks that name them.
    """
    require_tensor(name, tensor)
    if not values_readable(tensor) or not tensor.numel():
        return
    experts = _per_expert(tensor)
    valid = torch.isfinite(experts) & (experts > 0)
    wrong = torch.nonzero(valid & (experts < 1 if quantize_side else experts > 1))
    if wrong.shape[0]:
        expert, shard = (int(i) for i in wrong[0])
        bound, other = (">= 1", "Dequantize") if quantize_side else ("<= 1", "Quantize")
        raise ValueError(
            f"{name}: expected {_SIDES[quantize_side]} ({bound} in real checkpoints), got "
            f"{float(experts[expert, shard]):.4g} at {_position(experts, expert, shard)}, a value of the other side "
            f"({_SIDES[not quantize_side]}): read it with {other}GlobalScale or Expert{other}GlobalScales."
            "from_checkpoint and convert it explicitly"
        )


def _refuse_layer_zeroing_outlier(name: str, experts: torch.Tensor, *, quantize_side: bool) -> None:
    """Refuse a conservative scalar, set by one expert, under which no other expert's calibrated input survives.

    With the scalar quantize-side scale ``gs``, a block of amax ``a`` gets
    the E4M3 scale ``gs * a / 6``, which rounds to zero at or below
    :data:`E4M3_FLUSH`, and the block quantizes to zero. Expert ``e``'s
    calibrated amax is ``448 * 6 / gs_e``, so its largest block gets
    ``448 * gs / gs_e``: under ``gs = min gs_e`` every input expert ``e`` saw
    in calibration quantizes to zero once ``gs_e >= 448 * 2**10 * gs``.
    For one small expert that is the policy's documented cost (the split
    fixture's expert 5), and passes. For every expert but the one that set
    ``gs`` it leaves a layer of one expert, which no checkpoint means (one
    expert's value is tiny, or on the dequantize side huge): refused, naming
    that expert. Milder outliers (compressed-tensors writes 1.0 for an
    uncalibrated expert) coarsen the others' block scales without zeroing
    them, and pass: only what cannot be right is refused.
    """
    values = experts.detach().cpu().double()
    quantize = values if quantize_side else values.reciprocal()
    per_expert = quantize.amin(dim=1)
    if per_expert.numel() < 2:
        return
    outlier = int(per_expert.argmin())
    largest = int(per_expert.clone().index_fill_(0, torch.tensor(outlier), math.inf).argmin())
    block_scale = E4M3_MAX * float(per_expert[outlier] / per_expert[largest])
    if block_scale > E4M3_FLUSH:
        return
    shard = int(quantize[outlier].argmin())
    side = "quantize" if quantize_side else "dequantize"
    raise ValueError(
        f"{name}: expected no expert's scale to zero every other expert's inputs, got "
        f"{float(experts[outlier, shard])} ({side} side, amax {NVFP4_RANGE / float(per_expert[outlier]):.4g}) at "
        f"{_position(experts, outlier, shard)}: as the conservative scalar it gives the largest calibrated input "
        f"of the other experts (amax {NVFP4_RANGE / float(per_expert[largest]):.4g}, expert {largest}) the E4M3 "
        f"block scale {block_scale:.3g}, which rounds to zero (<= 2**-10)"
    )


def _collapse(name: str, value: torch.Tensor, policy: ExpertScalePolicy, conservative: torch.Tensor) -> torch.Tensor:
    """``value`` (any shape) as one scalar ``[1]`` under ``policy``; ``conservative`` is the largest amax's scale."""
    if not isinstance(policy, ExpertScalePolicy):
        raise TypeError(f"policy: expected an ExpertScalePolicy, got {policy!r}")
    if policy is ExpertScalePolicy.CONSERVATIVE:
        return conservative.reshape(1)
    value = value.reshape(-1)
    if values_readable(value) and not torch.equal(value, value[:1].expand_as(value)):
        raise ValueError(
            f"{name}: experts disagree (min {float(value.min())}, max {float(value.max())} "
            f"over {value.numel()} values); a kernel with one global scale needs them equal, "
            "or pass policy=ExpertScalePolicy.CONSERVATIVE to take the largest amax"
        )
    return value[:1]


def _collapse_global_scales(
    name: str, experts: torch.Tensor, policy: ExpertScalePolicy, *, quantize_side: bool
) -> torch.Tensor:
    """NVFP4 global scales ``[experts, shards]`` as one scalar ``[1]`` under ``policy``, in their convention."""
    if policy is ExpertScalePolicy.CONSERVATIVE and values_readable(experts):
        _refuse_layer_zeroing_outlier(name, experts, quantize_side=quantize_side)
    return _collapse(name, experts, policy, experts.amin() if quantize_side else experts.amax())


def _collapse_shards(
    name: str, tensor: torch.Tensor, policy: ExpertScalePolicy, *, quantize_side: bool
) -> torch.Tensor:
    """Checkpoint values ``[E, shards]`` (w1's and w3's input scales: one GEMM input) as ``[E]``: each expert's shards
    made one under ``policy`` (the largest amax's scale, or equal ones), each expert keeping its own value."""
    if not isinstance(policy, ExpertScalePolicy):
        raise TypeError(f"policy: expected an ExpertScalePolicy, got {policy!r}")
    require_tensor(name, tensor)
    require_ndim(name, tensor, 2, "[num_experts, shards]")
    if policy is ExpertScalePolicy.REQUIRE_EQUAL and values_readable(tensor):
        differ = torch.nonzero((tensor != tensor[:, :1]).any(dim=1))
        if differ.shape[0]:
            expert = int(differ[0])
            raise ValueError(
                f"{name}: the shards of expert {expert} disagree ({tensor[expert].tolist()}); one GEMM input takes one "
                "scale: pass policy=ExpertScalePolicy.CONSERVATIVE to take the largest amax's"
            )
    return (tensor.amin(dim=1) if quantize_side else tensor.amax(dim=1)).contiguous()


def _named_constructors(cls: type) -> str:
    """The public classmethods of ``cls``: the named constructors its ``TypeError`` points to."""
    names = {name for klass in cls.__mro__ for name, a in vars(klass).items() if isinstance(a, classmethod)}
    return ", ".join(sorted(name for name in names if not name.startswith("_")))


@attrs.frozen(eq=False)
class _TensorScale:
    """A scale type's one tensor, which no ``__init__`` argument reaches.

    ``__init__`` takes nothing, so no positional, keyword, private-alias
    (``_value=``) or ``attrs.evolve`` spelling hands a raw tensor to a scale:
    mypy's attrs plugin rejects each, and at run time they raise
    ``TypeError``. The named classmethods (``from_checkpoint``,
    ``from_amax``, ...) say which convention a tensor follows and build
    through :meth:`_of`, which copies and checks it. The copy is the
    scale's own, and a write into it after construction is refused at the
    next read of :attr:`value`. Equal only to itself.
    """

    _value: torch.Tensor = attrs.field(init=False)
    _writes: int = attrs.field(init=False, repr=False)

    @property
    def value(self) -> torch.Tensor:
        """float32, finite and > 0, in the subclass's shape: read it, never write to it (``RuntimeError`` at the next
        read after an in-place write)."""
        require_unwritten(type(self).__name__, self._value, self._writes)
        return self._value

    def __attrs_post_init__(self) -> None:
        cls = type(self)
        raise TypeError(
            f"{cls.__name__}() takes no arguments: its tensor enters only through its named constructors "
            f"({_named_constructors(cls)}), which check it"
        )

    @classmethod
    @abc.abstractmethod
    def _check(cls, value: torch.Tensor) -> None:
        """Raise naming the class unless ``value`` fits it."""

    def __reduce__(self) -> tuple[Callable[..., Self], tuple[object, ...]]:
        """Copies (``copy``, ``deepcopy``) and pickles (``torch.save``) rebuild through :meth:`_of`, with their own
        write count; a scale written in place is refused here as at any read."""
        return type(self)._of, (self.value,)

    @classmethod
    def _of(cls, value: torch.Tensor) -> Self:
        """The one way in: a private copy of ``value``, checked, bypassing the argument-less ``__init__``."""
        owned = _owned_copy(require_tensor(f"{cls.__name__}.value", value))
        cls._check(owned)
        scale = object.__new__(cls)
        object.__setattr__(scale, "_value", owned)
        object.__setattr__(scale, "_writes", write_count(owned))
        return scale


@attrs.frozen(eq=False)
class _ScalarScale(_TensorScale):
    """A float32 ``[1]`` scale, and how many experts' values it was collapsed from (:attr:`experts`)."""

    _experts: int | None = attrs.field(init=False, repr=False)

    @classmethod
    def _check(cls, value: torch.Tensor) -> None:
        _check_values(cls.__name__, value, scalar=True)

    @classmethod
    def _of(cls, value: torch.Tensor, experts: int | None = None) -> Self:
        """As :meth:`_TensorScale._of`, recording the count of experts ``value`` was collapsed from (None: none)."""
        scale = super()._of(value)
        object.__setattr__(scale, "_experts", experts)
        return scale

    def __reduce__(self) -> tuple[Callable[..., Self], tuple[object, ...]]:
        """Copies and pickles rebuild through :meth:`_of`, keeping :attr:`experts`."""
        return type(self)._of, (self.value, self._experts)

    @property
    def experts(self) -> int | None:
        """How many experts' checkpoint values it was collapsed from (``from_checkpoint``'s ``num_experts``,
        ``from_experts``' count), checked against the layer's where it is bound (:func:`require_layer_experts`);
        None for a value given for the whole layer (``from_amax``)."""
        return self._experts

    def to(self, device: torch.device | str) -> Self:
        """The same scale with its tensor on ``device``."""
        return self._of(self.value.to(device), self._experts)

    def item(self) -> float:
        """The scale as a Python float (synchronizes with the device)."""
        return float(self.value.item())


@attrs.frozen(eq=False)
class _ExpertScales(_TensorScale):
    """A float32 ``[num_experts]`` scale, one per expert."""

    @classmethod
    def _check(cls, value: torch.Tensor) -> None:
        _check_values(cls.__name__, value, scalar=False)

    @property
    def num_experts(self) -> int:
        """E, the number of experts the scales cover."""
        return int(self.value.shape[0])

    def to(self, device: torch.device | str) -> Self:
        """The same scales with their tensor on ``device``."""
        return self._of(self.value.to(device))

    def experts(self, start: int, stop: int) -> Self:
        """The scales of experts ``[start, stop)`` (this rank's, under expert parallelism)."""
        if isinstance(start, bool) or isinstance(stop, bool) or not (0 <= start < stop <= self.num_experts):
            raise ValueError(f"experts: expected 0 <= start < stop <= {self.num_experts}, got [{start}, {stop})")
        return self._of(self.value[start:stop])

    @classmethod
    def from_checkpoint(cls, tensor: torch.Tensor) -> Self:
        """Per-expert scales as a checkpoint stores them in this class's convention, ``[E]`` float32; refuses a
        strided view (a fused ``[E, 2]`` gate/up scale's ``[:, 0]`` gives the up half the gate's scales)."""
        name = f"{cls.__name__}.from_checkpoint"
        require_tensor(name, tensor)
        if not tensor.is_contiguous():
            raise ValueError(
                f"{name}: got a strided view (like a fused [E, 2] gate/up scale's [:, 0], which gives both halves "
                "the gate's scales); pass each half's own [E] values"
            )
        return cls._of(tensor)


@final
@attrs.frozen(eq=False)
class QuantizeGlobalScale(_ScalarScale):
    """Quantize-side scalar global scale ``448 * 6 / amax`` (compressed-tensors), shape ``[1]``."""

    @classmethod
    def from_amax(cls, amax: float | torch.Tensor) -> QuantizeGlobalScale:
        """The scale that maps ``amax`` (one value > 0) onto the top of the NVFP4 range."""
        return cls._of(NVFP4_RANGE / _scalar_amax(amax))

    def covered_amax(self) -> float:
        """The largest magnitude an activation quantized with this scale keeps without clipping, ``448 * 6 / scale``
        (a block scale saturates at 448 beyond it; synchronizes)."""
        return NVFP4_RANGE / self.item()

    @classmethod
    def from_checkpoint(
        cls, tensor: torch.Tensor, *, num_experts: int, policy: ExpertScalePolicy
    ) -> QuantizeGlobalScale:
        """The scalar from quantize-side checkpoint values of all ``num_experts`` experts (``[E]``, ``[E, 2]``).

        Several values become one under ``policy``, named even where there is
        one value, so that every call site says what it does with many. A NaN,
        infinite or non-positive value is refused, and so, under
        ``CONSERVATIVE``, is one expert's so small that it would zero every
        other expert's inputs; each error names the expert (dim 0) and shard.
        """
        values = _checkpoint_values(cls.__name__, tensor, num_experts)
        _require_convention(f"{cls.__name__}.from_checkpoint", values, quantize_side=True)
        return cls._of(_collapse_global_scales(cls.__name__, values, policy, quantize_side=True), num_experts)

    @classmethod
    def from_layer_checkpoint(cls, tensor: torch.Tensor) -> QuantizeGlobalScale:
        """The one quantize-side value a checkpoint stores for the whole layer (fused experts), shape ``()`` or
        ``[1]``: no expert count to check (like :meth:`from_amax`); refuses a view into a per-expert tensor.

        Only for a value the checkpoint stores as the layer's: a number collapsed here from some experts' values
        (a rank's own slice under expert parallelism, ``local.min()``) cannot say so, and quantizes the layer
        otherwise than its other ranks (0.47 off on one rank's experts, measured); collapse per-expert values with
        :meth:`from_checkpoint` and every expert's values, which checks their count."""
        value = _layer_value(cls.__name__, tensor)
        _require_convention(f"{cls.__name__}.from_layer_checkpoint", value, quantize_side=True)
        return cls._of(value)

    @classmethod
    def from_dequantize(cls, scale: DequantizeGlobalScale) -> QuantizeGlobalScale:
        """Convert a dequantize-side scale (its reciprocal)."""
        if not isinstance(scale, DequantizeGlobalScale):
            raise TypeError(f"scale: expected a DequantizeGlobalScale, got {type(scale).__name__}")
        return cls._of(torch.reciprocal(scale.value), scale.experts)

    @classmethod
    def from_experts(
        cls, scales: ExpertInputScales | ExpertQuantizeGlobalScales, *, policy: ExpertScalePolicy
    ) -> QuantizeGlobalScale:
        """Collapse per-expert scales into one scalar under ``policy``."""
        if not isinstance(scales, (ExpertInputScales, ExpertQuantizeGlobalScales)):
            raise TypeError(f"scales: expected ExpertInputScales or ExpertQuantizeGlobalScales, got {type(scales).__name__}")
        return cls._of(
            _collapse_global_scales(type(scales).__name__, _per_expert(scales.value), policy, quantize_side=True),
            scales.num_experts,
        )


@final
@attrs.frozen(eq=False)
class DequantizeGlobalScale(_ScalarScale):
    """Dequantize-side scalar global scale ``amax / (448 * 6)`` (ModelOpt), shape ``[1]``."""

    @classmethod
    def from_amax(cls, amax: float | torch.Tensor) -> DequantizeGlobalScale:
        """The scale that maps the top of the NVFP4 range back to ``amax`` (one value > 0)."""
        return cls._of(_scalar_amax(amax) / NVFP4_RANGE)

    @classmethod
    def from_checkpoint(
        cls, tensor: torch.Tensor, *, num_experts: int, policy: ExpertScalePolicy
    ) -> DequantizeGlobalScale:
        """The scalar from dequantize-side checkpoint values of all ``num_experts`` experts, under ``policy``.

        Refuses as :meth:`QuantizeGlobalScale.from_checkpoint` does; the
        outlier here is one expert's value so large that it would zero every
        other expert's inputs.
        """
        values = _checkpoint_values(cls.__name__, tensor, num_experts)
        _require_convention(f"{cls.__name__}.from_checkpoint", values, quantize_side=False)
        return cls._of(_collapse_global_scales(cls.__name__, values, policy, quantize_side=False), num_experts)

    @classmethod
    def from_layer_checkpoint(cls, tensor: torch.Tensor) -> DequantizeGlobalScale:
        """The one dequantize-side value a checkpoint stores for the whole layer, as
        :meth:`QuantizeGlobalScale.from_layer_checkpoint`."""
        value = _layer_value(cls.__name__, tensor)
        _require_convention(f"{cls.__name__}.from_layer_checkpoint", value, quantize_side=False)
        return cls._of(value)

    @classmethod
    def from_quantize(cls, scale: QuantizeGlobalScale) -> DequantizeGlobalScale:
        """Convert a quantize-side scale (its reciprocal)."""
        if not isinstance(scale, QuantizeGlobalScale):
            raise TypeError(f"scale: expected a QuantizeGlobalScale, got {type(scale).__name__}")
        return cls._of(torch.reciprocal(scale.value), scale.experts)

    @classmethod
    def from_experts(
        cls, scales: ExpertDequantizeGlobalScales, *, policy: ExpertScalePolicy
    ) -> DequantizeGlobalScale:
        """Collapse per-expert scales into one scalar under ``policy``."""
        if not isinstance(scales, ExpertDequantizeGlobalScales):
            raise TypeError(f"scales: expected ExpertDequantizeGlobalScales, got {type(scales).__name__}")
        return cls._of(
            _collapse_global_scales("ExpertDequantizeGlobalScales", _per_expert(scales.value), policy, quantize_side=False),
            scales.num_experts,
        )


@attrs.frozen(eq=False)
class _QuantizeSideExpertScales(_ExpertScales):
    """Quantize-side ``448 * 6 / amax`` scales, one per expert (``[E]`` float32): what a weight's global scales and
    an input's per-expert scales share, as two types that do not stand in for each other."""

    @classmethod
    def from_amax(cls, amax: torch.Tensor) -> Self:
        """Per-expert scales from per-expert amax values (``[E]``, each > 0)."""
        return cls._of(NVFP4_RANGE / _expert_amax(amax))

    @classmethod
    def from_checkpoint(cls, tensor: torch.Tensor) -> Self:
        """Per-expert quantize-side scales as a checkpoint stores them, ``[E]`` float32; refuses a value below 1
        (one on the dequantize side, see :func:`_require_convention`)."""
        _require_convention(f"{cls.__name__}.from_checkpoint", tensor, quantize_side=True)
        return super().from_checkpoint(tensor)


@final
@attrs.frozen(eq=False)
class ExpertQuantizeGlobalScales(_QuantizeSideExpertScales):
    """Quantize-side global scales of a weight, one per expert (``[E]`` float32)."""

    @classmethod
    def from_dequantize(cls, scales: ExpertDequantizeGlobalScales) -> ExpertQuantizeGlobalScales:
        """Convert dequantize-side per-expert scales (their reciprocals)."""
        if not isinstance(scales, ExpertDequantizeGlobalScales):
            raise TypeError(f"scales: expected ExpertDequantizeGlobalScales, got {type(scales).__name__}")
        return cls._of(torch.reciprocal(scales.value))


@final
@attrs.frozen(eq=False)
class ExpertDequantizeGlobalScales(_ExpertScales):
    """Dequantize-side global scales, one per expert (``[E]`` float32)."""

    @classmethod
    def from_amax(cls, amax: torch.Tensor) -> ExpertDequantizeGlobalScales:
        """Per-expert scales from per-expert amax values (``[E]``, each > 0)."""
        return cls._of(_expert_amax(amax) / NVFP4_RANGE)

    @classmethod
    def from_checkpoint(cls, tensor: torch.Tensor) -> ExpertDequantizeGlobalScales:
        """Per-expert dequantize-side scales as a checkpoint stores them, ``[E]`` float32; refuses a value above 1
        (one on the quantize side, see :func:`_require_convention`)."""
        _require_convention(f"{cls.__name__}.from_checkpoint", tensor, quantize_side=False)
        return super().from_checkpoint(tensor)

    @classmethod
    def from_quantize(cls, scales: ExpertQuantizeGlobalScales) -> ExpertDequantizeGlobalScales:
        """Convert quantize-side per-expert scales (their reciprocals)."""
        if not isinstance(scales, ExpertQuantizeGlobalScales):
            raise TypeError(f"scales: expected ExpertQuantizeGlobalScales, got {type(scales).__name__}")
        return cls._of(torch.reciprocal(scales.value))


@final
@attrs.frozen(eq=False)
class ExpertInputScales(_QuantizeSideExpertScales):
    """Quantize-side global scales of one GEMM's input, one per expert (``[E]`` float32): the per-expert
    input-scale mode (:class:`~moe_core.Nvfp4PerExpertMoeWeights`).

    Its own type, not :class:`ExpertQuantizeGlobalScales`: both are quantize-side ``[E]`` values, and an input's
    scales collapsed from w1's and w3's shards in place of a weight's global scales (the other half's codes
    dequantized at this half's scale) ran 2.64 off.
    """

    @classmethod
    def from_checkpoint_shards(cls, tensor: torch.Tensor, *, policy: ExpertScalePolicy) -> ExpertInputScales:
        """From ``[E, shards]`` quantize-side checkpoint values of one GEMM input (compressed-tensors' w1 and w3
        ``input_global_scale``), each expert's shards made one under ``policy``; refuses values below 1."""
        return cls._of(_checked_shards(f"{cls.__name__}.from_checkpoint_shards", tensor, policy, quantize_side=True))

    @classmethod
    def from_dequantize_checkpoint_shards(cls, tensor: torch.Tensor, *, policy: ExpertScalePolicy) -> ExpertInputScales:
        """From ``[E, shards]`` dequantize-side checkpoint values of one GEMM input (ModelOpt's w1 and w3
        ``input_scale``), each expert's shards made one under ``policy``, then converted (their reciprocals);
        refuses values above 1."""
        name = f"{cls.__name__}.from_dequantize_checkpoint_shards"
        return cls._of(torch.reciprocal(_checked_shards(name, tensor, policy, quantize_side=False)))


def _checked_shards(name: str, tensor: torch.Tensor, policy: ExpertScalePolicy, *, quantize_side: bool) -> torch.Tensor:
    """``[E, shards]`` checkpoint values of one convention, checked (its side of 1, positive), each expert's shards
    made one under ``policy``."""
    _require_convention(name, require_tensor(name, tensor), quantize_side=quantize_side)
    _require_positive_experts(name, tensor)
    return _collapse_shards(name, tensor, policy, quantize_side=quantize_side)


def require_layer_experts(name: str, scale: _ScalarScale, num_experts: int) -> None:
    """Refuse a scalar collapsed from another count of experts than the layer's ``num_experts``: made from some
    experts' values (``from_checkpoint(per_expert[:1].clone(), num_experts=1)``, ``from_experts`` of a slice), it
    stands for experts it never saw, and the largest amax may be among those left out."""
    if scale.experts is not None and scale.experts != num_experts:
        raise ValueError(
            f"{name}: collapsed from {scale.experts} expert(s)' values, but the layer has {num_experts} experts: a "
            "kernel's one input scale is made from every expert's (under expert parallelism too)"
        )
