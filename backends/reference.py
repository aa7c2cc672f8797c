"""The pure-PyTorch reference backend: the oracle for every other backend.

Written for clarity, not speed: one expert at a time, float32 arithmetic, on
any device torch runs on. One key per format:

- ``REFERENCE_DENSE`` runs unquantized (fp32/bf16/fp16) expert weights;
- ``REFERENCE_NVFP4_W4A16`` runs NVFP4 weights with unquantized activations
  (dequantized weights, each half with its own global scale, in float32);
- ``REFERENCE_FP8`` runs FP8 W8A8: each GEMM input goes through an FP8 round
  trip with its static per-tensor scale, times the dequantized FP8 weights,
  the gate and up halves each with its own scale;
- ``REFERENCE_FP8_CHANNEL`` runs per-channel FP8 weights with each GEMM
  input's rows quantized with their own amax (dynamic per-token scales);
- ``REFERENCE_FP8_BLOCK`` runs 128x128 block-scaled FP8 weights with each
  GEMM input quantized per token and 128-column group;
- ``REFERENCE_NVFP4`` runs NVFP4 W4A4 the way the FP4 kernels do: each
  GEMM's input is quantized to NVFP4 with its scalar global input scale
  (16-element E4M3 blocks) and multiplied with the dequantized FP4 weights,
  the gate and up halves of w13 each with its own global scale.
  The gated activation is quantized from its float32 value; a kernel that
  writes it as bf16 first may round a few of its codes the other way.

Each takes its format's canonical weights as they are (an identity
conversion), and checks every value it is given (:func:`check_run_values`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import final

import attrs
import torch

from moe_core import (
    DENSE,
    FP8,
    FP8_BLOCK_SCALED,
    FP8_CHANNEL,
    NVFP4,
    NVFP4_W4A16,
    BackendKey,
    Conversion,
    DenseMoeWeights,
    DispatchFormat,
    DispatchOutput,
    Fp8BlockMoeWeights,
    Fp8ChannelMoeWeights,
    Fp8MoeWeights,
    MoeRunnerConfig,
    Nvfp4MoeWeights,
    Nvfp4Tensor,
    Nvfp4W4A16MoeWeights,
    QuantInfo,
    QuantizeGlobalScale,
    check_run_inputs,
    check_run_values,
    register_backend,
)
from moe_core.capability import DeviceSpec, LayerSpec, Priority, Support, Tier
from moe_core.fp8 import fake_quantize_fp8, fake_quantize_fp8_per_group, fake_quantize_fp8_per_token

ExpertMlp = Callable[[int, torch.Tensor], torch.Tensor]
"""``(local expert index, float32 tokens [n, H]) -> float32 [n, H]``."""


def fake_quantize_nvfp4(x: torch.Tensor, global_scale: QuantizeGlobalScale) -> torch.Tensor:
    """``x`` after an NVFP4 round trip with ``global_scale``, as float32."""
    return Nvfp4Tensor.quantize(x, global_scale).dequantize()


def run_experts(
    config: MoeRunnerConfig, dispatch: DispatchOutput, quant_info: QuantInfo, expert_mlp: ExpertMlp
) -> torch.Tensor:
    """Sum each token's local experts' outputs, weighted by top-k and the scaling factor."""
    check_run_inputs(config, dispatch, quant_info, (DispatchFormat.STANDARD,))
    check_run_values(config, dispatch)
    hidden = dispatch.hidden_states
    ids, weights = dispatch.topk.topk_ids, dispatch.topk.topk_weights
    out = torch.zeros(hidden.shape, dtype=torch.float32, device=hidden.device)
    for local in range(config.num_local_experts):
        tokens, slots = torch.nonzero(ids == config.local_expert_offset + local, as_tuple=True)
        if tokens.numel() == 0:
            continue
        y = expert_mlp(local, hidden[tokens].to(torch.float32))
        out.index_add_(0, tokens, y * weights[tokens, slots].unsqueeze(-1))
    return (out * config.routed_scaling_factor).to(hidden.dtype)


@final
@attrs.frozen
class ReferenceDenseRunner:
    """Runs unquantized experts in float32."""

    config: MoeRunnerConfig

    def run(self, dispatch: DispatchOutput, quant_info: DenseMoeWeights, /) -> torch.Tensor:
        """The ``[T, H]`` MoE output."""

        def mlp(expert: int, x: torch.Tensor) -> torch.Tensor:
            h = x @ quant_info.w13[expert].to(torch.float32).T
            return self.config.activation.apply(h) @ quant_info.w2[expert].to(torch.float32).T

        return run_experts(self.config, dispatch, quant_info, mlp)


@final
@attrs.frozen
class ReferenceNvfp4Runner:
    """Runs NVFP4 W4A4 experts: FP4 activations and weights, float32 accumulation."""

    config: MoeRunnerConfig

    def run(self, dispatch: DispatchOutput, quant_info: Nvfp4MoeWeights, /) -> torch.Tensor:
        """The ``[T, H]`` MoE output."""

        def mlp(expert: int, x: torch.Tensor) -> torch.Tensor:
            x_q = fake_quantize_nvfp4(x, quant_info.w13_input_scale)
            h = self.config.activation.apply(x_q @ quant_info.w13.dequantize_expert(expert).T)
            h_q = fake_quantize_nvfp4(h, quant_info.w2_input_scale)
            return h_q @ quant_info.w2.dequantize_expert(expert).T

        return run_experts(self.config, dispatch, quant_info, mlp)


@final
@attrs.frozen
class ReferenceNvfp4W4A16Runner:
    """Runs NVFP4 weights with unquantized activations (W4A16): dequantized weights, float32 math."""

    config: MoeRunnerConfig

    def run(self, dispatch: DispatchOutput, quant_info: Nvfp4W4A16MoeWeights, /) -> torch.Tensor:
        """The ``[T, H]`` MoE output."""

        def mlp(expert: int, x: torch.Tensor) -> torch.Tensor:
            h = self.config.activation.apply(x @ quant_info.w13.dequantize_expert(expert).T)
            return h @ quant_info.w2.dequantize_expert(expert).T

        return run_experts(self.config, dispatch, quant_info, mlp)


@final
@attrs.frozen
class ReferenceFp8Runner:
    """Runs FP8 W8A8 experts: FP8 activations (static scales) and weights, float32 accumulation."""

    config: MoeRunnerConfig

    def run(self, dispatch: DispatchOutput, quant_info: Fp8MoeWeights, /) -> torch.Tensor:
        """The ``[T, H]`` MoE output."""

        def mlp(expert: int, x: torch.Tensor) -> torch.Tensor:
            x_q = fake_quantize_fp8(x, quant_info.w13_input_scale)
            h = self.config.activation.apply(x_q @ quant_info.w13.dequantize_expert(expert).T)
            h_q = fake_quantize_fp8(h, quant_info.w2_input_scale)
            return h_q @ quant_info.w2.dequantize_expert(expert).T

        return run_experts(self.config, dispatch, quant_info, mlp)


@final
@attrs.frozen
class ReferenceFp8ChannelRunner:
    """Runs FP8 per-channel experts: both GEMM inputs quantized per token at run time, float32 accumulation."""

    config: MoeRunnerConfig

    def run(self, dispatch: DispatchOutput, quant_info: Fp8ChannelMoeWeights, /) -> torch.Tensor:
        """The ``[T, H]`` MoE output."""

        def mlp(expert: int, x: torch.Tensor) -> torch.Tensor:
            h = self.config.activation.apply(fake_quantize_fp8_per_token(x) @ quant_info.w13.dequantize_expert(expert).T)
            return fake_quantize_fp8_per_token(h) @ quant_info.w2.dequantize_expert(expert).T

        return run_experts(self.config, dispatch, quant_info, mlp)


@final
@attrs.frozen
class ReferenceFp8BlockRunner:
    """Runs block-scaled FP8 experts: both GEMM inputs quantized per token and 128-column group, float32 accumulation."""

    config: MoeRunnerConfig

    def run(self, dispatch: DispatchOutput, quant_info: Fp8BlockMoeWeights, /) -> torch.Tensor:
        """The ``[T, H]`` MoE output."""

        def mlp(expert: int, x: torch.Tensor) -> torch.Tensor:
            h = self.config.activation.apply(fake_quantize_fp8_per_group(x) @ quant_info.w13.dequantize_expert(expert).T)
            return fake_quantize_fp8_per_group(h) @ quant_info.w2.dequantize_expert(expert).T

        return run_experts(self.config, dispatch, quant_info, mlp)


def reference_device_support(device: DeviceSpec) -> Support:
    """Wherever torch can allocate a tensor that holds data."""
    if device.kind == "meta":
        return Support.no("meta tensors hold no values to compute with")
    if device.kind == "cuda" and device.capability is None:
        return Support.no("torch sees no CUDA device")
    if device.live and device.kind not in ("cpu", "cuda"):
        try:
            torch.empty(1, device=device.kind)
        except (RuntimeError, AssertionError) as error:
            return Support.no(f"torch cannot allocate on {device.kind}: {error}")
    return Support.yes()


def reference_supports(device: DeviceSpec, layer: LayerSpec) -> Support:
    """Any layer where torch computes (every activation and routing method: it computes them from the config, and
    takes any top-k)."""
    return reference_device_support(device)


ORACLE = Priority(Tier.ORACLE)
"""Every reference ranks last: it is the truth kernels are checked against, not what an engine serves with."""


def _dense_as_is(weights: DenseMoeWeights) -> DenseMoeWeights:
    return weights


def _nvfp4_as_is(weights: Nvfp4MoeWeights) -> Nvfp4MoeWeights:
    return weights


def _nvfp4_w4a16_as_is(weights: Nvfp4W4A16MoeWeights) -> Nvfp4W4A16MoeWeights:
    return weights


def _fp8_as_is(weights: Fp8MoeWeights) -> Fp8MoeWeights:
    return weights


def _fp8_channel_as_is(weights: Fp8ChannelMoeWeights) -> Fp8ChannelMoeWeights:
    return weights


def _fp8_block_as_is(weights: Fp8BlockMoeWeights) -> Fp8BlockMoeWeights:
    return weights


REFERENCE_DENSE: BackendKey[DenseMoeWeights] = register_backend(
    "reference-dense",
    description="PyTorch, unquantized weights, float32 math",
    factory=ReferenceDenseRunner,
    supports=reference_supports,
    priority=ORACLE,
    conversions=[Conversion(DENSE, _dense_as_is)],
)
"""The oracle of the dense format."""

REFERENCE_NVFP4: BackendKey[Nvfp4MoeWeights] = register_backend(
    "reference-nvfp4",
    description="PyTorch, NVFP4 W4A4 (FP4 activations), float32 math",
    factory=ReferenceNvfp4Runner,
    supports=reference_supports,
    priority=ORACLE,
    conversions=[Conversion(NVFP4, _nvfp4_as_is)],
)
"""The oracle of the NVFP4 format."""

REFERENCE_FP8: BackendKey[Fp8MoeWeights] = register_backend(
    "reference-fp8",
    description="PyTorch, FP8 W8A8 (static per-tensor scales), float32 math",
    factory=ReferenceFp8Runner,
    supports=reference_supports,
    priority=ORACLE,
    conversions=[Conversion(FP8, _fp8_as_is)],
)
"""The oracle of the FP8 format."""

REFERENCE_FP8_CHANNEL: BackendKey[Fp8ChannelMoeWeights] = register_backend(
    "reference-fp8-channel",
    description="PyTorch, FP8 W8A8 (per-channel weights, dynamic per-token activations), float32 math",
    factory=ReferenceFp8ChannelRunner,
    supports=reference_supports,
    priority=ORACLE,
    conversions=[Conversion(FP8_CHANNEL, _fp8_channel_as_is)],
)
"""The oracle of the per-channel FP8 format."""

REFERENCE_FP8_BLOCK: BackendKey[Fp8BlockMoeWeights] = register_backend(
    "reference-fp8-block",
    description="PyTorch, FP8 W8A8 (128x128 block weights, dynamic 1x128 activation groups), float32 math",
    factory=ReferenceFp8BlockRunner,
    supports=reference_supports,
    priority=ORACLE,
    conversions=[Conversion(FP8_BLOCK_SCALED, _fp8_block_as_is)],
)
"""The oracle of the block-scaled FP8 format."""

REFERENCE_NVFP4_W4A16: BackendKey[Nvfp4W4A16MoeWeights] = register_backend(
    "reference-nvfp4-w4a16",
    description="PyTorch, NVFP4 weights with unquantized activations (W4A16), float32 math",
    factory=ReferenceNvfp4W4A16Runner,
    supports=reference_supports,
    priority=ORACLE,
    conversions=[Conversion(NVFP4_W4A16, _nvfp4_w4a16_as_is)],
)
"""The oracle of the NVFP4 W4A16 format."""
