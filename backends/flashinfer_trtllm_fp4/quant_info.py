"""The TRT-LLM-gen FP4 kernel's quant info: exactly what it takes, each scale its own type.

What the kernel computes for one token and expert ``e`` (FlashInfer's test
reference, ``tests/moe/test_trtllm_gen_fused_moe.py`` ``run_moe_dequant``, and
the scalars of ``tests/moe/trtllm_gen_fused_moe_utils.py``
``FP4Moe.prepare_static_weights_for_kernel``), with ``x`` the NVFP4 hidden
states, ``g1`` / ``u1`` the FC1 accumulators of the gate and up rows:

``h = silu(g1 * output1_scale_gate_scalar[e]) * (u1 * output1_scale_scalar[e])``,
then ``h`` quantized to NVFP4 (it is already multiplied by the second GEMM's
input global scale), then ``y = acc2 * output2_scale_scalar[e]``.

So the gate and up halves carry their own scalar: differing w1/w3 global
scales stay exact, with no requantization. FC1 rows are ``[up; gate]``
(FlashInfer's ``reorder_rows_for_gated_act_gemm`` docstring: "rows
``[0, M // 2)`` are X1 (the linear/up half)"; the reference takes
``silu(x2) * x1``), the reverse of our canonical ``[gate; up]``.
"""

from __future__ import annotations

from typing import final

import attrs
import torch

from moe_core import (
    ExpertQuantizeGlobalScales,
    LinearBlockScales,
    Nvfp4MoeWeights,
    QuantizeGlobalScale,
    SwizzledBlockScales,
)
from moe_core._checks import require_dtype, require_same_device, require_tensor
from moe_core.backends._flashinfer import ExpertKernelScalars, require_row_alignment
from moe_core.backends.flashinfer_trtllm_fp4.kernel import fc1_row_order, fc2_row_order

def _as_kernel_value(scales: ExpertQuantizeGlobalScales | QuantizeGlobalScale) -> torch.Tensor:
    return scales.value.to(torch.float32)


@final
@attrs.frozen(eq=False)
class Fc1GateScalars(ExpertKernelScalars):
    """``output1_scale_gate_scalar``: dequantizes the gate accumulator, ``1 / (w1_global * hidden_global)``."""

    @classmethod
    def from_global_scales(
        cls, *, gate: ExpertQuantizeGlobalScales, hidden_states: QuantizeGlobalScale
    ) -> Fc1GateScalars:
        """From the gate half's per-expert scales and the scalar that quantizes the hidden states."""
        return cls._of(1.0 / (_as_kernel_value(gate) * _as_kernel_value(hidden_states)))


@final
@attrs.frozen(eq=False)
class Fc1UpScalars(ExpertKernelScalars):
    """``output1_scale_scalar``: dequantizes the up accumulator and quantizes the activation,
    ``activation_global / (w3_global * hidden_global)``."""

    @classmethod
    def from_global_scales(
        cls,
        *,
        up: ExpertQuantizeGlobalScales,
        hidden_states: QuantizeGlobalScale,
        activation: QuantizeGlobalScale,
    ) -> Fc1UpScalars:
        """From the up half's per-expert scales and the two GEMMs' scalar input scales."""
        return cls._of(_as_kernel_value(activation) / (_as_kernel_value(up) * _as_kernel_value(hidden_states)))


@final
@attrs.frozen(eq=False)
class Fc2OutputScalars(ExpertKernelScalars):
    """``output2_scale_scalar``: dequantizes the second GEMM, ``1 / (activation_global * w2_global)``."""

    @classmethod
    def from_global_scales(
        cls, *, w2: ExpertQuantizeGlobalScales, activation: QuantizeGlobalScale
    ) -> Fc2OutputScalars:
        """From w2's per-expert scales and the scalar that quantized the activation."""
        return cls._of(1.0 / (_as_kernel_value(activation) * _as_kernel_value(w2)))


def _check_packed(name: str, tensor: torch.Tensor, shape: tuple[int, int, int]) -> None:
    require_tensor(name, tensor)
    require_dtype(name, tensor, (torch.uint8,))
    if tuple(tensor.shape) != shape:
        raise ValueError(f"{name}: expected shape {shape}, got {tuple(tensor.shape)}")


