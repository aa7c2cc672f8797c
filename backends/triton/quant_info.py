"""The Triton backend's quant infos, one per weight format, each with its conversion from canonical weights.

MXFP4 (:class:`TritonMxfp4W4A16Weights`) is W4A16 too: the canonical
codes and E8M0 exponents as they are, and gpt-oss's biases in float32.

W4A16 is not W4A4: :class:`TritonNvfp4W4A16Weights` runs NVFP4 weights with
bf16/fp16 activations (the input scales of the checkpoint are not used), so
it is its own type and is converted from the ``NVFP4_W4A16`` format, never
handed where a W4A4 quant info belongs.

FP8 W8A8 (:class:`TritonFp8Weights`) holds per-channel weight scales (per-tensor
checkpoints' scales repeated on every row of their matrix, which is exact) and
how the activations are quantized: :class:`StaticFp8Activations` (one
calibrated scale per GEMM input) or :class:`DynamicFp8Activations` (each row
its own amax at run time). Block-scaled FP8 (:class:`TritonFp8BlockWeights`) is
its own type: its scales are :class:`~moe_core.Fp8BlockScales`, one per 128x128
block, and its activations are always quantized per token and 128-column group.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from typing import final

import attrs
import torch

from moe_core import (
    DenseMoeWeights,
    ExpertDequantizeGlobalScales,
    Fp8BlockMoeWeights,
    Fp8BlockScales,
    Fp8ChannelMoeWeights,
    Fp8ChannelScales,
    Fp8MoeWeights,
    Fp8TensorScale,
    LinearBlockScales,
    Mxfp4MoeWeights,
    Nvfp4ExpertWeights,
    Nvfp4W4A16MoeWeights,
)
from moe_core._checks import (
    Float8Bytes,
    portable_tensor,
    record_built,
    reduce_rebuilt,
    require_dtype,
    require_ndim,
    require_same_device,
    require_tensor,
    tensor_again,
)
from moe_core.fp8 import FP8_BLOCK
from moe_core._halves import joined_halves
from moe_core.formats._experts import TensorExperts
from moe_core.formats.dense import ExpertBiases
from moe_core.mxfp4 import MXFP4_BLOCK, E8M0Scales

KERNEL_DTYPES = (torch.bfloat16, torch.float16)
"""Weight dtypes the dense kernels multiply."""


def _require_kernel_stack(name: str, tensor: torch.Tensor, dtypes: tuple[torch.dtype, ...]) -> None:
    """A contiguous ``[num_experts, out_features, in_features]`` tensor of one of ``dtypes``, as the kernels index it."""
    require_tensor(name, tensor)
    require_dtype(name, tensor, dtypes)
    require_ndim(name, tensor, 3, "[num_experts, out_features, in_features]")
    if not tensor.is_contiguous():
        raise ValueError(f"{name}: expected a contiguous tensor")


def _expert_dims(w13: torch.Tensor, w2: torch.Tensor, cols_per_element: int) -> tuple[int, int, int]:
    experts, two_i, packed_h = (int(d) for d in w13.shape)
    hidden, inter = packed_h * cols_per_element, two_i // 2
    if two_i % 2 or tuple(w2.shape) != (experts, hidden, inter // cols_per_element):
        raise ValueError(f"w2: expected shape {(experts, hidden, inter // cols_per_element)} to match w13 {tuple(w13.shape)}, got {tuple(w2.shape)}")
    return experts, hidden, inter


@final
@attrs.frozen(eq=False, kw_only=True)
class TritonDenseWeights(TensorExperts):
    """bf16 or fp16 expert weights, contiguous ``w13 [E, 2I, H]`` (gate rows first) and ``w2 [E, H, I]``; or
    ``w13 [E, I, H]`` for a non-gated activation (ReLU^2); optionally each expert's biases, contiguous, in the
    weights' dtype."""

    w13: torch.Tensor
    w2: torch.Tensor
    biases: ExpertBiases | None = None
    """Added after each GEMM in the kernels' epilogues (gpt-oss); the config's ``expert_biases`` must say so."""

    def __attrs_post_init__(self) -> None:
        for name, tensor in (("w13", self.w13), ("w2", self.w2)):
            _require_kernel_stack(f"TritonDenseWeights.{name}", tensor, KERNEL_DTYPES)
        if self.w13.dtype != self.w2.dtype:
            raise TypeError(f"TritonDenseWeights.w2: expected dtype {self.w13.dtype} like w13, got {self.w2.dtype}")
        experts, rows, hidden = (int(d) for d in self.w13.shape)
        if tuple(self.w2.shape) != (experts, hidden, rows):  # not non-gated [E, I, H] / [E, H, I]: gated, checked so
            _expert_dims(self.w13, self.w2, 1)
        tensors = [("w13", self.w13), ("w2", self.w2)]
        if self.biases is not None:
            if not isinstance(self.biases, ExpertBiases):
                raise TypeError(f"TritonDenseWeights.biases: expected ExpertBiases, got {type(self.biases).__name__}")
            for name, tensor, shape in (("w13", self.biases.w13, (experts, rows)), ("w2", self.biases.w2, (experts, hidden))):
                label = f"TritonDenseWeights.biases.{name}"
                require_dtype(label, tensor, (self.w13.dtype,))
                if tuple(tensor.shape) != shape or not tensor.is_contiguous():
                    raise ValueError(f"{label}: expected a contiguous tensor of shape {shape}, got {tuple(tensor.shape)}")
                tensors.append((f"biases.{name}", tensor))
        require_same_device(tensors)
        record_tensors(self, "w13", "w2")

    @property
    def gated(self) -> bool:
        """True when ``w13`` holds gate and up halves (``2I`` rows), False for ``I`` rows (a non-gated activation)."""
        return int(self.w13.shape[1]) != int(self.w2.shape[2])

    @classmethod
    def from_dense(cls, weights: DenseMoeWeights) -> TritonDenseWeights:
        """The canonical dense weights (and biases) in the kernels' layout; float32 ones are rounded to bf16."""
        dtype = weights.w13.dtype if weights.w13.dtype in KERNEL_DTYPES else torch.bfloat16
        biases = weights.biases
        if biases is not None:
            biases = ExpertBiases(w13=biases.w13.to(dtype).contiguous(), w2=biases.w2.to(dtype).contiguous())
        return cls(w13=weights.w13.to(dtype).contiguous(), w2=weights.w2.to(dtype).contiguous(), biases=biases)


