"""The MXFP4 format's weights (gpt-oss): E2M1 codes with E8M0 block scales, optionally per-expert biases."""

from __future__ import annotations

from typing import final

import attrs
import torch

from moe_core._checks import require_same_device
from moe_core.formats._experts import ExpertSizes, check_expert_shapes
from moe_core.formats.dense.weights import DenseMoeWeights, ExpertBiases, GateUpLayout
from moe_core.mxfp4 import Mxfp4ExpertWeights


def _concatenated_rows(layout: GateUpLayout, rows: int) -> torch.Tensor:
    """The row order that takes ``rows`` fused gate/up rows in ``layout`` to ``[gate | up]``."""
    if not isinstance(layout, GateUpLayout):
        raise TypeError(f"layout: expected a GateUpLayout, got {layout!r}")
    return layout.to_concatenated(torch.arange(rows), 0)


@final
@attrs.frozen(eq=False, kw_only=True)
class Mxfp4MoeWeights(ExpertSizes):
    """MXFP4 expert weights run with 16-bit activations (W4A16), with the per-expert biases gpt-oss adds.

    ``w13 [E, 2I, H]`` is gate rows then up rows (a checkpoint's interleaved
    rows are reordered at load, :meth:`from_checkpoint`), ``w2 [E, H, I]``;
    every row keeps its own E8M0 scales, so the fused halves are exact.
    """

    w13: Mxfp4ExpertWeights
    w2: Mxfp4ExpertWeights
    biases: ExpertBiases | None = None
    """Added after each GEMM when present; the config's ``expert_biases`` must say so."""

    def __attrs_post_init__(self) -> None:
        for name, weights in (("w13", self.w13), ("w2", self.w2)):
            if not isinstance(weights, Mxfp4ExpertWeights):
                raise TypeError(f"Mxfp4MoeWeights.{name}: expected Mxfp4ExpertWeights, got {type(weights).__name__}")
        check_expert_shapes("Mxfp4MoeWeights", self.w13.shape, self.w2.shape)
        tensors = [("w13", self.w13.packed), ("w2", self.w2.packed)]
        if self.biases is not None:
            if not isinstance(self.biases, ExpertBiases):
                raise TypeError(f"Mxfp4MoeWeights.biases: expected ExpertBiases, got {type(self.biases).__name__}")
            experts, rows, hidden = self.w13.shape
            for name, tensor, shape in (("w13", self.biases.w13, (experts, rows)), ("w2", self.biases.w2, (experts, hidden))):
                if tuple(tensor.shape) != shape:
                    raise ValueError(f"Mxfp4MoeWeights.biases.{name}: expected shape {shape}, got {tuple(tensor.shape)}")
                tensors.append((f"biases.{name}", tensor))
        require_same_device(tensors)

    @property
    def device(self) -> torch.device:
        """Where the weights live."""
        return self.w2.packed.device

    @classmethod
    def from_checkpoint(
        cls,
        *,
        w13: Mxfp4ExpertWeights,
        w2: Mxfp4ExpertWeights,
        layout: GateUpLayout,
        biases: ExpertBiases | None = None,
    ) -> Mxfp4MoeWeights:
        """Weights whose fused gate/up rows (codes, scales and bias) are in the checkpoint's ``layout``, reordered to
        ``[gate | up]`` (a permutation of whole rows: exact)."""
        order = _concatenated_rows(layout, w13.shape[1])
        if biases is not None:
            biases = ExpertBiases(w13=layout.to_concatenated(biases.w13, 1), w2=biases.w2)
        return cls(w13=w13.rows(order), w2=w2, biases=biases)

    def dequantized_bf16(self) -> DenseMoeWeights:
        """The weights in bf16 (exact: an E2M1 value times a power of two below 2**125 is a bf16), for the MXFP4 -> dense
        degradation."""
        return self.dequantize(torch.bfloat16)

    def dequantize(self, dtype: torch.dtype = torch.float32) -> DenseMoeWeights:
        """The dense weights (and biases) the codes stand for."""
        biases = None
        if self.biases is not None:
            biases = ExpertBiases(w13=self.biases.w13.to(dtype), w2=self.biases.w2.to(dtype))
        return DenseMoeWeights(w13=self.w13.dequantize(dtype), w2=self.w2.dequantize(dtype), biases=biases)
