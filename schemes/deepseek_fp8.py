"""DeepSeek-V3 block-scaled FP8 MoE (``quant_method: fp8``, ``weight_block_size: [128, 128]``), as DeepSeek publishes
DeepSeek-V3/R1 (and Qwen3's FP8 releases use the same layout).

Per expert projection the checkpoint holds ``weight`` (float8_e4m3fn
``[out, in]``) and ``weight_scale_inv`` (float32 ``[ceil(out / 128),
ceil(in / 128)]``): despite its name, the dequantize-side scale of each
128x128 block, ``w = e4m3 * weight_scale_inv[i // 128, j // 128]``.
Activations are quantized per token and 128-column group at run time, so
there is no input scale. Loaded into :data:`~moe_core.FP8_BLOCK_SCALED`,
nothing requantized.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from moe_core import FP8_BLOCK_SCALED, Fp8BlockExpertWeights, Fp8BlockMoeWeights, Fp8BlockScales, FormatRoute, MoeRunnerConfig
from moe_core.expert_params import ParamLayout, ParamSpec, ShapedLayout
from moe_core.fp8 import FP8_BLOCK
from moe_core.scheme import ExpertScheme, SchemeOptions, SchemeSpec

NAME = "deepseek-fp8-block"


def _blocks(out: int, cols: int) -> tuple[int, int]:
    return -(-out // FP8_BLOCK), -(-cols // FP8_BLOCK)


class DeepseekFp8MoE(ExpertScheme[Fp8BlockMoeWeights]):
    """One MoE layer of a block-scaled FP8 checkpoint (DeepSeek-V3 layout)."""

    def __init__(
        self,
        config: MoeRunnerConfig,
        device: torch.device = torch.device("cpu"),
        *,
        backend: FormatRoute[Fp8BlockMoeWeights] | str | None = None,
        strict: bool = False,
        activation_dtype: torch.dtype = torch.bfloat16,
    ) -> None:
        """Create the layer's tensors on ``device``; ``backend`` forces a backend fed from block-scaled FP8 weights."""
        specs = (
            ParamSpec("weight", torch.float8_e4m3fn, ParamLayout.MATRIX),
            ParamSpec("weight_scale_inv", torch.float32, ShapedLayout(_blocks, "[out_features / 128, in_features / 128]")),
        )
        super().__init__(
            NAME, FP8_BLOCK_SCALED, specs, config, device, backend=backend, strict=strict, activation_dtype=activation_dtype
        )

    def canonical_weights(self) -> Fp8BlockMoeWeights:
        """The FP8 weights with their block scales (gate rows then up rows in ``w13``: I is a multiple of 128, so no
        block straddles the halves)."""
        tensors = self.params
        return Fp8BlockMoeWeights(
            w13=Fp8BlockExpertWeights(
                tensors.gate_up_fused("weight"), Fp8BlockScales.from_checkpoint(tensors.gate_up_fused("weight_scale_inv"))
            ),
            w2=Fp8BlockExpertWeights(tensors.down("weight"), Fp8BlockScales.from_checkpoint(tensors.down("weight_scale_inv"))),
        )


def unsupported_reason(quantization_config: Mapping[str, object] | None) -> str | None:
    """Why a ``quantization_config`` is not 128x128 block-scaled FP8 (None: it is)."""
    if quantization_config is None:
        return "the checkpoint is not quantized"
    method = quantization_config.get("quant_method")
    if method != "fp8":
        return f"quant_method is {method!r}, not 'fp8'"
    block = quantization_config.get("weight_block_size")
    if block != [FP8_BLOCK, FP8_BLOCK]:
        return f"weight_block_size is {block!r}, not [{FP8_BLOCK}, {FP8_BLOCK}]"
    scheme = quantization_config.get("activation_scheme", "dynamic")
    if scheme != "dynamic":
        return f"activation_scheme is {scheme!r}, not 'dynamic'"
    return None


def _for_layer(config: MoeRunnerConfig, device: torch.device, dtype: torch.dtype, options: SchemeOptions) -> DeepseekFp8MoE:
    return DeepseekFp8MoE(config, device, backend=options.backend, strict=options.strict, activation_dtype=options.activation_dtype)


SCHEME = SchemeSpec(NAME, FP8_BLOCK_SCALED, unsupported_reason, _for_layer)
"""The scheme as the checkpoint loader and ``moe-core`` see it."""
