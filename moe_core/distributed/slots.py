"""One row per (token, slot): what every dispatcher hands the runner, and the combine's fixed-order sum.

The reference runner sums a token's experts in expert order, in float32,
and rounds the sum to the activation dtype. Under expert parallelism those
experts run on different ranks: partial sums per rank would be rounded
before they meet and added in another grouping (float addition is not
associative), so they cannot give the single-rank bits. So the runner never
sums: each row a dispatcher delivers is one ``(token, slot)`` pair
(``top_k = 1``, its global expert id and top-k weight; the runner applies
weight and ``routed_scaling_factor`` and returns the slot's output in the
activation dtype), and :func:`sum_slots` adds a token's slots in slot order,
in float32. The sum depends on nothing but the per-slot outputs, which are
the same whichever rank computes them (the dispatchers say why), so every
dispatcher and world size gives the bits of the world-size-1 layer
(:class:`~moe_core.distributed.local.LocalDispatcher`). That layer differs
from a runner's own ``top_k``-slot sum by the rounding of each slot to the
activation dtype before the sum: vLLM's fused-MoE arithmetic (per-slot bf16
outputs, then ``moe_sum``); Megatron-Core's all-to-all dispatcher also moves
one copy per (token, expert). bf16 slots mostly add exactly in float32, so
the order matters most for float32 activations.
"""

from __future__ import annotations

import attrs
import torch

from moe_core.config import MoeRunnerConfig
from moe_core.dispatch import StandardDispatchOutput, TopKOutput


def slot_config(config: MoeRunnerConfig) -> MoeRunnerConfig:
    """``config`` for runs over slot rows: ``top_k = 1`` and ``slot_rows``, all else as given (experts, sizes,
    scaling factor)."""
    if not isinstance(config, MoeRunnerConfig):
        raise TypeError(f"config: expected a MoeRunnerConfig, got {type(config).__name__}")
    return attrs.evolve(config, top_k=1, slot_rows=True)


def slot_rows(
    hidden_states: torch.Tensor, expert_ids: torch.Tensor, weights: torch.Tensor, num_experts: int
) -> StandardDispatchOutput:
    """Slot rows: ``hidden_states [R, H]`` with each row's global expert id (int32 ``[R]``) and weight (float32 ``[R]``).

    The values were checked (or not) where the router made them; these checks read metadata only.
    """
    topk = TopKOutput(expert_ids.reshape(-1, 1), weights.reshape(-1, 1), num_experts=num_experts, check_values=False)
    return StandardDispatchOutput(hidden_states, topk)


def sum_slots(slot_outputs: torch.Tensor, top_k: int) -> torch.Tensor:
    """``[T, H]``: each token's ``top_k`` consecutive rows of ``slot_outputs [T * top_k, H]`` added in slot order.

    Float32 accumulation, one elementwise add per slot (never a reduction
    kernel, whose order may change with the shape), cast back to the
    outputs' dtype.
    """
    if slot_outputs.dim() != 2 or slot_outputs.shape[0] % top_k:
        raise ValueError(
            f"slot_outputs: expected [num_tokens * top_k, hidden_size] with top_k={top_k}, got {tuple(slot_outputs.shape)}"
        )
    slots = slot_outputs.reshape(-1, top_k, slot_outputs.shape[1])
    total = slots[:, 0].to(torch.float32, copy=True)
    for slot in range(1, top_k):
        total += slots[:, slot]
    return total.to(slot_outputs.dtype)


def check_rows(out: torch.Tensor, rows: int) -> None:
    """Raise unless the runner's output ``out`` is ``[rows, H]``: one row per slot row dispatched."""
    if not isinstance(out, torch.Tensor) or out.dim() != 2 or out.shape[0] != rows:
        shape = tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
        raise ValueError(f"out: expected the runner's output [{rows}, hidden_size], one row per dispatched row, got {shape}")
