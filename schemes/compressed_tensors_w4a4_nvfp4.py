"""compressed-tensors W4A4 NVFP4 MoE (``nvfp4-pack-quantized``), as llmcompressor writes it.

Per expert projection (``gate_proj``/``up_proj``/``down_proj``, or
``w1``/``w3``/``w2``) the checkpoint holds ``weight_packed`` (uint8, two E2M1
codes a byte), ``weight_scale`` (E4M3, one per 16 elements),
``weight_global_scale`` and ``input_global_scale`` (float32 ``[1]``, both on
the quantize side, ``448 * 6 / amax``).

After loading: gate and up keep their own weight global scales (the typed
:class:`~moe_core.Nvfp4GateUpWeights`); the per-expert input global scales
become the one scalar each GEMM takes under ``input_scale_policy``.

The default is :attr:`ExpertScalePolicy.CONSERVATIVE` (the smallest
quantize-side scale, i.e. the largest calibrated amax), because each value
is an amax calibrated on the tokens that expert saw, so they differ per
expert in every real checkpoint (``REQUIRE_EQUAL`` would refuse them), and
a kernel quantizes the hidden states once for all experts, so any other
choice clips some expert's inputs. vLLM does the same for FlashInfer's
TRT-LLM path (``w13_input_global_scale.min()`` in ``compressed_tensors_moe.py``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch

from moe_core import (
    NVFP4,
    ExpertQuantizeGlobalScales,
    ExpertScalePolicy,
    FormatRoute,
    MoeRunnerConfig,
    Nvfp4MoeWeights,
    QuantizeGlobalScale,
)
from moe_core.expert_params import ParamLayout, ParamSpec
from moe_core.scheme import ExpertScheme, SchemeSpec, backends_for
from moe_core.schemes._nvfp4_checkpoint import nvfp4_group_problem, nvfp4_moe_weights

NAME = "compressed-tensors-w4a4-nvfp4"
PREFERENCE = ("flashinfer-trtllm-fp4", "flashinfer-cutlass-nvfp4", "reference-nvfp4")
"""Backend names in preference order; registered backends not named here follow, before none."""
PARAMS = (
    ParamSpec("weight_packed", torch.uint8, ParamLayout.PACKED_FP4),
    ParamSpec("weight_scale", torch.float8_e4m3fn, ParamLayout.BLOCK_SCALES),
    ParamSpec("weight_global_scale", torch.float32, ParamLayout.SCALAR),
    ParamSpec("input_global_scale", torch.float32, ParamLayout.SCALAR),
)
"""The checkpoint tensors of each expert projection."""


def _input_scale(values: torch.Tensor, policy: ExpertScalePolicy) -> QuantizeGlobalScale:
    return QuantizeGlobalScale.from_checkpoint(values, policy=policy)


class CompressedTensorsW4A4Nvfp4MoE(ExpertScheme[Nvfp4MoeWeights]):
    """One MoE layer of a compressed-tensors NVFP4 W4A4 checkpoint."""

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
        """How the per-expert input global scales become one scalar per GEMM."""

    def canonical_weights(self) -> Nvfp4MoeWeights:
        """Canonical NVFP4 weights; the checkpoint's convention is already quantize-side."""
        return nvfp4_moe_weights(
            self.params,
            packed="weight_packed",
            block_scales="weight_scale",
            weight_scale="weight_global_scale",
            input_scale="input_global_scale",
            weight_scales=ExpertQuantizeGlobalScales.from_checkpoint,
            input_scales=_input_scale,
            policy=self.input_scale_policy,
        )


def unsupported_reason(quantization_config: Mapping[str, object] | None) -> str | None:
    """Why a ``quantization_config`` is not compressed-tensors NVFP4 W4A4 (None: it is)."""
    if quantization_config is None:
        return "the checkpoint is not quantized"
    method = quantization_config.get("quant_method")
    if method != "compressed-tensors":
        return f"quant_method is {method!r}, not 'compressed-tensors'"
    groups = quantization_config.get("config_groups")
    if not isinstance(groups, Mapping) or not groups:
        return "quantization_config has no config_groups"
    problems = []
    for name, group in groups.items():
        if not isinstance(group, Mapping):
            problems.append(f"{name}: not a mapping")
            continue
        fmt = group.get("format", quantization_config.get("format"))
        problem = nvfp4_group_problem(group)
        if fmt != "nvfp4-pack-quantized":
            problem = f"format is {fmt!r}, not 'nvfp4-pack-quantized'"
        if problem is None:
            return None
        problems.append(f"{name}: {problem}")
    return "no NVFP4 W4A4 config group (" + "; ".join(problems) + ")"


def _for_layer(config: MoeRunnerConfig, device: torch.device, dtype: torch.dtype) -> CompressedTensorsW4A4Nvfp4MoE:
    return CompressedTensorsW4A4Nvfp4MoE(config, device)


def _choices() -> Sequence[FormatRoute[Nvfp4MoeWeights]]:
    return backends_for(NVFP4, PREFERENCE)


SCHEME = SchemeSpec(NAME, NVFP4, unsupported_reason, _for_layer, _choices)
"""The scheme as the checkpoint loader and ``moe-core`` see it."""
