"""gpt-oss MXFP4 MoE (``quant_method: mxfp4``), as OpenAI publishes gpt-oss-20b and gpt-oss-120b.

The checkpoint stacks each projection over the experts:
``experts.gate_up_proj_blocks`` (uint8 ``[E, 2I, H / 32, 16]``, two E2M1
codes a byte, low nibble first), ``experts.gate_up_proj_scales`` (uint8
E8M0 ``[E, 2I, H / 32]``), ``experts.gate_up_proj_bias`` (``[E, 2I]``) and
the same for ``down_proj`` (``[E, H, I / 32, 16]``, ``[E, H, I / 32]``,
``[E, H]``); gate and up rows are interleaved. The checkpoint loader hands
them over one expert and one shard at a time, gate and up already apart
(:attr:`~moe_core.checkpoint.ArchitectureNames.fused_experts`), as
``blocks``, ``scales`` and ``bias``. Nothing is requantized: the canonical
:class:`~moe_core.Mxfp4MoeWeights` hold the checkpoint's codes and scales.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from moe_core import MXFP4, FormatRoute, MoeRunnerConfig, Mxfp4ExpertWeights, Mxfp4MoeWeights
from moe_core._checks import FLOAT_DTYPES
from moe_core.formats.dense import ExpertBiases
from moe_core.mxfp4 import MXFP4_BLOCK, E8M0Scales
from moe_core.expert_params import BIAS, ParamSpec, ShapedLayout
from moe_core.scheme import ExpertScheme, SchemeOptions, SchemeSpec

NAME = "gpt-oss-mxfp4"
def _blocks_shape(out: int, cols: int) -> tuple[int, ...]:
    return out, cols // MXFP4_BLOCK, MXFP4_BLOCK // 2


def _scales_shape(out: int, cols: int) -> tuple[int, ...]:
    return out, cols // MXFP4_BLOCK


# module-level functions, not lambdas: a scheme pickles with its layouts
_BLOCKS = ShapedLayout(_blocks_shape, "[out_features, in_features / 32, 16]")
_SCALES = ShapedLayout(_scales_shape, "[out_features, in_features / 32]")


class GptOssMxfp4MoE(ExpertScheme[Mxfp4MoeWeights]):
    """One MoE layer of a gpt-oss MXFP4 checkpoint: codes, E8M0 scales and biases of this rank's experts."""

    def __init__(
        self,
        config: MoeRunnerConfig,
        device: torch.device = torch.device("cpu"),
        *,
        bias_dtype: torch.dtype = torch.bfloat16,
        backend: FormatRoute[Mxfp4MoeWeights] | str | None = None,
        strict: bool = False,
        activation_dtype: torch.dtype = torch.bfloat16,
    ) -> None:
        """Allocate this rank's tensors on ``device``; ``bias_dtype`` is the checkpoint's bias dtype (bf16 in
        gpt-oss), ``backend`` forces a backend fed from MXFP4 weights (a route, or a name)."""
        if bias_dtype not in FLOAT_DTYPES:
            raise TypeError(f"bias_dtype: expected one of {FLOAT_DTYPES}, got {bias_dtype!r}")
        if not config.expert_biases:
            raise ValueError("config.expert_biases: gpt-oss experts carry biases, the config says they have none")
        for size, name in ((config.hidden_size, "hidden_size"), (config.intermediate_size_per_partition, "intermediate_size")):
            if size % MXFP4_BLOCK:
                raise ValueError(f"config.{name}: expected a multiple of {MXFP4_BLOCK} (MXFP4 blocks), got {size}")
        specs = (
            ParamSpec("blocks", torch.uint8, _BLOCKS),
            ParamSpec("scales", torch.uint8, _SCALES),
            ParamSpec("bias", bias_dtype, BIAS),
        )
        super().__init__(NAME, MXFP4, specs, config, device, backend=backend, strict=strict, activation_dtype=activation_dtype)

    def canonical_weights(self) -> Mxfp4MoeWeights:
        """The MXFP4 weights (gate rows then up rows in ``w13``) and biases, as loaded."""
        tensors = self.params

        def experts(blocks: torch.Tensor, scales: torch.Tensor) -> Mxfp4ExpertWeights:
            return Mxfp4ExpertWeights(blocks.flatten(2), E8M0Scales.from_checkpoint(scales))

        return Mxfp4MoeWeights(
            w13=experts(tensors.gate_up_fused("blocks"), tensors.gate_up_fused("scales")),
            w2=experts(tensors.down("blocks"), tensors.down("scales")),
            biases=ExpertBiases(w13=tensors.gate_up_fused("bias"), w2=tensors.down("bias")),
        )


def unsupported_reason(quantization_config: Mapping[str, object] | None) -> str | None:
    """Why a ``quantization_config`` is not gpt-oss MXFP4 (None: it is)."""
    if quantization_config is None:
        return "the checkpoint is not quantized"
    method = quantization_config.get("quant_method")
    if method != "mxfp4":
        return f"quant_method is {method!r}, not 'mxfp4'"
    return None


def _for_layer(config: MoeRunnerConfig, device: torch.device, dtype: torch.dtype, options: SchemeOptions) -> GptOssMxfp4MoE:
    return GptOssMxfp4MoE(
        config, device, bias_dtype=dtype, backend=options.backend, strict=options.strict,
        activation_dtype=options.activation_dtype,
    )


SCHEME = SchemeSpec(NAME, MXFP4, unsupported_reason, _for_layer)
"""The scheme as the checkpoint loader and ``moe-core`` see it."""