class _PackedFp4Experts:
    """The QuantInfo properties of weights held as packed E2M1 codes, ``w13_packed [E, 2I, H / 2]`` (two a byte)."""

    w13_packed: torch.Tensor

    @property
    def num_experts(self) -> int:
        """Experts held."""
        return int(self.w13_packed.shape[0])

    @property
    def hidden_size(self) -> int:
        """H."""
        return 2 * int(self.w13_packed.shape[2])

    @property
    def intermediate_size(self) -> int:
        """I."""
        return int(self.w13_packed.shape[1]) // 2

    @property
    def device(self) -> torch.device:
        """Where the weights live."""
        return self.w13_packed.device


@final
@attrs.frozen(eq=False, kw_only=True)
class TritonNvfp4W4A16Weights(_PackedFp4Experts):
    """NVFP4 weights for bf16/fp16 activations, as the kernels read them.

    Packed E2M1 ``[E, rows, cols / 2]`` and linear E4M3 block scales
    ``[E, rows, cols / 16]``, w13's gate rows first; each half's per-expert
    global scale, dequantize side, multiplies that half's accumulator, so
    differing gate and up scales stay exact.
    """

    w13_packed: torch.Tensor
    w13_block_scales: LinearBlockScales
    gate_scales: ExpertDequantizeGlobalScales
    up_scales: ExpertDequantizeGlobalScales
    w2_packed: torch.Tensor
    w2_block_scales: LinearBlockScales
    w2_scales: ExpertDequantizeGlobalScales
    gate_up_dequant: torch.Tensor = attrs.field(init=False)
    """float32 ``[E, 2]``: ``gate_scales`` and ``up_scales`` side by side, as the kernel reads them."""

    def __attrs_post_init__(self) -> None:
        for name in ("w13_packed", "w2_packed"):
            tensor = require_tensor(f"TritonNvfp4W4A16Weights.{name}", getattr(self, name))
            require_dtype(f"TritonNvfp4W4A16Weights.{name}", tensor, (torch.uint8,))
            require_ndim(f"TritonNvfp4W4A16Weights.{name}", tensor, 3, "[num_experts, rows, cols / 2]")
        experts, _, _ = _expert_dims(self.w13_packed, self.w2_packed, 2)
        for name in ("gate_scales", "up_scales", "w2_scales"):
            scales = getattr(self, name)
            if not isinstance(scales, ExpertDequantizeGlobalScales) or scales.num_experts != experts:
                raise ValueError(f"TritonNvfp4W4A16Weights.{name}: expected ExpertDequantizeGlobalScales of {experts} experts")
        for name, packed, scales in (
            ("w13", self.w13_packed, self.w13_block_scales),
            ("w2", self.w2_packed, self.w2_block_scales),
        ):
            if not isinstance(scales, LinearBlockScales) or tuple(scales.data.shape) != (*packed.shape[:2], packed.shape[2] // 8):
                raise ValueError(f"TritonNvfp4W4A16Weights.{name}_block_scales: expected LinearBlockScales {(*packed.shape[:2], packed.shape[2] // 8)}")
        object.__setattr__(self, "gate_up_dequant", torch.stack((self.gate_scales.value, self.up_scales.value), dim=1))
        require_same_device([("w13_packed", self.w13_packed), ("w2_packed", self.w2_packed), ("scales", self.gate_up_dequant)])
        record_tensors(self, "w13_packed", "w2_packed")

    @classmethod
    def from_nvfp4(cls, weights: Nvfp4W4A16MoeWeights) -> TritonNvfp4W4A16Weights:
        """The canonical NVFP4 W4A16 weights as the kernels read them: the same codes and block scales."""
        gate, up, w2 = weights.w13.gate, weights.w13.up, weights.w2
        return cls(
            w13_packed=joined_halves(gate.packed, up.packed),
            w13_block_scales=LinearBlockScales.from_checkpoint(joined_halves(gate.block_scales.data, up.block_scales.data)),
            gate_scales=ExpertDequantizeGlobalScales.from_quantize(gate.global_scales),
            up_scales=ExpertDequantizeGlobalScales.from_quantize(up.global_scales),
            w2_packed=w2.packed.contiguous(),
            w2_block_scales=LinearBlockScales.from_checkpoint(w2.block_scales.data.contiguous()),
            w2_scales=ExpertDequantizeGlobalScales.from_quantize(w2.global_scales),
        )


@final
@attrs.frozen(eq=False, kw_only=True)
class TritonMxfp4W4A16Weights(_PackedFp4Experts):
    """MXFP4 weights for bf16/fp16 activations, as the kernels read them.

    Packed E2M1 ``[E, rows, cols / 2]`` (the first element of each pair in the
    low nibble) and their E8M0 exponents ``[E, rows, cols / 32]``, both
    contiguous, w13's gate rows first; no global scale. Optionally each
    expert's biases, contiguous float32 (``w13 [E, 2I]``, ``w2 [E, H]``),
    added in the GEMMs' epilogues. The kernels decode every exponent :class:`~moe_core.mxfp4.E8M0Scales` takes.
    """

    w13_packed: torch.Tensor
    w13_scales: E8M0Scales
    w2_packed: torch.Tensor
    w2_scales: E8M0Scales
    biases: ExpertBiases | None = None
    """Added after each GEMM in the kernels' epilogues (gpt-oss); the config's ``expert_biases`` must say so."""

    def __attrs_post_init__(self) -> None:
        label = "TritonMxfp4W4A16Weights"
        for name in ("w13_packed", "w2_packed"):
            _require_kernel_stack(f"{label}.{name}", getattr(self, name), (torch.uint8,))
        experts, hidden, inter = _expert_dims(self.w13_packed, self.w2_packed, 2)
        if hidden % MXFP4_BLOCK or inter % MXFP4_BLOCK:
            raise ValueError(f"{label}: expected hidden and intermediate sizes that are multiples of {MXFP4_BLOCK}, got {(hidden, inter)}")
        tensors = [("w13_packed", self.w13_packed), ("w2_packed", self.w2_packed)]
        for name, packed, scales in (("w13", self.w13_packed, self.w13_scales), ("w2", self.w2_packed, self.w2_scales)):
            expected = (*packed.shape[:2], packed.shape[2] // (MXFP4_BLOCK // 2))
            if not isinstance(scales, E8M0Scales) or scales.shape != expected:
                raise ValueError(f"{label}.{name}_scales: expected E8M0Scales of shape {expected}")
            codes = scales.codes
            if not codes.is_contiguous():
                raise ValueError(f"{label}.{name}_scales: expected contiguous exponents")
            tensors.append((f"{name}_scales", codes))
        if self.biases is not None:
            if not isinstance(self.biases, ExpertBiases):
                raise TypeError(f"{label}.biases: expected ExpertBiases, got {type(self.biases).__name__}")
            for name, tensor, shape in (("w13", self.biases.w13, (experts, 2 * inter)), ("w2", self.biases.w2, (experts, hidden))):
                require_dtype(f"{label}.biases.{name}", tensor, (torch.float32,))
                if tuple(tensor.shape) != shape or not tensor.is_contiguous():
                    raise ValueError(f"{label}.biases.{name}: expected a contiguous tensor of shape {shape}, got {tuple(tensor.shape)}")
                tensors.append((f"biases.{name}", tensor))
        require_same_device(tensors)
        record_tensors(self, "w13_packed", "w2_packed")

    @classmethod
    def from_mxfp4(cls, weights: Mxfp4MoeWeights) -> TritonMxfp4W4A16Weights:
        """The canonical MXFP4 weights as the kernels read them: the same codes and exponents (contiguous), the
        biases in float32 (exact from bf16)."""
        biases = weights.biases
        if biases is not None:
            biases = ExpertBiases(
                w13=biases.w13.to(torch.float32).contiguous(), w2=biases.w2.to(torch.float32).contiguous()
            )

        def exponents(scales: E8M0Scales) -> E8M0Scales:
            codes = scales.codes
            return scales if codes.is_contiguous() else E8M0Scales.from_checkpoint(codes.contiguous())

        return cls(
            w13_packed=weights.w13.packed.contiguous(), w13_scales=exponents(weights.w13.scales),
            w2_packed=weights.w2.packed.contiguous(), w2_scales=exponents(weights.w2.scales), biases=biases,
        )


@final
@attrs.frozen(eq=False, kw_only=True)
class StaticFp8Activations:
    """Each GEMM input quantized with one calibrated per-tensor scale (a checkpoint's ``input_scale``s)."""

    w13_input_scale: Fp8TensorScale
    """Quantizes the hidden states."""
    w2_input_scale: Fp8TensorScale
    """Quantizes the gated activation (the first GEMM writes E4M3 directly)."""

    def __attrs_post_init__(self) -> None:
        for name in ("w13_input_scale", "w2_input_scale"):
            if not isinstance(getattr(self, name), Fp8TensorScale):
                raise TypeError(f"StaticFp8Activations.{name}: expected Fp8TensorScale, got {type(getattr(self, name)).__name__}")


@final
@attrs.frozen
class DynamicFp8Activations:
    """Each GEMM input's rows quantized with their own amax at run time (per-token scales, nothing calibrated)."""


Fp8Activations = StaticFp8Activations | DynamicFp8Activations
"""How a W8A8 forward quantizes its GEMM inputs."""


class Fp8Accumulation(enum.Enum):
    """Where per-tensor/per-channel FP8 dot products accumulate on Hopper (the choice is accuracy against speed).

    Measured on the H200 against the FP8 reference with float32 activations
    (K = 4096-7168): 3.4-3.6e-3 relative error promoted, 1.2-1.6e-2 not; Mixtral
    prefill at T=4096, side by side in one run: 782 TFLOP/s promoted, 943 not.
    """

    FLOAT32_EVERY_TILE = "float32-every-tile"
    """Add the FP8 MMAs into the float32 accumulator every K tile (the default)."""
    TENSOR_CORE = "tensor-core"
    """Keep the whole K in the tensor cores' narrower accumulator: Triton's SM90 default, as vLLM's and SGLang's fused MoE run."""


@final
@attrs.frozen(eq=False)
class TritonFp8Weights(TensorExperts):
    """FP8 E4M3 W8A8 experts as the kernels read them: codes, per-channel dequantize-side scales, the activations' scheme.

    ``w13 [E, 2I, H]`` (gate rows first) with ``w13_scales [E, 2I]``, so the
    gate and up halves keep their own scales; ``w2 [E, H, I]`` with
    ``w2_scales [E, H]``.

    The activations' scheme follows from the canonical format, so there is
    no public constructor (``__init__`` takes nothing, and ``attrs.evolve``
    has no field to change): :meth:`from_fp8` pairs per-tensor weights with
    their checkpoint's static input scales, :meth:`from_fp8_channel`
    per-channel weights with per-token scales. A static checkpoint run with
    dynamic activations computes another layer (0.055 off its oracle);
    :meth:`with_accumulation` is the one choice left to the caller.
    """

    w13: torch.Tensor = attrs.field(init=False)
    w13_scales: Fp8ChannelScales = attrs.field(init=False)
    w2: torch.Tensor = attrs.field(init=False)
    w2_scales: Fp8ChannelScales = attrs.field(init=False)
    activations: Fp8Activations = attrs.field(init=False)
    accumulation: Fp8Accumulation = attrs.field(init=False)

    def __attrs_post_init__(self) -> None:
        raise TypeError(
            "TritonFp8Weights() takes no arguments: build it with from_fp8 or from_fp8_channel, "
            "which pair the weights with the activations' scheme of their format"
        )

    def __reduce__(self) -> tuple[Callable[..., TritonFp8Weights], tuple[object, ...]]:
        """Copies and pickles are built again through :meth:`_of`, the codes carried as bytes (plain pickle cannot
        load a float8 tensor)."""
        return _fp8_weights_again, (
            portable_tensor(self.w13), self.w13_scales, portable_tensor(self.w2), self.w2_scales, self.activations,
            self.accumulation,
        )

    @classmethod
    def _of(
        cls,
        *,
        w13: torch.Tensor,
        w13_scales: Fp8ChannelScales,
        w2: torch.Tensor,
        w2_scales: Fp8ChannelScales,
        activations: Fp8Activations,
        accumulation: Fp8Accumulation = Fp8Accumulation.FLOAT32_EVERY_TILE,
    ) -> TritonFp8Weights:
        """The one way in, checked, bypassing the argument-less ``__init__``."""
        if not isinstance(accumulation, Fp8Accumulation):
            raise TypeError(f"TritonFp8Weights.accumulation: expected an Fp8Accumulation, got {accumulation!r}")
        for name, tensor, scales in (("w13", w13, w13_scales), ("w2", w2, w2_scales)):
            _require_kernel_stack(f"TritonFp8Weights.{name}", tensor, (torch.float8_e4m3fn,))
            if not isinstance(scales, Fp8ChannelScales) or tuple(scales.value.shape) != tuple(tensor.shape[:2]):
                raise ValueError(f"TritonFp8Weights.{name}_scales: expected Fp8ChannelScales of shape {tuple(tensor.shape[:2])}")
        if not isinstance(activations, (StaticFp8Activations, DynamicFp8Activations)):
            raise TypeError(
                f"TritonFp8Weights.activations: expected StaticFp8Activations or DynamicFp8Activations, "
                f"got {type(activations).__name__}"
            )
        _expert_dims(w13, w2, 1)
        tensors = [("w13", w13), ("w2", w2), ("w13_scales", w13_scales.value), ("w2_scales", w2_scales.value)]
        if isinstance(activations, StaticFp8Activations):
            tensors.append(("w13_input_scale", activations.w13_input_scale.value))
            tensors.append(("w2_input_scale", activations.w2_input_scale.value))
        require_same_device(tensors)
        weights = object.__new__(cls)
        fields = {"w13": w13, "w13_scales": w13_scales, "w2": w2, "w2_scales": w2_scales}
        for name, value in (*fields.items(), ("activations", activations), ("accumulation", accumulation)):
            object.__setattr__(weights, name, value)
        record_tensors(weights, "w13", "w2")
        return weights

    @classmethod
    def from_fp8(cls, weights: Fp8MoeWeights) -> TritonFp8Weights:
        """Per-tensor FP8 weights with their static input scales; each half's scale repeated on its rows."""
        gate, up = weights.w13.gate, weights.w13.up
        return cls._of(
            w13=joined_halves(gate.codes, up.codes),
            w13_scales=Fp8ChannelScales.from_halves(gate=gate.scales, up=up.scales, rows=gate.shape[1]),
            w2=weights.w2.codes.contiguous(),
            w2_scales=Fp8ChannelScales.from_expert(weights.w2.scales, weights.w2.shape[1]),
            activations=StaticFp8Activations(
                w13_input_scale=weights.w13_input_scale, w2_input_scale=weights.w2_input_scale
            ),
        )

    @classmethod
    def from_fp8_channel(cls, weights: Fp8ChannelMoeWeights) -> TritonFp8Weights:
        """Per-channel FP8 weights as they are, activations quantized per token."""
        return cls._of(
            w13=weights.w13.codes.contiguous(),
            w13_scales=weights.w13.scales,
            w2=weights.w2.codes.contiguous(),
            w2_scales=weights.w2.scales,
            activations=DynamicFp8Activations(),
        )

    def with_accumulation(self, accumulation: Fp8Accumulation) -> TritonFp8Weights:
        """The same weights and activations' scheme, accumulated as ``accumulation`` says."""
        return TritonFp8Weights._of(
            w13=self.w13, w13_scales=self.w13_scales, w2=self.w2, w2_scales=self.w2_scales,
            activations=self.activations, accumulation=accumulation,
        )


def record_tensors(holder: object, *names: str) -> None:
    """Remember the write counts of ``holder``'s tensors ``names`` as it is built (:func:`~moe_core._checks.record_built`):
    a loader's buffer refilled with the next layer before this quant info is bound is then refused at binding, as for
    the canonical weights (adversarial pass 15, c04: the last layer's codes ran, 1.35-1.58 off)."""
    for name in names:
        record_built(holder, name, getattr(holder, name))


def _fp8_weights_again(
    w13: torch.Tensor | Float8Bytes, w13_scales: Fp8ChannelScales, w2: torch.Tensor | Float8Bytes,
    w2_scales: Fp8ChannelScales, activations: Fp8Activations, accumulation: Fp8Accumulation,
) -> TritonFp8Weights:
    """A copied or unpickled :class:`TritonFp8Weights`, checked by :meth:`TritonFp8Weights._of`."""
    return TritonFp8Weights._of(
        w13=tensor_again(w13), w13_scales=w13_scales, w2=tensor_again(w2), w2_scales=w2_scales, activations=activations,
        accumulation=accumulation,
    )


@final
@attrs.frozen(eq=False, kw_only=True)
class TritonFp8BlockWeights(TensorExperts):
    """Block-scaled FP8 experts as the kernels read them: ``w13 [E, 2I, H]`` (gate rows first) and ``w2 [E, H, I]``,
    each with one dequantize-side scale per 128x128 block; H and I multiples of 128."""

    w13: torch.Tensor
    w13_scales: Fp8BlockScales
    w2: torch.Tensor
    w2_scales: Fp8BlockScales

    def __attrs_post_init__(self) -> None:
        for name, tensor, scales in (("w13", self.w13, self.w13_scales), ("w2", self.w2, self.w2_scales)):
            _require_kernel_stack(f"TritonFp8BlockWeights.{name}", tensor, (torch.float8_e4m3fn,))
            experts, rows, cols = (int(d) for d in tensor.shape)
            if rows % FP8_BLOCK or cols % FP8_BLOCK:
                raise ValueError(f"TritonFp8BlockWeights.{name}: expected dimensions that are multiples of {FP8_BLOCK}, got {(rows, cols)}")
            expected = (experts, rows // FP8_BLOCK, cols // FP8_BLOCK)
            if not isinstance(scales, Fp8BlockScales) or tuple(scales.value.shape) != expected:
                raise ValueError(f"TritonFp8BlockWeights.{name}_scales: expected Fp8BlockScales of shape {expected}")
        _expert_dims(self.w13, self.w2, 1)
        require_same_device(
            [("w13", self.w13), ("w2", self.w2), ("w13_scales", self.w13_scales.value), ("w2_scales", self.w2_scales.value)]
        )
        record_tensors(self, "w13", "w2")

    def __reduce__(self) -> tuple[Callable[..., object], tuple[object, ...]]:
        """Copies and pickles are built again through the constructor, the codes carried as bytes."""
        return reduce_rebuilt(self, "TritonFp8BlockWeights")

    @classmethod
    def from_fp8_block(cls, weights: Fp8BlockMoeWeights) -> TritonFp8BlockWeights:
        """The canonical block-scaled weights as they are."""
        return cls(
            w13=weights.w13.codes.contiguous(), w13_scales=weights.w13.scales,
            w2=weights.w2.codes.contiguous(), w2_scales=weights.w2.scales,
        )
