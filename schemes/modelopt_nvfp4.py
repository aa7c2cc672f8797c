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

from collections.abc import Mapping, Sequence

import torch

from moe_core import (
    NVFP4,
    DequantizeGlobalScale,
    ExpertDequantizeGlobalScales,
    ExpertQuantizeGlobalScales,
    ExpertScalePolicy,
    FormatRoute,
    MoeRunnerConfig,
    Nvfp4MoeWeights,
    QuantizeGlobalScale,
)
from moe_core.expert_params import ParamLayout, ParamSpec
from moe_core.scheme import ExpertScheme, SchemeSpec, backends_for
from moe_core.schemes._nvfp4_checkpoint import nvfp4_moe_weights

NAME = "modelopt-nvfp4"
PREFERENCE = ("flashinfer-trtllm-fp4", "flashinfer-cutlass-nvfp4", "reference-nvfp4")
"""Backend names in preference order; registered backends not named here follow."""
PARAMS = (
    ParamSpec("weight", torch.uint8, ParamLayout.PACKED_FP4),
    ParamSpec("weight_scale", torch.float8_e4m3fn, ParamLayout.BLOCK_SCALES),
    ParamSpec("weight_scale_2", torch.float32, ParamLayout.SCALAR),
    ParamSpec("input_scale", torch.float32, ParamLayout.SCALAR),
)
"""The checkpoint tensors of each expert projection."""


def _weight_scales(values: torch.Tensor) -> ExpertQuantizeGlobalScales:
    return ExpertQuantizeGlobalScales.from_dequantize(ExpertDequantizeGlobalScales.from_checkpoint(values))


def _input_scale(values: torch.Tensor, policy: ExpertScalePolicy) -> QuantizeGlobalScale:
    return QuantizeGlobalScale.from_dequantize(DequantizeGlobalScale.from_checkpoint(values, policy=policy))


class ModelOptNvfp4MoE(ExpertScheme[Nvfp4MoeWeights]):
    """One MoE layer of a ModelOpt NVFP4 checkpoint."""

    def __init__(
        self,
        config: MoeRunnerConfig,
        device: torch.device = torch.device("cpu"),
        *,
        input_scale_policy: ExpertScalePolicy = ExpertScalePolicy.CONSERVATIVE,
        backends: Sequence[FormatRoute[Nvfp4MoeWeights]] | None = None,
        backend: FormatRoute[Nvfp4MoeWeights] | None = None,
    ) -> None:
        """Create the layer's parameters on ``device``; ``backend`` forces a backend fed from NVFP4 weights."""
        if not isinstance(input_scale_policy, ExpertScalePolicy):
            raise TypeError(f"input_scale_policy: expected an ExpertScalePolicy, got {input_scale_policy!r}")
        super().__init__(
            NAME, NVFP4, PARAMS, config, device, preference=PREFERENCE, backends=backends, backend=backend
        )
        self.input_scale_policy = input_scale_policy
        """How the per-expert input scales become one scalar per GEMM."""

    def canonical_weights(self) -> Nvfp4MoeWeights:
        """Canonical NVFP4 weights, the dequantize-side scales converted to quantize-side ones."""
        return nvfp4_moe_weights(
            self.params,
            packed="weight",
            block_scales="weight_scale",
            weight_scale="weight_scale_2",
            input_scale="input_scale",
            weight_scales=_weight_scales,
            input_scales=_input_scale,
            policy=self.input_scale_policy,
        )


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


def _for_layer(config: MoeRunnerConfig, device: torch.device, dtype: torch.dtype) -> ModelOptNvfp4MoE:
    return ModelOptNvfp4MoE(config, device)


def _choices() -> Sequence[FormatRoute[Nvfp4MoeWeights]]:
    return backends_for(NVFP4, PREFERENCE)


SCHEME = SchemeSpec(NAME, NVFP4, unsupported_reason, _for_layer, _choices)
"""The scheme as the checkpoint loader and ``moe-core`` see it."""