@final
@attrs.frozen(eq=False, kw_only=True)
class TrtllmFp4Weights:
    """NVFP4 W4A4 experts in the TRT-LLM-gen layout, built once by :meth:`from_nvfp4`.

    FC1 rows are ``[up; gate]``, interleaved for the fused gated activation
    and shuffled for the epilogue; FC2 rows are shuffled; both E4M3 block
    scales are shuffled like their rows, then 128x4-swizzled.
    """

    gemm1_weights: torch.Tensor
    """uint8 ``[E, 2 * I, H / 2]``."""
    gemm1_scales: SwizzledBlockScales
    """E4M3 ``[E, 2 * I, H / 16]`` of the shuffled rows."""
    gemm2_weights: torch.Tensor
    """uint8 ``[E, H, I / 2]``."""
    gemm2_scales: SwizzledBlockScales
    """E4M3 ``[E, H, I / 16]`` of the shuffled rows."""
    output1_scale_gate_scalar: Fc1GateScalars
    output1_scale_scalar: Fc1UpScalars
    output2_scale_scalar: Fc2OutputScalars
    hidden_states_scale: QuantizeGlobalScale
    """The one ``[1]`` scalar the runner quantizes the hidden states with."""

    def __attrs_post_init__(self) -> None:
        experts, rows, half_hidden = (int(d) for d in self.gemm1_weights.shape)
        hidden, inter = 2 * half_hidden, rows // 2
        _check_packed("TrtllmFp4Weights.gemm1_weights", self.gemm1_weights, (experts, 2 * inter, hidden // 2))
        _check_packed("TrtllmFp4Weights.gemm2_weights", self.gemm2_weights, (experts, hidden, inter // 2))
        require_row_alignment("TrtllmFp4Weights", intermediate_size=inter, hidden_size=hidden)
        for name, scales, shape in (
            ("gemm1_scales", self.gemm1_scales, (experts, 2 * inter, hidden // 16)),
            ("gemm2_scales", self.gemm2_scales, (experts, hidden, inter // 16)),
        ):
            if not isinstance(scales, SwizzledBlockScales):
                raise TypeError(f"TrtllmFp4Weights.{name}: expected SwizzledBlockScales, got {type(scales).__name__}")
            if scales.shape != shape:
                raise ValueError(f"TrtllmFp4Weights.{name}: expected shape {shape}, got {scales.shape}")
        for name, kind in (
            ("output1_scale_gate_scalar", Fc1GateScalars),
            ("output1_scale_scalar", Fc1UpScalars),
            ("output2_scale_scalar", Fc2OutputScalars),
        ):
            scalars = getattr(self, name)
            if not isinstance(scalars, kind):
                raise TypeError(f"TrtllmFp4Weights.{name}: expected {kind.__name__}, got {type(scalars).__name__}")
            if scalars.num_experts != experts:
                raise ValueError(f"TrtllmFp4Weights.{name}: expected {experts} experts, got {scalars.num_experts}")
        if not isinstance(self.hidden_states_scale, QuantizeGlobalScale):
            raise TypeError(
                "TrtllmFp4Weights.hidden_states_scale: expected QuantizeGlobalScale, "
                f"got {type(self.hidden_states_scale).__name__}"
            )
        require_same_device(
            [
                ("gemm1_weights", self.gemm1_weights),
                ("gemm2_weights", self.gemm2_weights),
                ("gemm1_scales", self.gemm1_scales._tiles),
                ("output1_scale_scalar", self.output1_scale_scalar.value),
                ("hidden_states_scale", self.hidden_states_scale.value),
            ]
        )

    @classmethod
    def from_nvfp4(cls, weights: Nvfp4MoeWeights) -> TrtllmFp4Weights:
        """The once-after-loading conversion: ``[up; gate]``, row interleave and shuffle, swizzled scales, scalars."""
        gate, up, w2 = weights.w13.gate, weights.w13.up, weights.w2
        _, inter, hidden = gate.shape
        require_row_alignment("TRT-LLM-gen FP4 MoE", intermediate_size=inter, hidden_size=hidden)
        device = weights.device
        fc1_rows = fc1_row_order(2 * inter).to(device)
        fc2_rows = fc2_row_order(hidden).to(device)
        fc1_codes = torch.cat((up.packed, gate.packed), dim=1)[:, fc1_rows]
        fc1_scales = torch.cat((up.block_scales.data, gate.block_scales.data), dim=1)[:, fc1_rows]
        hidden_scale, activation_scale = weights.w13_input_scale, weights.w2_input_scale
        return cls(
            gemm1_weights=fc1_codes.contiguous(),
            gemm1_scales=LinearBlockScales.from_checkpoint(fc1_scales.contiguous()).swizzle(),
            gemm2_weights=w2.packed[:, fc2_rows].contiguous(),
            gemm2_scales=LinearBlockScales.from_checkpoint(w2.block_scales.data[:, fc2_rows].contiguous()).swizzle(),
            output1_scale_gate_scalar=Fc1GateScalars.from_global_scales(
                gate=gate.global_scales, hidden_states=hidden_scale
            ),
            output1_scale_scalar=Fc1UpScalars.from_global_scales(
                up=up.global_scales, hidden_states=hidden_scale, activation=activation_scale
            ),
            output2_scale_scalar=Fc2OutputScalars.from_global_scales(w2=w2.global_scales, activation=activation_scale),
            hidden_states_scale=hidden_scale,
        )

    @property
    def num_experts(self) -> int:
        """Experts held (this rank's local experts)."""
        return int(self.gemm1_weights.shape[0])

    @property
    def hidden_size(self) -> int:
        """H."""
        return 2 * int(self.gemm1_weights.shape[2])

    @property
    def intermediate_size(self) -> int:
        """I."""
        return int(self.gemm1_weights.shape[1]) // 2

    @property
    def device(self) -> torch.device:
        """Where the tensors live."""
        return self.gemm1_weights.device
