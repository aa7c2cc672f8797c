"""compressed-tensors W4A4 NVFP4 MoE (``nvfp4-pack-quantized``), as llmcompressor writes it.

Per expert projection (``gate_proj``/``up_proj``/``down_proj``, or
``w1``/``w3``/``w2``) the checkpoint holds ``weight_packed`` (uint8, two E2M1
codes a byte), ``weight_scale`` (E4M3, one per 16 elements),
``weight_global_scale`` and ``input_global_scale`` (float32 ``[1]``, both on
the quantize side, ``448 * 6 / amax``).

After loading: gate and up keep their own weight global scales (the typed
:class:`~moe_core.Nvfp4GateUpWeights`); the per-expert input global scales
become the one scalar each GEMM takes under ``input_scale_policy``, or, with
:data:`PER_EXPERT_SCHEME`, stay one per expert (format ``nvfp4-per-expert``).

The default is :attr:`ExpertScalePolicy.CONSERVATIVE` (the smallest
quantize-side scale, i.e. the largest calibrated amax), because each value
is an amax calibrated on the tokens that expert saw, so they may differ per
expert (``REQUIRE_EQUAL`` refuses such checkpoints), and a kernel with one
scalar quantizes the hidden states once for all experts, so any other choice
clips some expert's inputs. vLLM does the same for FlashInfer's TRT-LLM path
(``w13_input_global_scale.min()`` in ``compressed_tensors_moe.py``). The
cost: an expert whose inputs are far smaller than the others' (the split
fixture's tiny expert) quantizes to zero there. Under expert parallelism the
policy applies to every expert of the layer (each rank loads all the input scales), whatever the placement.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar

import torch

from moe_core import (
    NVFP4,
    NVFP4_PER_EXPERT,
    ExpertInputScales,
    ExpertQuantizeGlobalScales,
    ExpertScalePolicy,
    MoeRunnerConfig,
    QuantizeGlobalScale,
)
from moe_core.scheme import SchemeOptions, SchemeSpec
from moe_core.schemes._compressed_tensors import compressed_tensors_reason
from moe_core.schemes._nvfp4_checkpoint import (
    Nvfp4CheckpointScheme,
    Nvfp4PerExpertCheckpointScheme,
    nvfp4_group_problem,
)


class _CompressedTensorsNvfp4:
    """compressed-tensors' tensor names and quantize-side convention, shared by both input-scale formats."""

    PACKED: ClassVar[str] = "weight_packed"
    BLOCK_SCALES: ClassVar[str] = "weight_scale"
    WEIGHT_SCALE: ClassVar[str] = "weight_global_scale"
    INPUT_SCALE: ClassVar[str] = "input_global_scale"

    @staticmethod
    def weight_scales(values: torch.Tensor) -> ExpertQuantizeGlobalScales:
        """The checkpoint's convention is already quantize-side."""
        return ExpertQuantizeGlobalScales.from_checkpoint(values)

    @staticmethod
    def input_scale(values: torch.Tensor, *, num_experts: int, policy: ExpertScalePolicy) -> QuantizeGlobalScale:
        """Quantize-side values, collapsed under ``policy``."""
        return QuantizeGlobalScale.from_checkpoint(values, num_experts=num_experts, policy=policy)

    @staticmethod
    def expert_input_scales(values: torch.Tensor, *, policy: ExpertScalePolicy) -> ExpertInputScales:
        """Quantize-side values, each expert's shards collapsed under ``policy``."""
        return ExpertInputScales.from_checkpoint_shards(values, policy=policy)


class CompressedTensorsW4A4Nvfp4MoE(_CompressedTensorsNvfp4, Nvfp4CheckpointScheme):
    """One MoE layer of a compressed-tensors NVFP4 W4A4 checkpoint, one input scale per GEMM."""

    NAME = "compressed-tensors-w4a4-nvfp4"


class CompressedTensorsW4A4Nvfp4PerExpertMoE(_CompressedTensorsNvfp4, Nvfp4PerExpertCheckpointScheme):
    """One MoE layer of a compressed-tensors NVFP4 W4A4 checkpoint, each expert's inputs quantized with its own
    ``input_global_scale`` (format ``nvfp4-per-expert``)."""

    NAME = "compressed-tensors-w4a4-nvfp4-per-expert"


def unsupported_reason(quantization_config: Mapping[str, object] | None) -> str | None:
    """Why a ``quantization_config`` is not compressed-tensors NVFP4 W4A4 (None: it is)."""
    return compressed_tensors_reason(
        quantization_config, format_name="nvfp4-pack-quantized", group_problem=nvfp4_group_problem, what="NVFP4 W4A4"
    )


def _for_layer(config: MoeRunnerConfig, device: torch.device, dtype: torch.dtype, options: SchemeOptions) -> CompressedTensorsW4A4Nvfp4MoE:
    return CompressedTensorsW4A4Nvfp4MoE(
        config, device, backend=options.backend, strict=options.strict, activation_dtype=options.activation_dtype
    )


SCHEME = SchemeSpec(CompressedTensorsW4A4Nvfp4MoE.NAME, NVFP4, unsupported_reason, _for_layer)
"""The scheme as the checkpoint loader and ``moe-core`` see it."""


def _for_layer_per_expert(
    config: MoeRunnerConfig, device: torch.device, dtype: torch.dtype, options: SchemeOptions
) -> CompressedTensorsW4A4Nvfp4PerExpertMoE:
    return CompressedTensorsW4A4Nvfp4PerExpertMoE(
        config, device, backend=options.backend, strict=options.strict, activation_dtype=options.activation_dtype
    )


PER_EXPERT_SCHEME = SchemeSpec(
    CompressedTensorsW4A4Nvfp4PerExpertMoE.NAME, NVFP4_PER_EXPERT, unsupported_reason, _for_layer_per_expert
)
"""The same checkpoints with per-expert input scales: ``MoeCheckpoint.load_layer(layer, scheme=PER_EXPERT_SCHEME)``."""
