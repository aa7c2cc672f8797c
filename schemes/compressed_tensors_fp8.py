"""compressed-tensors FP8 MoE (``float-quantized``), as llmcompressor writes its ``FP8`` and ``FP8_DYNAMIC`` presets.

Per expert projection the checkpoint holds ``weight`` (float8_e4m3fn
``[out, in]``) and ``weight_scale`` (dequantize-side ``amax / 448``, in the model's dtype, bf16: read exactly into float32):

- ``FP8`` (static, per tensor): ``weight_scale`` ``[1]`` and ``input_scale``
  ``[1]``, a calibrated static scale of the projection's input. Loaded into
  :data:`~moe_core.FP8`: gate and up keep their own weight scales; the
  per-expert input scales of w1/w3 and of w2 become the one scalar each GEMM
  takes under ``input_scale_policy`` (conservative by default: the largest,
  so no expert's calibrated inputs clip), over every expert of the layer.
- ``FP8_DYNAMIC`` (per channel, dynamic per-token inputs): ``weight_scale``
  ``[out, 1]`` and no input scale. Loaded into :data:`~moe_core.FP8_CHANNEL`.

Nothing is requantized: the canonical weights hold the checkpoint's codes.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from moe_core import (
    FP8,
    FP8_CHANNEL,
    ExpertFp8Scales,
    ExpertScalePolicy,
    Fp8ChannelExpertWeights,
    Fp8ChannelMoeWeights,
    Fp8ChannelScales,
    Fp8ExpertWeights,
    Fp8GateUpWeights,
    Fp8MoeWeights,
    Fp8TensorScale,
    FormatRoute,
    MoeRunnerConfig,
)
from moe_core.expert_params import ParamLayout, ParamSpec, ShapedLayout
from moe_core.scheme import ExpertScheme, SchemeOptions, SchemeSpec
from moe_core.schemes._compressed_tensors import compressed_tensors_reason

STATIC = "compressed-tensors-fp8"
DYNAMIC = "compressed-tensors-fp8-dynamic"
_WEIGHT = ParamSpec("weight", torch.float8_e4m3fn, ParamLayout.MATRIX)
_NARROW = (torch.bfloat16, torch.float16)
"""Scale dtypes read exactly into float32: llmcompressor writes scales in the model's dtype."""


class CompressedTensorsFp8MoE(ExpertScheme[Fp8MoeWeights]):
    """One MoE layer of a compressed-tensors ``FP8`` checkpoint (per-tensor weights, static input scales)."""

    def __init__(
        self,
        config: MoeRunnerConfig,
        device: torch.device = torch.device("cpu"),
        *,
        input_scale_policy: ExpertScalePolicy = ExpertScalePolicy.CONSERVATIVE,
        backend: FormatRoute[Fp8MoeWeights] | str | None = None,
        strict: bool = False,
        activation_dtype: torch.dtype = torch.bfloat16,
    ) -> None:
        """Create the layer's tensors on ``device``; ``input_scale_policy`` makes each GEMM's one input scale of the
        experts' (conservative: the largest), ``backend`` forces a backend fed from FP8 weights."""
        if not isinstance(input_scale_policy, ExpertScalePolicy):
            raise TypeError(f"input_scale_policy: expected an ExpertScalePolicy, got {input_scale_policy!r}")
        specs = (
            _WEIGHT,
            ParamSpec("weight_scale", torch.float32, ParamLayout.SCALAR, upcast_from=_NARROW),
            ParamSpec("input_scale", torch.float32, ParamLayout.SCALAR, every_expert=True, upcast_from=_NARROW),
        )
        super().__init__(STATIC, FP8, specs, config, device, backend=backend, strict=strict, activation_dtype=activation_dtype)
        self.input_scale_policy = input_scale_policy
        """How the per-expert input scales become one scalar per GEMM."""

    def canonical_weights(self) -> Fp8MoeWeights:
        """The FP8 weights, gate and up each with its own per-expert scales."""
        tensors, policy, experts = self.params, self.input_scale_policy, self.config.num_experts
        codes, scales = tensors.gate_up("weight"), tensors.gate_up("weight_scale")

        def half(index: int) -> Fp8ExpertWeights:
            return Fp8ExpertWeights(codes[:, index], ExpertFp8Scales.from_checkpoint(scales[:, index].contiguous()))

        return Fp8MoeWeights(
            w13=Fp8GateUpWeights(gate=half(0), up=half(1)),
            w2=Fp8ExpertWeights(tensors.down("weight"), ExpertFp8Scales.from_checkpoint(tensors.down("weight_scale"))),
            w13_input_scale=Fp8TensorScale.from_checkpoint(tensors.gate_up("input_scale"), num_experts=experts, policy=policy),
            w2_input_scale=Fp8TensorScale.from_checkpoint(tensors.down("input_scale"), num_experts=experts, policy=policy),
        )


