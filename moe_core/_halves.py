"""Gate and up halves of ``w13`` joined on their rows, without a copy where they already share one buffer."""

from __future__ import annotations

import torch


def joined_halves(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """``gate`` and ``up`` ``[E, rows, cols]`` stacked on their rows, ``[E, 2 * rows, cols]``: a view where they are
    the two halves of one buffer laid out ``[E, 2, rows, cols]`` (a scheme's gate/up parameter), else a copy.

    The view keeps the layer on the parameter's memory: one copy of the
    weights, and a refit written into the parameter after binding moves the
    counter the bound layer checks (a copy would run the old values).
    """
    experts, rows, cols = (int(d) for d in gate.shape)
    adjacent = (
        up.shape == gate.shape
        and up.dtype == gate.dtype
        and up.device == gate.device
        and gate.stride() == up.stride() == (2 * rows * cols, cols, 1)
        and up.untyped_storage().data_ptr() == gate.untyped_storage().data_ptr()
        and up.storage_offset() == gate.storage_offset() + rows * cols
    )
    if adjacent:
        return gate.as_strided((experts, 2 * rows, cols), (2 * rows * cols, cols, 1), gate.storage_offset())
    return torch.cat((gate, up), dim=1)
