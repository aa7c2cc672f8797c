"""The Triton backend's quant infos, one per weight format, each with its conversion from canonical weights.

W4A16 is not W4A4: :class:`TritonNvfp4W4A16Weights` runs NVFP4 weights with
bf16/fp16 activations (the input scales of the checkpoint are not used), so
it is its own type and is converted from the ``NVFP4_W4A16`` format, never
handed where a W4A4 quant info belongs.
"""

from __future__ import annotations

from typing import final

import attrs
import torch

from moe_core import (
    DenseMoeWeights,
    ExpertDequantizeGlobalScales,
    LinearBlockScales,
    Nvfp4ExpertWeights,
    Nvfp4MoeWeights,
)
from moe_core._checks import require_dtype, require_ndim, require_same_device, require_tensor

KERNEL_DTYPES = (torch.bfloat16, torch.float16)
"""Weight dtypes the dense kernels multiply."""


def _expert_dims(w13: torch.Tensor, w2: torch.Tensor, cols_per_element: int) -> tuple[int, int, int]:
    experts, two_i, packed_h = (int(d) for d in w13.shape)
    hidden, inter = packed_h * cols_per_element, two_i // 2
    if two_i % 2 or tuple(w2.shape) != (experts, hidden, inter // cols_per_element):
        raise ValueError(f"w2: expected shape {(experts, hidden, inter // cols_per_element)} to match w13 {tuple(w13.shape)}, got {tuple(w2.shape)}")
    return experts, hidden, inter


@final
@attrs.frozen(eq=False, kw_only=True)
class TritonDenseWeights:
    """bf16 or fp16 expert weights, contiguous ``w13 [E, 2I, H]`` (gate rows first) and ``w2 [E, H, I]``."""

    w13: torch.Tensor
    w2: torch.Tensor

    def __attrs_post_init__(self) -> None:
        for name, tensor in (("w13", self.w13), ("w2", self.w2)):
            require_tensor(f"TritonDenseWeights.{name}", tensor)
            require_dtype(f"TritonDenseWeights.{name}", tensor, KERNEL_DTYPES)
            require_ndim(f"TritonDenseWeights.{name}", tensor, 3, "[num_experts, out_features, in_features]")
            if not tensor.is_contiguous():
                raise ValueError(f"TritonDenseWeights.{name}: expected a contiguous tensor")
        if self.w13.dtype != self.w2.dtype:
            raise TypeError(f"TritonDenseWeights.w2: expected dtype {self.w13.dtype} like w13, got {self.w2.dtype}")
        _expert_dims(self.w13, self.w2, 1)
        require_same_device([("w13", self.w13), ("w2", self.w2)])

    @classmethod
    def from_dense(cls, weights: DenseMoeWeights) -> TritonDenseWeights:
        """The canonical dense weights in the kernels' layout; float32 weights are rounded to bf16."""
        dtype = weights.w13.dtype if weights.w13.dtype in KERNEL_DTYPES else torch.bfloat16
        return cls(w13=weights.w13.to(dtype).contiguous(), w2=weights.w2.to(dtype).contiguous())

    @property
    def num_experts(self) -> int:
        """Experts held."""
        return int(self.w13.shape[0])

    @property
    def hidden_size(self) -> int:
        """H."""
        return int(self.w13.shape[2])

    @property
    def intermediate_size(self) -> int:
        """I."""
        return int(self.w2.shape[2])

    @property
    def device(self) -> torch.device:
        """Where the weights live."""
        return self.w13.device


def _packed(half: Nvfp4ExpertWeights) -> tuple[torch.Tensor, torch.Tensor]:
    return half.packed.contiguous(), half.block_scales.data.contiguous()


@final
@attrs.frozen(eq=False, kw_only=True)
class TritonNvfp4W4A16Weights:
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

    @classmethod
    def from_nvfp4(cls, weights: Nvfp4MoeWeights) -> TritonNvfp4W4A16Weights:
        """The canonical NVFP4 weights for W4A16: the same codes and block scales; the input scales are not used."""
        gate_packed, gate_block = _packed(weights.w13.gate)
        up_packed, up_block = _packed(weights.w13.up)
        w2_packed, w2_block = _packed(weights.w2)
        return cls(
            w13_packed=torch.cat((gate_packed, up_packed), dim=1),
            w13_block_scales=LinearBlockScales.from_checkpoint(torch.cat((gate_block, up_block), dim=1)),
            gate_scales=ExpertDequantizeGlobalScales.from_quantize(weights.w13.gate.global_scales),
            up_scales=ExpertDequantizeGlobalScales.from_quantize(weights.w13.up.global_scales),
            w2_packed=w2_packed,
            w2_block_scales=LinearBlockScales.from_checkpoint(w2_block),
            w2_scales=ExpertDequantizeGlobalScales.from_quantize(weights.w2.global_scales),
        )

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
