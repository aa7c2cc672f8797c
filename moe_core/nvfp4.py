"""NVFP4 numerics in plain PyTorch (CPU and GPU): quantize, pack, dequantize.

The format, as compressed-tensors writes it and the Blackwell FP4 kernels read
it: E2M1 codes (values 0, 0.5, 1, 1.5, 2, 3, 4, 6 and their negatives), two a
byte with the first element in the low nibble; one FP8 E4M3 scale per 16
consecutive elements of a row; one FP32 quantize-side global scale ``g`` on top.

Quantization of a block with largest magnitude ``amax``:
``s = e4m3(g * amax / 6)``, ``code = e2m1_rne(clamp(x / (s / g), -6, 6))``.
Dequantization: ``x = e2m1(code) * s / g``. Arithmetic is float32 throughout
and follows compressed-tensors' operation order, so codes and scales match it
bit for bit, including its rule for a block whose scale rounds to zero in
E4M3 (an all-zero block, or one whose amax is below about 2e-6 of the
tensor's amax): it stores 0.125 instead, which still encodes every value of
the block as zero.

For bf16 or fp16 input, compressed-tensors (and so llmcompressor's
checkpoints) computes two steps in the input's dtype: the global scale
``448 * 6 / amax`` and each block's ``amax / 6``, both rounded to that dtype
(an fp16 global scale that overflows, amax below 2688 / 65504, becomes 1.0,
which zeroes the expert).
:class:`Nvfp4Arithmetic` makes that a choice at every quantize call:
``FLOAT32`` (the default, the more accurate) computes them in float32,
``INPUT_DTYPE`` rounds them as compressed-tensors does and matches its
codes and scales bit for bit on bf16 and fp16 input too, except that it
refuses an expert whose fp16 global scale overflows. For float32 input
the two are the same. The CUDA kernels multiply
by an approximate reciprocal instead of dividing, so they may round a value
lying within an ulp of a midpoint between codes the other way, and store
scale 0 for such a block.
"""

from __future__ import annotations

import enum
from typing import final

import attrs
import torch

from moe_core._checks import (
    FLOAT_DTYPES,
    record_built,
    require_dtype,
    require_finite,
    require_int,
    require_ndim,
    require_nonempty,
    require_same_device,
    require_shape,
    require_tensor,
    values_readable,
)
from moe_core.block_scales import LinearBlockScales
from moe_core._halves import joined_halves
from moe_core.global_scales import E2M1_MAX, E4M3_MAX, NVFP4_RANGE, ExpertQuantizeGlobalScales, QuantizeGlobalScale

BLOCK_SIZE = 16
"""Elements sharing one E4M3 block scale."""

E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
"""Magnitudes of the E2M1 codes 0..7; bit 3 of a code is the sign."""

UNDERFLOW_SCALE = 0.125
"""E4M3 block scale stored where the computed one rounds to zero (compressed-tensors' rule)."""

_SIGN_BIT = 8
# Midpoints between neighbouring E2M1 magnitudes, each with whether a tie there
# rounds up: ties go to the code with an even mantissa (round half to even).
_MIDPOINTS = ((0.25, False), (0.75, True), (1.25, False), (1.75, True), (2.5, False), (3.5, True), (5.0, False))


def encode_e2m1(values: torch.Tensor) -> torch.Tensor:
    """Round float values to the nearest E2M1 code (ties to even, saturating at 6).

    Returns uint8 codes in 0..15. A negative value that rounds to zero keeps
    its sign (code 8), as compressed-tensors and the CUDA converters encode it.
    """
    magnitude = values.abs()
    codes = torch.zeros(values.shape, dtype=torch.uint8, device=values.device)
    for midpoint, tie_up in _MIDPOINTS:
        codes += (magnitude >= midpoint if tie_up else magnitude > midpoint).to(torch.uint8)
    return codes | ((values < 0).to(torch.uint8) * _SIGN_BIT)


def decode_e2m1(codes: torch.Tensor) -> torch.Tensor:
    """The float32 values of uint8 E2M1 codes (0..15)."""
    table = torch.tensor(E2M1_VALUES, dtype=torch.float32, device=codes.device)
    magnitude = table[(codes & 7).long()]
    return torch.where((codes & _SIGN_BIT) != 0, -magnitude, magnitude)


