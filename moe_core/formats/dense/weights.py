"""The dense format's weights: unquantized fp32/bf16/fp16 experts, optionally with per-expert biases."""

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
    require_ndim,
    require_same_device,
    require_shape,
    require_tensor,
)
from moe_core.formats._experts import TensorExperts, check_expert_shapes, shape3


class GateUpLayout(enum.Enum):
    """How a checkpoint orders the gate and up rows of its fused first GEMM; moe-core's ``w13`` is always
    :attr:`CONCATENATED`."""

    CONCATENATED = "concatenated"
    """All gate rows, then all up rows (most checkpoints)."""
    INTERLEAVED = "interleaved"
    """Gate and up rows alternate, gate first (gpt-oss)."""

    def to_concatenated(self, rows: torch.Tensor, dim: int) -> torch.Tensor:
        """``rows`` (``2I`` long along ``dim``) reordered to ``[gate | up]``."""
        if self is GateUpLayout.CONCATENATED:
            return rows
        if rows.shape[dim] % 2:
            raise ValueError(f"rows: expected an even count of interleaved gate/up rows, got {rows.shape[dim]}")
        moved = rows.movedim(dim, 0)
        return torch.cat((moved[0::2], moved[1::2])).movedim(0, dim)


@final
@attrs.frozen(eq=False, kw_only=True)
class ExpertBiases:
    """Per-expert biases added after each GEMM (gpt-oss), in the weights' dtype, finite (checked where values exist)."""

    w13: torch.Tensor
    """``[E, rows of w13]``: gate then up, like ``w13``."""
    w2: torch.Tensor
    """``[E, H]``."""

    def __attrs_post_init__(self) -> None:
        for field, tensor in (("w13", self.w13), ("w2", self.w2)):
            name = f"ExpertBiases.{field}"
            require_tensor(name, tensor)
            require_dtype(name, tensor, FLOAT_DTYPES)
            require_ndim(name, tensor, 2, "[num_experts, out_features]")
            require_finite(name, tensor)
            record_built(self, field, tensor)


@final
@attrs.frozen(eq=False, kw_only=True)
class DenseMoeWeights(TensorExperts):
    """Unquantized expert weights in fp32, bf16 or fp16, finite (checked where values exist).

    ``w13`` has ``2I`` rows (gate then up) for a gated activation, ``I`` for a
    non-gated one (ReLU^2); the runner checks that against its config.
    """

    w13: torch.Tensor
    """``[E, 2 * I, H]``, gate rows then up rows; or ``[E, I, H]`` for a non-gated activation."""
    w2: torch.Tensor
    """``[E, H, I]``."""
    biases: ExpertBiases | None = None
    """Added after each GEMM when present; the config's ``expert_biases`` must say so."""

    def __attrs_post_init__(self) -> None:
        for field, tensor in (("w13", self.w13), ("w2", self.w2)):
            name = f"DenseMoeWeights.{field}"
            require_tensor(name, tensor)
            require_dtype(name, tensor, FLOAT_DTYPES)
            require_ndim(name, tensor, 3, "[num_experts, out_features, in_features]")
            record_built(self, field, tensor)
            require_finite(name, tensor)
        if self.w13.dtype != self.w2.dtype:
            raise TypeError(f"DenseMoeWeights.w2: expected dtype {self.w13.dtype} like w13, got {self.w2.dtype}")
        experts, rows, hidden = shape3(self.w13)
        if shape3(self.w2) != (experts, hidden, rows):  # not the non-gated [E, I, H] / [E, H, I]: gated, checked so
            check_expert_shapes("DenseMoeWeights", shape3(self.w13), shape3(self.w2))
        tensors = [("w13", self.w13), ("w2", self.w2)]
        if self.biases is not None:
            if not isinstance(self.biases, ExpertBiases):
                raise TypeError(f"DenseMoeWeights.biases: expected ExpertBiases, got {type(self.biases).__name__}")
            for name, tensor, shape in (("w13", self.biases.w13, (experts, rows)), ("w2", self.biases.w2, (experts, hidden))):
                label = f"DenseMoeWeights.biases.{name}"
                require_dtype(label, tensor, (self.w13.dtype,))
                require_shape(label, tensor, shape, f"[num_experts, out_features of {name}]")
                tensors.append((f"biases.{name}", tensor))
        require_same_device(tensors)

    @property
    def gated(self) -> bool:
        """True when ``w13`` holds gate and up halves (``2I`` rows), False for ``I`` rows (a non-gated activation)."""
        return int(self.w13.shape[1]) != int(self.w2.shape[2])

    @classmethod
    def from_checkpoint(
        cls,
        *,
        w13: torch.Tensor,
        w2: torch.Tensor,
        layout: GateUpLayout,
        biases: ExpertBiases | None = None,
    ) -> DenseMoeWeights:
        """Weights whose fused gate/up rows (and bias) are in the checkpoint's ``layout``, reordered to ``[gate | up]``."""
        if not isinstance(layout, GateUpLayout):
            raise TypeError(f"layout: expected a GateUpLayout, got {layout!r}")
        if biases is not None:
            biases = ExpertBiases(w13=layout.to_concatenated(biases.w13, 1), w2=biases.w2)
        return cls(w13=layout.to_concatenated(w13, 1), w2=w2, biases=biases)
