"""Unquantized MoE: bf16, fp16 or fp32 expert weights (``experts.{e}.{proj}.weight``).

The weights are kept in the checkpoint's dtype (``dtype``, bf16 by default,
must match it: a silent cast would hide a checkpoint of another precision).
FP8 per-tensor checkpoints are not taken yet: no backend offers an FP8 quant
info (the Triton backend's issue adds one).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch

from moe_core import DENSE, DenseMoeWeights, FormatRoute, MoeRunnerConfig
from moe_core._checks import FLOAT_DTYPES
from moe_core.expert_params import ParamLayout, ParamSpec
from moe_core.scheme import ExpertScheme, SchemeSpec, backends_for

NAME = "unquantized"
PREFERENCE = ("reference-dense",)
"""Backend names in preference order; registered backends not named here follow."""


class UnquantizedMoE(ExpertScheme[DenseMoeWeights]):
    """One MoE layer of an unquantized checkpoint."""

    def __init__(
        self,
        config: MoeRunnerConfig,
        device: torch.device = torch.device("cpu"),
        *,
        dtype: torch.dtype = torch.bfloat16,
        backends: Sequence[FormatRoute[DenseMoeWeights]] | None = None,
        backend: FormatRoute[DenseMoeWeights] | None = None,
    ) -> None:
        """Create the layer's ``dtype`` parameters on ``device``; ``backend`` forces a backend fed from dense weights."""
        if dtype not in FLOAT_DTYPES:
            raise TypeError(f"dtype: expected one of {FLOAT_DTYPES}, got {dtype!r}")
        specs = (ParamSpec("weight", dtype, ParamLayout.MATRIX),)
        super().__init__(NAME, DENSE, specs, config, device, preference=PREFERENCE, backends=backends, backend=backend)

    def canonical_weights(self) -> DenseMoeWeights:
        """The dense weights, gate rows then up rows in ``w13``."""
        return DenseMoeWeights(w13=self.params.gate_up_fused("weight"), w2=self.params.down("weight"))


def unsupported_reason(quantization_config: Mapping[str, object] | None) -> str | None:
    """Why a checkpoint is not unquantized (None: it has no ``quantization_config``)."""
    if quantization_config is None:
        return None
    return f"the checkpoint is quantized (quant_method {quantization_config.get('quant_method')!r})"


def _for_layer(config: MoeRunnerConfig, device: torch.device, dtype: torch.dtype) -> UnquantizedMoE:
    return UnquantizedMoE(config, device, dtype=dtype)


def _choices() -> Sequence[FormatRoute[DenseMoeWeights]]:
    return backends_for(DENSE, PREFERENCE)


SCHEME = SchemeSpec(NAME, DENSE, unsupported_reason, _for_layer, _choices)
"""The scheme as the checkpoint loader and ``moe-core`` see it."""