def pack_e2m1(codes: torch.Tensor) -> torch.Tensor:
    """Pack codes ``[..., 2n]`` into bytes ``[..., n]``, the first code in the low nibble."""
    if codes.shape[-1] % 2:
        raise ValueError(f"codes: expected an even last dim, got shape {tuple(codes.shape)}")
    pairs = codes.reshape(*codes.shape[:-1], -1, 2)
    return pairs[..., 0] | (pairs[..., 1] << 4)


def unpack_e2m1(packed: torch.Tensor) -> torch.Tensor:
    """Unpack bytes ``[..., n]`` into codes ``[..., 2n]`` (low nibble first)."""
    return torch.stack((packed & 0x0F, packed >> 4), dim=-1).reshape(*packed.shape[:-1], 2 * packed.shape[-1])


def _as_blocks(x: torch.Tensor) -> torch.Tensor:
    """View ``[..., cols]`` as ``[..., cols / 16, 16]``."""
    return x.reshape(*x.shape[:-1], -1, BLOCK_SIZE)


class Nvfp4Arithmetic(enum.Enum):
    """In which dtype a quantizer computes the global scale and each block's ``amax / 6`` (see the module docstring)."""

    FLOAT32 = "float32"
    """In float32 whatever the input's dtype: the more accurate choice."""
    INPUT_DTYPE = "input_dtype"
    """In the input's dtype (bf16, fp16), rounded there, as compressed-tensors and llmcompressor do;
    the codes and scales then match theirs bit for bit."""


def _check_arithmetic(arithmetic: Nvfp4Arithmetic) -> None:
    if not isinstance(arithmetic, Nvfp4Arithmetic):
        raise TypeError(f"arithmetic: expected an Nvfp4Arithmetic, got {arithmetic!r}")


def _global_scales_of(amax: torch.Tensor, arithmetic: Nvfp4Arithmetic) -> ExpertQuantizeGlobalScales:
    """``448 * 6 / amax`` per expert, 1.0 where that is not finite because the expert is all zeros, in
    ``arithmetic``; a ``ValueError`` naming the experts where it overflows the input's dtype (fp16 under
    ``INPUT_DTYPE``: amax below ``2688 / 65504``, about 0.041), whose blocks would all read as zeros under 1.0."""
    if arithmetic is Nvfp4Arithmetic.FLOAT32:
        amax = amax.to(torch.float32)
    scale = NVFP4_RANGE / amax.clamp(min=torch.finfo(amax.dtype).tiny)
    if values_readable(amax):
        overflowed = ((amax > 0) & ~torch.isfinite(scale)).nonzero().flatten().tolist()
        if overflowed:
            smallest = float(amax[overflowed].min())
            raise ValueError(
                f"w: the global scale {NVFP4_RANGE:g} / amax of experts {overflowed[:8]}{' ...' if len(overflowed) > 8 else ''} "
                f"(amax down to {smallest:.3g}) overflows {amax.dtype} under {arithmetic}; quantize with "
                "Nvfp4Arithmetic.FLOAT32"
            )
    return ExpertQuantizeGlobalScales._of(torch.nan_to_num(scale, posinf=1.0).to(torch.float32))


def _quantize_blocks(
    x: torch.Tensor, global_scale: torch.Tensor, arithmetic: Nvfp4Arithmetic
) -> tuple[torch.Tensor, torch.Tensor]:
    """Packed codes and E4M3 scales of ``x [..., rows, cols]``; ``global_scale`` broadcasts per row."""
    gs = global_scale.reshape(*global_scale.shape, 1, 1)
    amax = _as_blocks(x).abs().amax(dim=-1)
    if arithmetic is Nvfp4Arithmetic.FLOAT32:
        amax = amax.to(torch.float32)
    # a tensor divisor: CUDA would multiply by fl(1/6) for a Python one (see moe_core.fp8's correctly rounded scales)
    per_block = (amax / torch.full((), E2M1_MAX, dtype=amax.dtype, device=amax.device)).to(torch.float32)
    blocks = _as_blocks(x.to(torch.float32))
    scales = (gs * per_block).clamp(max=E4M3_MAX).to(torch.float8_e4m3fn).to(torch.float32)
    scales = torch.where(scales == 0, UNDERFLOW_SCALE, scales)
    scaled = blocks / (scales / gs).unsqueeze(-1)
    codes = encode_e2m1(scaled.clamp(-E2M1_MAX, E2M1_MAX)).flatten(-2)
    return pack_e2m1(codes), scales.to(torch.float8_e4m3fn)