def _per_row_shape(out: int, cols: int) -> tuple[int, ...]:
    """One scale per output row (a module-level function, not a lambda: a scheme pickles with its layouts)."""
    return out, 1


class CompressedTensorsFp8DynamicMoE(ExpertScheme[Fp8ChannelMoeWeights]):
    """One MoE layer of a compressed-tensors ``FP8_DYNAMIC`` checkpoint (per-channel weights, per-token inputs)."""

    def __init__(
        self,
        config: MoeRunnerConfig,
        device: torch.device = torch.device("cpu"),
        *,
        backend: FormatRoute[Fp8ChannelMoeWeights] | str | None = None,
        strict: bool = False,
        activation_dtype: torch.dtype = torch.bfloat16,
    ) -> None:
        """Create the layer's tensors on ``device``; ``backend`` forces a backend fed from per-channel FP8 weights."""
        channel = ShapedLayout(_per_row_shape, "[out_features, 1]")
        specs = (_WEIGHT, ParamSpec("weight_scale", torch.float32, channel, upcast_from=_NARROW))
        super().__init__(
            DYNAMIC, FP8_CHANNEL, specs, config, device, backend=backend, strict=strict, activation_dtype=activation_dtype
        )

    def canonical_weights(self) -> Fp8ChannelMoeWeights:
        """The FP8 weights, each row with its own scale (gate rows then up rows in ``w13``)."""
        tensors = self.params
        return Fp8ChannelMoeWeights(
            w13=Fp8ChannelExpertWeights(
                tensors.gate_up_fused("weight"), Fp8ChannelScales.from_checkpoint(tensors.gate_up_fused("weight_scale"))
            ),
            w2=Fp8ChannelExpertWeights(tensors.down("weight"), Fp8ChannelScales.from_checkpoint(tensors.down("weight_scale"))),
        )


def _args_problem(args: object, role: str, expected: Mapping[str, object]) -> str | None:
    if not isinstance(args, Mapping):
        return f"{role}: not quantized"
    found = {key: args.get(key) for key in expected}
    if found != dict(expected):
        return f"{role}: {found}, expected {dict(expected)}"
    return None


def _reason(quantization_config: Mapping[str, object] | None, weights: Mapping[str, object], inputs: Mapping[str, object]) -> str | None:
    def group_problem(group: Mapping[str, object]) -> str | None:
        return _args_problem(group.get("weights"), "weights", weights) or _args_problem(
            group.get("input_activations"), "input_activations", inputs
        )

    return compressed_tensors_reason(
        quantization_config, format_name="float-quantized", group_problem=group_problem, what="matching FP8"
    )


_FP8 = {"num_bits": 8, "type": "float"}


def static_unsupported_reason(quantization_config: Mapping[str, object] | None) -> str | None:
    """Why a ``quantization_config`` is not compressed-tensors ``FP8`` (per-tensor, static inputs); None: it is."""
    return _reason(
        quantization_config, {**_FP8, "strategy": "tensor"}, {**_FP8, "strategy": "tensor", "dynamic": False}
    )


def dynamic_unsupported_reason(quantization_config: Mapping[str, object] | None) -> str | None:
    """Why a ``quantization_config`` is not compressed-tensors ``FP8_DYNAMIC`` (per-channel, per-token); None: it is."""
    return _reason(
        quantization_config, {**_FP8, "strategy": "channel"}, {**_FP8, "strategy": "token", "dynamic": True}
    )


def _static(config: MoeRunnerConfig, device: torch.device, dtype: torch.dtype, options: SchemeOptions) -> CompressedTensorsFp8MoE:
    return CompressedTensorsFp8MoE(
        config, device, backend=options.backend, strict=options.strict, activation_dtype=options.activation_dtype
    )


def _dynamic(
    config: MoeRunnerConfig, device: torch.device, dtype: torch.dtype, options: SchemeOptions
) -> CompressedTensorsFp8DynamicMoE:
    return CompressedTensorsFp8DynamicMoE(
        config, device, backend=options.backend, strict=options.strict, activation_dtype=options.activation_dtype
    )


STATIC_SCHEME = SchemeSpec(STATIC, FP8, static_unsupported_reason, _static)
"""compressed-tensors ``FP8`` as the checkpoint loader and ``moe-core`` see it."""
DYNAMIC_SCHEME = SchemeSpec(DYNAMIC, FP8_CHANNEL, dynamic_unsupported_reason, _dynamic)
"""compressed-tensors ``FP8_DYNAMIC`` as the checkpoint loader and ``moe-core`` see it."""
