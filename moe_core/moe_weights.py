"""moe-core's canonical expert weights: what a scheme holds after loading.

These are the quant info of the reference backends, and the common source a
kernel backend converts once into its own quant info (shuffled, swizzled,
with precomputed alphas) through the conversions it registers per format
(:mod:`moe_core.formats`).

Layout: ``w13`` is ``[E, 2 * I, H]`` with the gate rows first (w1, then w3),
``w2`` is ``[E, H, I]``; both are ``out_features x in_features`` like
``nn.Linear.weight``. Fields are keyword-only: several share a type, and a
swapped pair would run and silently give another layer.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, final

import attrs
import torch

from moe_core._checks import (
    FLOAT_DTYPES,
    require_dtype,
    require_finite,
    require_ndim,
    require_same_device,
    require_tensor,
)
from moe_core.fp8 import (
    FP8_BLOCK,
    Fp8BlockExpertWeights,
    Fp8ChannelExpertWeights,
    Fp8ExpertWeights,
    Fp8GateUpWeights,
    Fp8TensorScale,
)
from moe_core.global_scales import QuantizeGlobalScale
from moe_core.nvfp4 import Nvfp4ExpertWeights, Nvfp4GateUpWeights


def _shape3(tensor: torch.Tensor) -> tuple[int, int, int]:
    first, second, third = tensor.shape
    return int(first), int(second), int(third)


def _check_expert_shapes(cls_name: str, w13: tuple[int, int, int], w2: tuple[int, int, int]) -> None:
    experts, two_i, hidden = w13
    if two_i % 2:
        raise ValueError(f"{cls_name}.w13: expected an even row count [gate | up], got {two_i}")
    expected = (experts, hidden, two_i // 2)
    if w2 != expected:
        raise ValueError(
            f"{cls_name}.w2: expected shape {expected} [num_experts, hidden_size, intermediate_size] "
            f"to match w13 {w13}, got {w2}"
        )


class _Stacked(Protocol):
    """Stacked expert matrices (a tensor, or quantized codes) that report their ``(num_experts, rows, cols)``."""

    @property
    def shape(self) -> Sequence[int]: ...


class _ExpertSizes:
    """The sizes a QuantInfo reports, read from its ``w13 [E, 2I, H]`` and ``w2 [E, H, I]`` stacks."""

    w13: _Stacked
    w2: _Stacked

    @property
    def num_experts(self) -> int:
        """Experts held (this rank's local experts)."""
        return int(self.w13.shape[0])

    @property
    def hidden_size(self) -> int:
        """H."""
        return int(self.w13.shape[2])

    @property
    def intermediate_size(self) -> int:
        """I, per partition."""
        return int(self.w2.shape[2])


class _TensorExperts(_ExpertSizes):
    """The QuantInfo properties of weights held as two tensors ``w13`` and ``w2`` (dense, or a kernel's layout)."""

    w13: torch.Tensor
    w2: torch.Tensor

    @property
    def device(self) -> torch.device:
        """Where the weights live."""
        return self.w13.device


@final
@attrs.frozen(eq=False, kw_only=True)
class DenseMoeWeights(_TensorExperts):
    """Unquantized expert weights in fp32, bf16 or fp16, finite (checked where values exist)."""

    w13: torch.Tensor
    """``[E, 2 * I, H]``, gate rows then up rows."""
    w2: torch.Tensor
    """``[E, H, I]``."""

    def __attrs_post_init__(self) -> None:
        for name, tensor in (("DenseMoeWeights.w13", self.w13), ("DenseMoeWeights.w2", self.w2)):
            require_tensor(name, tensor)
            require_dtype(name, tensor, FLOAT_DTYPES)
            require_ndim(name, tensor, 3, "[num_experts, out_features, in_features]")
            require_finite(name, tensor)
        if self.w13.dtype != self.w2.dtype:
            raise TypeError(f"DenseMoeWeights.w2: expected dtype {self.w13.dtype} like w13, got {self.w2.dtype}")
        _check_expert_shapes("DenseMoeWeights", _shape3(self.w13), _shape3(self.w2))
        require_same_device([("w13", self.w13), ("w2", self.w2)])

@final
@attrs.frozen(eq=False, kw_only=True)
class Nvfp4MoeWeights(_ExpertSizes):
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
        _check_expert_shapes("Nvfp4MoeWeights", self.w13.shape, self.w2.shape)
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


@final
@attrs.frozen(eq=False, kw_only=True)
class Nvfp4W4A16MoeWeights(_ExpertSizes):
    """NVFP4 expert weights run with bf16/fp16 activations (W4A16): no input scales, nothing quantizes activations.

    A different computation from :class:`Nvfp4MoeWeights` (W4A4), so a
    different type: a W4A4 quant info cannot reach a W4A16 runner, nor the
    reverse, without the named step
    :meth:`Nvfp4MoeWeights.without_activation_quantization`.
    """

    w13: Nvfp4GateUpWeights
    w2: Nvfp4ExpertWeights

    def __attrs_post_init__(self) -> None:
        if not isinstance(self.w13, Nvfp4GateUpWeights):
            raise TypeError(f"Nvfp4W4A16MoeWeights.w13: expected Nvfp4GateUpWeights, got {type(self.w13).__name__}")
        if not isinstance(self.w2, Nvfp4ExpertWeights):
            raise TypeError(f"Nvfp4W4A16MoeWeights.w2: expected Nvfp4ExpertWeights, got {type(self.w2).__name__}")
        _check_expert_shapes("Nvfp4W4A16MoeWeights", self.w13.shape, self.w2.shape)
        require_same_device([("w13", self.w13.gate.packed), ("w2", self.w2.packed)])

    @property
    def device(self) -> torch.device:
        """Where the weights live."""
        return self.w2.packed.device

    def dequantize(self, dtype: torch.dtype = torch.float32) -> DenseMoeWeights:
        """The dense weights the codes stand for."""
        return DenseMoeWeights(w13=self.w13.dequantize(dtype), w2=self.w2.dequantize(dtype))


@final
@attrs.frozen(eq=False, kw_only=True)
class Fp8MoeWeights(_ExpertSizes):
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
        _check_expert_shapes("Fp8MoeWeights", self.w13.shape, self.w2.shape)
        require_same_device(
            [("w13", self.w13.gate.codes), ("w2", self.w2.codes), ("w13_input_scale", self.w13_input_scale.value)]
        )

    @property
    def device(self) -> torch.device:
        """Where the weights live."""
        return self.w2.codes.device


@final
@attrs.frozen(eq=False, kw_only=True)
class Fp8ChannelMoeWeights(_ExpertSizes):
    """FP8 E4M3 expert weights with per-channel scales, for activations quantized per token at run time.

    The compressed-tensors ``FP8_DYNAMIC`` scheme: ``w13 [E, 2I, H]`` (gate
    rows first) and ``w2 [E, H, I]``, each row with its own scale; there are
    no input scales, each GEMM input's rows are quantized with their own amax
    (:func:`~moe_core.fp8.dynamic_fp8_scales`).
    """

    w13: Fp8ChannelExpertWeights
    w2: Fp8ChannelExpertWeights

    def __attrs_post_init__(self) -> None:
        for name, weights in (("w13", self.w13), ("w2", self.w2)):
            if not isinstance(weights, Fp8ChannelExpertWeights):
                raise TypeError(f"Fp8ChannelMoeWeights.{name}: expected Fp8ChannelExpertWeights, got {type(weights).__name__}")
        _check_expert_shapes("Fp8ChannelMoeWeights", self.w13.shape, self.w2.shape)
        require_same_device([("w13", self.w13.codes), ("w2", self.w2.codes)])

    @property
    def device(self) -> torch.device:
        """Where the weights live."""
        return self.w2.codes.device

    def dequantize(self, dtype: torch.dtype = torch.float32) -> DenseMoeWeights:
        """The dense weights the codes stand for."""
        return DenseMoeWeights(w13=self.w13.dequantize(dtype), w2=self.w2.dequantize(dtype))


def fp8_block_size_refusal(hidden: int, inter: int) -> str | None:
    """Why block-scaled FP8 cannot hold a layer of hidden size ``hidden`` and intermediate size ``inter`` (both must
    be multiples of 128), or ``None`` where it can."""
    if hidden % FP8_BLOCK or inter % FP8_BLOCK:
        return (
            f"Fp8BlockMoeWeights: expected hidden and intermediate sizes that are multiples of {FP8_BLOCK}, "
            f"got {hidden} and {inter}"
        )
    return None


@final
@attrs.frozen(eq=False, kw_only=True)
class Fp8BlockMoeWeights(_ExpertSizes):
    """FP8 E4M3 expert weights with 128x128 block scales, for activations quantized per token and 128-column group.

    The DeepSeek-V3 / Qwen3 FP8 layout: ``w13 [E, 2I, H]`` (gate rows first)
    and ``w2 [E, H, I]``, one scale per 128x128 block; each GEMM input's
    groups of 128 columns are quantized with their own amax at run time.
    ``H`` and ``I`` must be multiples of 128, so no block straddles the gate
    and up halves and every input group meets one column of blocks.
    """

    w13: Fp8BlockExpertWeights
    w2: Fp8BlockExpertWeights

    def __attrs_post_init__(self) -> None:
        for name, weights in (("w13", self.w13), ("w2", self.w2)):
            if not isinstance(weights, Fp8BlockExpertWeights):
                raise TypeError(f"Fp8BlockMoeWeights.{name}: expected Fp8BlockExpertWeights, got {type(weights).__name__}")
        _check_expert_shapes("Fp8BlockMoeWeights", self.w13.shape, self.w2.shape)
        _, hidden, inter = self.w2.shape
        refusal = fp8_block_size_refusal(hidden, inter)
        if refusal is not None:
            raise ValueError(refusal)
        require_same_device([("w13", self.w13.codes), ("w2", self.w2.codes)])

    @property
    def device(self) -> torch.device:
        """Where the weights live."""
        return self.w2.codes.device

    def dequantize(self, dtype: torch.dtype = torch.float32) -> DenseMoeWeights:
        """The dense weights the codes stand for."""
        return DenseMoeWeights(w13=self.w13.dequantize(dtype), w2=self.w2.dequantize(dtype))
