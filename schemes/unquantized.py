"""Unquantized MoE: bf16, fp16 or fp32 expert weights (``experts.{e}.{proj}.weight``), and their biases
(``bias``) where the layer has them (gpt-oss's, stacked as transformers saves them).

The weights are kept in the checkpoint's dtype (``dtype``, bf16 by default,
must match it: a silent cast would hide a checkpoint of another precision).
FP8 checkpoints are not taken yet (no FP8 checkpoint scheme: the formats and
backends exist).
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from moe_core import DENSE, DenseMoeWeights, FormatRoute, MoeRunnerConfig
from moe_core._checks import FLOAT_DTYPES
from moe_core.expert_params import BIAS, ParamLayout, ParamSpec
from moe_core.formats.dense import ExpertBiases
from moe_core.scheme import ExpertScheme, SchemeOptions, SchemeSpec

NAME = "unquantized"


class UnquantizedMoE(ExpertScheme[DenseMoeWeights]):
    """One MoE layer of an unquantized checkpoint."""

    def __init__(
        self,
        config: MoeRunnerConfig,
        device: torch.device = torch.device("cpu"),
        *,
        dtype: torch.dtype = torch.bfloat16,
        backend: FormatRoute[DenseMoeWeights] | str | None = None,
        strict: bool = False,
        activation_dtype: torch.dtype = torch.bfloat16,
    ) -> None:
        """Create the layer's ``dtype`` parameters on ``device``; ``backend`` forces a backend fed from dense weights
        (a route, or a name)."""
        if dtype not in FLOAT_DTYPES:
            raise TypeError(f"dtype: expected one of {FLOAT_DTYPES}, got {dtype!r}")
        specs = [ParamSpec("weight", dtype, ParamLayout.MATRIX)]
        if config.expert_biases:
            specs.append(ParamSpec("bias", dtype, BIAS))
        super().__init__(NAME, DENSE, specs, config, device, backend=backend, strict=strict, activation_dtype=activation_dtype)

    def canonical_weights(self) -> DenseMoeWeights:
        """The dense weights, gate rows then up rows in ``w13``, and their biases where the layer has them."""
        biases = None
        if self.config.expert_biases:
            biases = ExpertBiases(w13=self.params.gate_up_fused("bias"), w2=self.params.down("bias"))
        return DenseMoeWeights(w13=self.params.gate_up_fused("weight"), w2=self.params.down("weight"), biases=biases)


def unsupported_reason(quantization_config: Mapping[str, object] | None) -> str | None:
    """Why a checkpoint is not unquantized (None: it has no ``quantization_config``)."""
    if quantization_config is None:
        return None
    return f"the checkpoint is quantized (quant_method {quantization_config.get('quant_method')!r})"


def _for_layer(config: MoeRunnerConfig, device: torch.device, dtype: torch.dtype, options: SchemeOptions) -> UnquantizedMoE:
    return UnquantizedMoE(
        config, device, dtype=dtype, backend=options.backend, strict=options.strict, activation_dtype=options.activation_dtype
    )


SCHEME = SchemeSpec(NAME, DENSE, unsupported_reason, _for_layer)
"""The scheme as the checkpoint loader and ``moe-core`` see it."""
