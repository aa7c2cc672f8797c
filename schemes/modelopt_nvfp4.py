"""ModelOpt NVFP4 MoE (``quant_algo: NVFP4``), as ``modelopt.torch.export.export_hf_checkpoint`` writes it.

Per expert projection the checkpoint holds ``weight`` (uint8, two E2M1 codes
a byte), ``weight_scale`` (E4M3, one per 16 elements), and ``weight_scale_2``
and ``input_scale`` (float32 scalars on the dequantize side,
``amax / (448 * 6)``): the reciprocals of compressed-tensors' global scales.
They enter as :class:`~moe_core.ExpertDequantizeGlobalScales` /
:class:`~moe_core.DequantizeGlobalScale` and are converted explicitly;
the input scales collapse under ``input_scale_policy`` (default
``CONSERVATIVE``: the largest dequantize-side value, for the reasons given
in :mod:`moe_core.schemes.compressed_tensors_w4a4_nvfp4`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar

import torch

from moe_core import (
    NVFP4,
    NVFP4_PER_EXPERT,
    DequantizeGlobalScale,
    ExpertDequantizeGlobalScales,
    ExpertInputScales,
    ExpertQuantizeGlobalScales,
    ExpertScalePolicy,
    MoeRunnerConfig,
    QuantizeGlobalScale,
)
from moe_core.scheme import SchemeOptions, SchemeSpec
from moe_core.schemes._nvfp4_checkpoint import Nvfp4CheckpointScheme, Nvfp4PerExpertCheckpointScheme


class _ModelOptNvfp4:
    """ModelOpt's tensor names and dequantize-side convention, shared by both input-scale formats."""

    PACKED: ClassVar[str] = "weight"
    BLOCK_SCALES: ClassVar[str] = "weight_scale"
    WEIGHT_SCALE: ClassVar[str] = "weight_scale_2"
    INPUT_SCALE: ClassVar[str] = "input_scale"

    @staticmethod
    def weight_scales(values: torch.Tensor) -> ExpertQuantizeGlobalScales:
        """Dequantize-side per-expert values, converted to quantize-side ones (their reciprocals)."""
        return ExpertQuantizeGlobalScales.from_dequantize(ExpertDequantizeGlobalScales.from_checkpoint(values))

    @staticmethod
    def input_scale(values: torch.Tensor, *, num_experts: int, policy: ExpertScalePolicy) -> QuantizeGlobalScale:
        """Dequantize-side values collapsed under ``policy``, then converted."""
        return QuantizeGlobalScale.from_dequantize(
            DequantizeGlobalScale.from_checkpoint(values, num_experts=num_experts, policy=policy)
        )

    @staticmethod
    def expert_input_scales(values: torch.Tensor, *, policy: ExpertScalePolicy) -> ExpertInputScales:
        """Dequantize-side values, each expert's shards collapsed under ``policy``, then converted."""
        return ExpertInputScales.from_dequantize_checkpoint_shards(values, policy=policy)


class ModelOptNvfp4MoE(_ModelOptNvfp4, Nvfp4CheckpointScheme):
    """One MoE layer of a ModelOpt NVFP4 checkpoint, one input scale per GEMM."""

    NAME = "modelopt-nvfp4"


class ModelOptNvfp4PerExpertMoE(_ModelOptNvfp4, Nvfp4PerExpertCheckpointScheme):
    """One MoE layer of a ModelOpt NVFP4 checkpoint, each expert's inputs quantized with its own ``input_scale``
    (format ``nvfp4-per-expert``)."""

    NAME = "modelopt-nvfp4-per-expert"


def unsupported_reason(quantization_config: Mapping[str, object] | None) -> str | None:
    """Why a ``quantization_config`` is not ModelOpt NVFP4 (None: it is)."""
    if quantization_config is None:
        return "the checkpoint is not quantized"
    method = quantization_config.get("quant_method")
    if method != "modelopt":
        return f"quant_method is {method!r}, not 'modelopt'"
    algo = quantization_config.get("quant_algo")
    if algo != "NVFP4":
        return f"quant_algo is {algo!r}, not 'NVFP4'"
    group_size = quantization_config.get("group_size", 16)
    if group_size != 16:
        return f"group_size is {group_size!r}, NVFP4 is 16"
    return None


def _for_layer(config: MoeRunnerConfig, device: torch.device, dtype: torch.dtype, options: SchemeOptions) -> ModelOptNvfp4MoE:
    return ModelOptNvfp4MoE(
        config, device, backend=options.backend, strict=options.strict, activation_dtype=options.activation_dtype
    )


SCHEME = SchemeSpec(ModelOptNvfp4MoE.NAME, NVFP4, unsupported_reason, _for_layer)
"""The scheme as the checkpoint loader and ``moe-core`` see it."""


def _for_layer_per_expert(
    config: MoeRunnerConfig, device: torch.device, dtype: torch.dtype, options: SchemeOptions
) -> ModelOptNvfp4PerExpertMoE:
    return ModelOptNvfp4PerExpertMoE(
        config, device, backend=options.backend, strict=options.strict, activation_dtype=options.activation_dtype
    )


PER_EXPERT_SCHEME = SchemeSpec(
    ModelOptNvfp4PerExpertMoE.NAME, NVFP4_PER_EXPERT, unsupported_reason, _for_layer_per_expert
)
"""The same checkpoints with per-expert input scales: ``MoeCheckpoint.load_layer(layer, scheme=PER_EXPERT_SCHEME)``."""