def _dequantize_blocks(packed: torch.Tensor, scales: torch.Tensor, global_scale: torch.Tensor) -> torch.Tensor:
    values = _as_blocks(decode_e2m1(unpack_e2m1(packed)))
    gs = global_scale.reshape(*global_scale.shape, 1, 1)
    block_scale = (scales.to(torch.float32) / gs).unsqueeze(-1)
    return (values * block_scale).flatten(-2)


def _check_float_input(name: str, x: torch.Tensor, ndim: int, layout: str) -> None:
    require_tensor(name, x)
    require_dtype(name, x, FLOAT_DTYPES)
    require_ndim(name, x, ndim, layout)
    require_nonempty(name, x, layout)
    if x.shape[-1] % BLOCK_SIZE:
        raise ValueError(f"{name}: expected the last dim to be a multiple of {BLOCK_SIZE}, got {x.shape[-1]}")
    require_finite(name, x)


def _check_packed(
    holder: object, cls_name: str, packed: torch.Tensor, scales: LinearBlockScales, ndim: int, layout: str
) -> None:
    require_tensor(f"{cls_name}.packed", packed)
    require_dtype(f"{cls_name}.packed", packed, (torch.uint8,))
    require_ndim(f"{cls_name}.packed", packed, ndim, layout)
    record_built(holder, "packed", packed)
    if not isinstance(scales, LinearBlockScales):
        raise TypeError(f"{cls_name}.block_scales: expected LinearBlockScales, got {type(scales).__name__}")
    if (2 * packed.shape[-1]) % BLOCK_SIZE:
        raise ValueError(
            f"{cls_name}.packed: expected {BLOCK_SIZE // 2}-byte multiples per row, got {packed.shape[-1]}"
        )
    expected = (*packed.shape[:-1], 2 * packed.shape[-1] // BLOCK_SIZE)
    require_shape(f"{cls_name}.block_scales", scales.data, expected, "(one scale per 16 elements)")


@final
@attrs.frozen(eq=False)
class Nvfp4Tensor:
    """One NVFP4 matrix ``[rows, cols]`` with a scalar global scale (an activation)."""

    packed: torch.Tensor
    """uint8 ``[rows, cols / 2]``."""
    block_scales: LinearBlockScales
    """E4M3 ``[rows, cols / 16]``."""
    global_scale: QuantizeGlobalScale

    def __attrs_post_init__(self) -> None:
        _check_packed(self, "Nvfp4Tensor", self.packed, self.block_scales, 2, "[rows, cols / 2]")
        if not isinstance(self.global_scale, QuantizeGlobalScale):
            raise TypeError(
                f"Nvfp4Tensor.global_scale: expected QuantizeGlobalScale, got {type(self.global_scale).__name__}"
            )
        require_same_device(
            [
                ("packed", self.packed),
                ("block_scales", self.block_scales.data),
                ("global_scale", self.global_scale.value),
            ]
        )

    @property
    def shape(self) -> tuple[int, int]:
        """The logical ``(rows, cols)``."""
        return int(self.packed.shape[0]), 2 * int(self.packed.shape[1])

    @classmethod
    def quantize(
        cls,
        x: torch.Tensor,
        global_scale: QuantizeGlobalScale,
        *,
        arithmetic: Nvfp4Arithmetic = Nvfp4Arithmetic.FLOAT32,
    ) -> Nvfp4Tensor:
        """Quantize a finite float matrix ``[rows, cols]`` (cols a multiple of 16)."""
        _check_float_input("x", x, 2, "[rows, cols]")
        _check_arithmetic(arithmetic)
        scale = global_scale.to(x.device)
        packed, scales = _quantize_blocks(x, scale.value.reshape(()), arithmetic)
        return cls(packed, LinearBlockScales.from_checkpoint(scales), scale)

    def to(self, device: torch.device | str) -> Nvfp4Tensor:
        """The same tensor on ``device``."""
        return Nvfp4Tensor(self.packed.to(device), self.block_scales.to(device), self.global_scale.to(device))

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """The values the codes stand for, ``[rows, cols]`` in ``dtype``."""
        gs = self.global_scale.value.reshape(())
        return _dequantize_blocks(self.packed, self.block_scales.data, gs).to(dtype)


@final
@attrs.frozen(eq=False)
class Nvfp4ExpertWeights:
    """Stacked NVFP4 expert matrices ``[E, rows, cols]``, one global scale per expert."""

    packed: torch.Tensor
    """uint8 ``[E, rows, cols / 2]``."""
    block_scales: LinearBlockScales
    """E4M3 ``[E, rows, cols / 16]``."""
    global_scales: ExpertQuantizeGlobalScales

    def __attrs_post_init__(self) -> None:
        _check_packed(self, "Nvfp4ExpertWeights", self.packed, self.block_scales, 3, "[num_experts, rows, cols / 2]")
        if not isinstance(self.global_scales, ExpertQuantizeGlobalScales):
            raise TypeError(
                "Nvfp4ExpertWeights.global_scales: expected ExpertQuantizeGlobalScales, "
                f"got {type(self.global_scales).__name__}"
            )
        if self.global_scales.num_experts != self.packed.shape[0]:
            raise ValueError(
                f"Nvfp4ExpertWeights.global_scales: expected {self.packed.shape[0]} experts like packed, "
                f"got {self.global_scales.num_experts}"
            )
        require_same_device(
            [
                ("packed", self.packed),
                ("block_scales", self.block_scales.data),
                ("global_scales", self.global_scales.value),
            ]
        )
        values = self.global_scales.value
        if values_readable(values) and values.numel() and float(values.min()) < 1:
            raise ValueError(
                f"Nvfp4ExpertWeights.global_scales: a weight's quantize-side global scale is 448 * 6 / amax, >= 1 "
                f"for any weight amax up to 2688 (compressed-tensors checkpoints: 2e4-4e7), got {float(values.min()):.4g}: "
                "a checkpoint's scale passed to from_amax, or a dequantize-side one (ModelOpt's weight_scale_2: "
                "ExpertDequantizeGlobalScales.from_checkpoint, then convert)"
            )

    @property
    def shape(self) -> tuple[int, int, int]:
        """The logical ``(num_experts, rows, cols)``."""
        experts, rows, half_cols = self.packed.shape
        return int(experts), int(rows), 2 * int(half_cols)

    @classmethod
    def quantize(
        cls,
        w: torch.Tensor,
        global_scales: ExpertQuantizeGlobalScales | None = None,
        *,
        arithmetic: Nvfp4Arithmetic = Nvfp4Arithmetic.FLOAT32,
    ) -> Nvfp4ExpertWeights:
        """Quantize finite float weights ``[E, rows, cols]`` (cols a multiple of 16).

        Without ``global_scales``, each expert gets ``448 * 6 / amax`` of its own
        values, and an all-zero expert gets 1.0 (as compressed-tensors does).
        """
        _check_float_input("w", w, 3, "[num_experts, rows, cols]")
        _check_arithmetic(arithmetic)
        if global_scales is None:
            global_scales = _global_scales_of(w.detach().abs().amax(dim=(1, 2)), arithmetic)
        elif not isinstance(global_scales, ExpertQuantizeGlobalScales):
            raise TypeError(f"global_scales: expected ExpertQuantizeGlobalScales, got {type(global_scales).__name__}")
        elif global_scales.num_experts != w.shape[0]:
            raise ValueError(
                f"global_scales: expected {w.shape[0]} scales, one per expert of w, got {global_scales.num_experts}"
            )
        scales_on_device = global_scales.to(w.device)
        packed, scales = _quantize_blocks(w, scales_on_device.value, arithmetic)
        return cls(packed, LinearBlockScales.from_checkpoint(scales), scales_on_device)

    def to(self, device: torch.device | str) -> Nvfp4ExpertWeights:
        """The same weights on ``device``."""
        return Nvfp4ExpertWeights(self.packed.to(device), self.block_scales.to(device), self.global_scales.to(device))

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """The values the codes stand for, ``[E, rows, cols]`` in ``dtype``."""
        return _dequantize_blocks(self.packed, self.block_scales.data, self.global_scales.value).to(dtype)

    def dequantize_expert(self, expert: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """One expert's matrix ``[rows, cols]`` in ``dtype`` (``0 <= expert < E``)."""
        _check_expert_index(expert, self.shape[0])
        gs = self.global_scales.value[expert]
        return _dequantize_blocks(self.packed[expert], self.block_scales.data[expert], gs).to(dtype)


def _check_expert_index(expert: int, num_experts: int) -> None:
    require_int("expert", expert, minimum=0)
    if expert >= num_experts:
        raise ValueError(f"expert: expected an index below num_experts={num_experts}, got {expert}")


class GateUpScalePolicy(enum.Enum):
    """How a kernel with one FC1 global scale per expert takes w1 and w3 whose scales differ.

    Checkpoints quantize gate (w1) and up (w3) separately, and their global
    scales often differ (vLLM issue 54974: 69% of pairs in one checkpoint,
    up to 10x). Fusing them with ``[:, 0]`` dequantizes the up half with the
    gate's scale: a silently wrong layer, shipped by SGLang, vLLM and TensorRT-LLM.
    """

    REQUIRE_EQUAL = "require_equal"
    """Each expert's two scales must be equal (bit for bit); otherwise raise."""
    RESCALE_BLOCK_SCALES = "rescale_block_scales"
    """Share the smaller quantize-side scale (the larger amax) and multiply the
    other half's E4M3 block scales by the ratio, rounding them to E4M3 again
    (relative error at most 2^-4 per block); the FP4 codes stay as they are."""


@final
@attrs.frozen(eq=False, kw_only=True)
class Nvfp4GateUpWeights:
    """The fused first GEMM ``w13 [E, 2 * I, H]``: gate rows (w1) then up rows (w3).

    Each half keeps its own per-expert global scales, exactly as the
    checkpoint holds them; :meth:`with_shared_global_scales` reconciles them,
    by a named policy, for kernels that take one scale per expert.
    """

    gate: Nvfp4ExpertWeights = attrs.field(kw_only=True)
    """w1, ``[E, I, H]``."""
    up: Nvfp4ExpertWeights = attrs.field(kw_only=True)
    """w3, ``[E, I, H]``."""

    def __attrs_post_init__(self) -> None:
        for name in ("gate", "up"):
            half = getattr(self, name)
            if not isinstance(half, Nvfp4ExpertWeights):
                raise TypeError(f"Nvfp4GateUpWeights.{name}: expected Nvfp4ExpertWeights, got {type(half).__name__}")
        if self.gate.shape != self.up.shape:
            raise ValueError(f"Nvfp4GateUpWeights.up: expected shape {self.gate.shape} like gate, got {self.up.shape}")
        require_same_device([("gate", self.gate.packed), ("up", self.up.packed)])

    @property
    def shape(self) -> tuple[int, int, int]:
        """The logical ``(num_experts, 2 * I, H)``."""
        experts, rows, cols = self.gate.shape
        return experts, 2 * rows, cols

    @property
    def device(self) -> torch.device:
        """Where the weights live."""
        return self.gate.packed.device

    @classmethod
    def quantize(
        cls, w13: torch.Tensor, *, arithmetic: Nvfp4Arithmetic = Nvfp4Arithmetic.FLOAT32
    ) -> Nvfp4GateUpWeights:
        """Quantize ``w13 [E, 2 * I, H]`` (gate rows first), each half with the global scales of its own amax."""
        _check_float_input("w13", w13, 3, "[num_experts, 2 * intermediate, hidden]")
        if w13.shape[1] % 2:
            raise ValueError(f"w13: expected an even row count [gate | up], got {w13.shape[1]}")
        gate, up = w13.chunk(2, dim=1)
        return cls(
            gate=Nvfp4ExpertWeights.quantize(gate, arithmetic=arithmetic),
            up=Nvfp4ExpertWeights.quantize(up, arithmetic=arithmetic),
        )

    def to(self, device: torch.device | str) -> Nvfp4GateUpWeights:
        """The same weights on ``device``."""
        return Nvfp4GateUpWeights(gate=self.gate.to(device), up=self.up.to(device))

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """The values the codes stand for, ``[E, 2 * I, H]``, each half with its own scales."""
        return torch.cat((self.gate.dequantize(dtype), self.up.dequantize(dtype)), dim=1)

    def dequantize_expert(self, expert: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """One expert's ``[2 * I, H]`` in ``dtype``, each half with its own scale."""
        return torch.cat((self.gate.dequantize_expert(expert, dtype), self.up.dequantize_expert(expert, dtype)))

    def with_shared_global_scales(self, policy: GateUpScalePolicy) -> Nvfp4ExpertWeights:
        """The fused ``[E, 2 * I, H]`` weights with one global scale per expert, under ``policy``.

        Values stay exact where the halves agree; under
        ``RESCALE_BLOCK_SCALES`` the rescaled half moves by the E4M3 rounding
        of its block scales, and a block scale that falls below E4M3's
        smallest value becomes 0 (that block reads as zeros).
        """
        if not isinstance(policy, GateUpScalePolicy):
            raise TypeError(f"policy: expected a GateUpScalePolicy, got {policy!r}")
        gate_gs, up_gs = self.gate.global_scales.value, self.up.global_scales.value
        packed = joined_halves(self.gate.packed, self.up.packed)
        if policy is GateUpScalePolicy.REQUIRE_EQUAL:
            if values_readable(gate_gs) and not torch.equal(gate_gs, up_gs):
                differ = (gate_gs != up_gs).nonzero().flatten().tolist()
                raise ValueError(
                    f"w13: gate and up global scales differ for experts {differ[:8]}"
                    f"{' ...' if len(differ) > 8 else ''} (up/gate up to {float((up_gs / gate_gs).max()):.4g}); "
                    "a kernel with one FC1 scale needs them equal, or pass "
                    "policy=GateUpScalePolicy.RESCALE_BLOCK_SCALES"
                )
            scales = joined_halves(self.gate.block_scales.data, self.up.block_scales.data)
            return Nvfp4ExpertWeights(packed, LinearBlockScales.from_checkpoint(scales), self.gate.global_scales)
        shared = torch.minimum(gate_gs, up_gs)
        halves = []
        for half, own in ((self.gate, gate_gs), (self.up, up_gs)):
            ratio = (shared / own).reshape(-1, 1, 1)
            halves.append((half.block_scales.data.to(torch.float32) * ratio).to(torch.float8_e4m3fn))
        fused_scales = ExpertQuantizeGlobalScales._of(shared)
        return Nvfp4ExpertWeights(packed, LinearBlockScales.from_checkpoint(torch.cat(halves, dim=1)), fused_scales)


def quantize_activation(x: torch.Tensor, global_scale: QuantizeGlobalScale) -> Nvfp4Tensor:
    """Quantize a run-time activation ``[rows, cols]`` the way FlashInfer's FP4 kernels do, not compressed-tensors.

    The oracle of an offline weight quantizer is compressed-tensors
    (:meth:`Nvfp4Tensor.quantize`, ``x / (s / g)``); the oracle of a
    quantizer that runs inside a kernel is the kernel. FlashInfer's
    ``cvt_warp_fp16_to_fp4`` (``quantization_utils.cuh``) computes
    ``s = e4m3(g * (amax * (1 / 6)))`` and ``code = e2m1_rne(x * (1 / (s * (1 / g))))``,
    and stores scale 0 (every code 0) for a block whose scale rounds to zero.
    The two round a value within an ulp of an E2M1 midpoint (or a block's
    ``g * amax / 6`` within an ulp of an E4M3 one) apart. Reciprocals here
    are correctly rounded; the kernel's approximate ones differ from them by
    at most an ulp more.
    """
    _check_float_input("x", x, 2, "[rows, cols]")
    scale = global_scale.to(x.device)
    gs = scale.value.reshape(())
    blocks = _as_blocks(x.to(torch.float32))
    sixth = torch.reciprocal(torch.full((), E2M1_MAX, dtype=torch.float32, device=x.device))
    scales = (gs * (blocks.abs().amax(dim=-1) * sixth)).clamp(max=E4M3_MAX).to(torch.float8_e4m3fn).to(torch.float32)
    inverse = torch.where(scales == 0, 0.0, torch.reciprocal(scales * torch.reciprocal(gs)))
    codes = encode_e2m1((blocks * inverse.unsqueeze(-1)).clamp(-E2M1_MAX, E2M1_MAX)).flatten(-2)
    return Nvfp4Tensor(pack_e2m1(codes), LinearBlockScales.from_checkpoint(scales.to(torch.float8_e4m3fn)), scale)
