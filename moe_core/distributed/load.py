"""One rank's expert-parallel layer from a checkpoint: its scheme, its experts, the dispatcher around them."""

from __future__ import annotations

from typing import TypeVar

import torch

from moe_core.checkpoint import MoeCheckpoint
from moe_core.dispatch import StandardDispatchOutput
from moe_core.distributed.layer import ExpertParallelMoe
from moe_core.distributed.protocol import TokenDispatcher

HandleT = TypeVar("HandleT")


def load_expert_parallel(
    checkpoint: MoeCheckpoint,
    layer: int,
    dispatcher: TokenDispatcher[StandardDispatchOutput, HandleT],
    *,
    device: torch.device,
    backend: str | None = None,
    strict: bool = False,
    activation_dtype: torch.dtype | None = None,
) -> ExpertParallelMoe[StandardDispatchOutput, HandleT]:
    """Layer ``layer`` of ``checkpoint`` on this rank, behind ``dispatcher``: call it with this rank's tokens and routing.

    The scheme is built for ``dispatcher.runner_config(checkpoint.runner_config())``
    (this rank's experts, slot rows), so it loads only this rank's experts,
    while static input scales are read for every expert and collapse over the
    whole layer (every rank quantizes a token alike); the backend is chosen
    for that config on ``device`` (``backend`` forces one by name, ``strict``
    forbids degradation) and for the hidden states' ``activation_dtype`` (default:
    the checkpoint's own, as :meth:`MoeCheckpoint.load_layer`). A single-rank caller needs none of this:
    ``checkpoint.load_layer(layer)``.
    """
    if not isinstance(checkpoint, MoeCheckpoint):
        raise TypeError(f"checkpoint: expected a MoeCheckpoint, got {type(checkpoint).__name__}")
    if not isinstance(device, torch.device):
        raise TypeError(f"device: expected a torch.device, got {device!r}")
    whole = checkpoint.runner_config()
    scheme = checkpoint.load_layer(
        layer, device=device, config=dispatcher.runner_config(whole), backend=backend, strict=strict,
        activation_dtype=activation_dtype,
    )
    return ExpertParallelMoe(dispatcher, scheme.apply, config=whole)
