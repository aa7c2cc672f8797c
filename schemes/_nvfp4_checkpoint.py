"""What the two NVFP4 checkpoint schemes share: the quantization-config check and the canonical weights.

compressed-tensors and ModelOpt store the same numbers (packed E2M1 codes, one
E4M3 scale per 16 elements, one FP32 global scale per projection, one static
FP32 input scale per projection) under other names and with the global
scales in opposite conventions; each scheme turns its names and convention
into these arguments.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import torch

from moe_core import (
    ExpertQuantizeGlobalScales,
    ExpertScalePolicy,
    LinearBlockScales,
    Nvfp4ExpertWeights,
    Nvfp4GateUpWeights,
    Nvfp4MoeWeights,
    QuantizeGlobalScale,
)
from moe_core.expert_params import ExpertParams

WeightScales = Callable[[torch.Tensor], ExpertQuantizeGlobalScales]
"""Per-expert weight global scales ``[E]`` from a checkpoint tensor of the scheme's convention."""
InputScale = Callable[[torch.Tensor, ExpertScalePolicy], QuantizeGlobalScale]
"""The scalar input scale from the checkpoint's per-expert (per-shard) values, under a policy."""


def _experts(packed: torch.Tensor, scales: torch.Tensor, global_scales: ExpertQuantizeGlobalScales) -> Nvfp4ExpertWeights:
    return Nvfp4ExpertWeights(
        packed.contiguous(), LinearBlockScales.from_checkpoint(scales.contiguous()), global_scales
    )


def nvfp4_moe_weights(
    params: ExpertParams,
    *,
    packed: str,
    block_scales: str,
    weight_scale: str,
    input_scale: str,
    weight_scales: WeightScales,
    input_scales: InputScale,
    policy: ExpertScalePolicy,
) -> Nvfp4MoeWeights:
    """The canonical weights from loaded NVFP4 parameters named ``packed``, ``block_scales``, ...

    Gate and up keep their own weight global scales (never ``[:, 0]`` of the
    pair); the input scales of w1/w3 (one GEMM input) and of w2, per expert
    in the checkpoint, become the one scalar each GEMM takes under ``policy``.
    """
    gate_up_packed, gate_up_scales = params.gate_up(packed), params.gate_up(block_scales)
    gate_up_global = params.gate_up(weight_scale)
    w13 = Nvfp4GateUpWeights(
        gate=_experts(gate_up_packed[:, 0], gate_up_scales[:, 0], weight_scales(gate_up_global[:, 0].contiguous())),
        up=_experts(gate_up_packed[:, 1], gate_up_scales[:, 1], weight_scales(gate_up_global[:, 1].contiguous())),
    )
    w2 = _experts(params.down(packed), params.down(block_scales), weight_scales(params.down(weight_scale)))
    return Nvfp4MoeWeights(
        w13=w13,
        w2=w2,
        w13_input_scale=input_scales(params.gate_up(input_scale), policy),
        w2_input_scale=input_scales(params.down(input_scale), policy),
    )


def nvfp4_group_problem(group: Mapping[str, object]) -> str | None:
    """Why a quantization config group is not NVFP4 W4A4 (4-bit float, groups of 16, both weights and inputs)."""
    for role in ("weights", "input_activations"):
        args = group.get(role)
        if not isinstance(args, Mapping):
            return f"{role}: not quantized (NVFP4 W4A4 quantizes both weights and input activations)"
        found = (args.get("num_bits"), args.get("type"), args.get("group_size"))
        if found != (4, "float", 16):
            return f"{role}: num_bits/type/group_size are {found}, NVFP4 is (4, 'float', 16)"
    return None
