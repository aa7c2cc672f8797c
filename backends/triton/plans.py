"""What each Triton quant info launches: one typed plan per weight format, run by the one generic runner.

A plan (:class:`TritonPlan` of its quant info type) checks what a quant
info's shapes cannot say about the layer, chooses the block sizes (tuned
table or heuristic) and, for the W4A16 formats, the path (decoded in the
tile at decode, a 16-bit workspace at prefill), and builds the two GEMMs'
typed operands and how the FP8 inputs are quantized. Nothing in a plan looks
at a dtype to find the format: the plan is the format.
"""

from __future__ import annotations

import enum
import functools
from collections.abc import Callable
from typing import Protocol, TypeVar, final

import attrs
import torch

from moe_core import DispatchOutput, MoeRunnerConfig
from moe_core.backends.triton.configs import KernelConfig, choose, mxfp4_dequantizes, nvfp4_dequantizes
from moe_core.backends.triton.kernels import INTERPRETED
from moe_core.backends.triton.launch import (
    DenseOperand,
    Fp8BlockOperand,
    Fp8ChannelOperand,
    Fp8Inputs,
    Gemm,
    Mxfp4Operand,
    Mxfp4WorkspaceOperand,
    Nvfp4Operand,
    Nvfp4WorkspaceOperand,
    Operand,
    PerGroupFp8Activations,
)
from moe_core.backends.triton.quant_info import (
    Fp8Accumulation,
    TritonDenseWeights,
    TritonFp8BlockWeights,
    TritonFp8Weights,
    TritonMxfp4W4A16Weights,
    TritonNvfp4W4A16Weights,
)
from moe_core.formats.dense import ExpertBiases
from moe_core.runner import QuantInfo

Q_contra = TypeVar("Q_contra", bound=QuantInfo, contravariant=True)


@final
@attrs.frozen(eq=False)
class Launches:
    """One forward's two GEMMs and how their inputs are quantized."""

    w13: Gemm
    w2: Gemm
    inputs: Fp8Inputs = None


class TritonPlan(Protocol[Q_contra]):
    """How the runner launches one quant info type ``Q``."""

    def check(self, config: MoeRunnerConfig, quant_info: Q_contra) -> None:
        """Raise ``ValueError`` naming the field unless ``quant_info`` computes ``config``'s layer (metadata only)."""
        ...

    def launches(self, config: MoeRunnerConfig, dispatch: DispatchOutput, quant_info: Q_contra) -> Launches:
        """The GEMMs of one forward of ``dispatch``, block sizes chosen for its token count."""
        ...


@functools.cache
def _device_name(device: torch.device) -> str:
    """The name the tuned tables are keyed by, asked once per device (not on every forward)."""
    return torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"


def _configs(config: MoeRunnerConfig, dispatch: DispatchOutput, fmt: str) -> tuple[KernelConfig, KernelConfig]:
    """Both GEMMs' block sizes for this forward from the device's table under format key ``fmt``."""
    hidden = dispatch.hidden_states
    return choose(
        _device_name(hidden.device), int(hidden.shape[0]), config.top_k, config.num_local_experts,
        config.hidden_size, config.intermediate_size_per_partition, fmt, INTERPRETED,
    )


def _sixteen_bit(dtype: torch.dtype) -> str:
    """The table format of 16-bit weights or workspaces of ``dtype``."""
    return "bf16" if dtype == torch.bfloat16 else "fp16"


def check_biases(config: MoeRunnerConfig, biases: ExpertBiases | None) -> None:
    """``ValueError`` unless the weights carry biases exactly where the config says so."""
    if (biases is not None) != config.expert_biases:
        carried = "some" if biases is not None else "none"
        raise ValueError(f"quant_info: the config says expert_biases={config.expert_biases}, the weights carry {carried}")


def check_gated(config: MoeRunnerConfig) -> None:
    """``ValueError`` unless ``config``'s activation is gated: quantized weights hold gate and up halves."""
    if not config.activation.gated:
        raise ValueError(f"config.activation: these weights are gated (w13 [E, 2I, H]), not {config.activation.value}")


def check_gated_layer(config: MoeRunnerConfig) -> None:
    """``ValueError`` unless ``config`` is a gated layer without biases (NVFP4 and FP8 weights hold none)."""
    check_gated(config)
    if config.expert_biases:
        raise ValueError("config.expert_biases: these weights hold no expert biases")


def dense_gemms(quant_info: TritonDenseWeights, w13: KernelConfig, w2: KernelConfig) -> tuple[Gemm, Gemm]:
    """The two GEMM launches of dense weights (with their biases, if any) under the given block sizes."""
    inter, hidden = quant_info.intermediate_size, quant_info.hidden_size
    biases = quant_info.biases
    w13_bias, w2_bias = (None, None) if biases is None else (biases.w13, biases.w2)
    return (
        Gemm(DenseOperand(quant_info.w13), inter, hidden, w13, bias=w13_bias),
        Gemm(DenseOperand(quant_info.w2), hidden, inter, w2, bias=w2_bias),
    )


def nvfp4_w4a16_gemms(
    quant_info: TritonNvfp4W4A16Weights, w13: KernelConfig, w2: KernelConfig, dequantize: bool = False
) -> tuple[Gemm, Gemm]:
    """The two GEMM launches of NVFP4 W4A16 weights under the given block sizes: fused (decoded per tile) or, with
    ``dequantize``, each on its weights expanded into a 16-bit workspace first."""
    inter, hidden = quant_info.intermediate_size, quant_info.hidden_size
    w13_codes = Nvfp4Operand(quant_info.w13_packed, quant_info.w13_block_scales.data, quant_info.gate_up_dequant)
    w2_codes = Nvfp4Operand(quant_info.w2_packed, quant_info.w2_block_scales.data, quant_info.w2_scales.value)
    if dequantize:
        return Gemm(Nvfp4WorkspaceOperand(w13_codes), inter, hidden, w13), Gemm(Nvfp4WorkspaceOperand(w2_codes), hidden, inter, w2)
    return Gemm(w13_codes, inter, hidden, w13), Gemm(w2_codes, hidden, inter, w2)


def mxfp4_w4a16_gemms(
    quant_info: TritonMxfp4W4A16Weights, w13: KernelConfig, w2: KernelConfig, dequantize: bool = False
) -> tuple[Gemm, Gemm]:
    """The two GEMM launches of MXFP4 W4A16 weights (with their biases, if any) under the given block sizes: fused
    (decoded per tile) or, with ``dequantize``, each on its weights expanded into a bf16 workspace first."""
    inter, hidden = quant_info.intermediate_size, quant_info.hidden_size
    biases = quant_info.biases
    w13_bias, w2_bias = (None, None) if biases is None else (biases.w13, biases.w2)
    w13_codes = Mxfp4Operand(quant_info.w13_packed, quant_info.w13_scales.codes)
    w2_codes = Mxfp4Operand(quant_info.w2_packed, quant_info.w2_scales.codes)
    w13_operand: Operand = Mxfp4WorkspaceOperand(w13_codes) if dequantize else w13_codes
    w2_operand: Operand = Mxfp4WorkspaceOperand(w2_codes) if dequantize else w2_codes
    return Gemm(w13_operand, inter, hidden, w13, bias=w13_bias), Gemm(w2_operand, hidden, inter, w2, bias=w2_bias)


def fp8_gemms(quant_info: TritonFp8Weights, w13: KernelConfig, w2: KernelConfig) -> tuple[Gemm, Gemm]:
    """The two GEMM launches of FP8 weights under the given block sizes."""
    inter, hidden = quant_info.intermediate_size, quant_info.hidden_size
    promote = quant_info.accumulation is Fp8Accumulation.FLOAT32_EVERY_TILE
    return (
        Gemm(Fp8ChannelOperand(quant_info.w13, quant_info.w13_scales.value, promote), inter, hidden, w13),
        Gemm(Fp8ChannelOperand(quant_info.w2, quant_info.w2_scales.value, promote), hidden, inter, w2),
    )


def fp8_block_gemms(quant_info: TritonFp8BlockWeights, w13: KernelConfig, w2: KernelConfig) -> tuple[Gemm, Gemm]:
    """The two GEMM launches of block-scaled FP8 weights under the given block sizes."""
    inter, hidden = quant_info.intermediate_size, quant_info.hidden_size
    return (
        Gemm(Fp8BlockOperand(quant_info.w13, quant_info.w13_scales.value), inter, hidden, w13),
        Gemm(Fp8BlockOperand(quant_info.w2, quant_info.w2_scales.value), hidden, inter, w2),
    )


class W4A16Path(enum.Enum):
    """Where a W4A16 forward decodes its 4-bit weights."""

    FUSED = "fused"
    """In every weight tile of the fused GEMM (decode: the weights are read once)."""
    WORKSPACE = "workspace"
    """Into a 16-bit workspace first, then the 16-bit GEMM (prefill: every row block would decode them again)."""


Crossover = Callable[[str, int, int, int, int, int, bool], bool]
"""Whether a W4A16 format takes its workspace path: (device name, tokens, top-k, local experts, H, I, interpreted)."""


def _w4a16_path(forced: W4A16Path | None, crossover: Crossover, config: MoeRunnerConfig, dispatch: DispatchOutput) -> W4A16Path:
    """``forced``, else the path the device's measured (or default) crossover gives for this forward's tokens."""
    if forced is not None:
        return forced
    hidden = dispatch.hidden_states
    workspace = crossover(
        _device_name(hidden.device), int(hidden.shape[0]), config.top_k, config.num_local_experts,
        config.hidden_size, config.intermediate_size_per_partition, INTERPRETED,
    )
    return W4A16Path.WORKSPACE if workspace else W4A16Path.FUSED


@final
@attrs.frozen
class DensePlan:
    """bf16/fp16 weights (gated or ReLU^2, optional biases), tiles of their dtype's table."""

    def check(self, config: MoeRunnerConfig, quant_info: TritonDenseWeights) -> None:
        """The weights' halves and biases are the config's."""
        if quant_info.gated != config.activation.gated:
            inter = config.intermediate_size_per_partition
            rows = 2 * inter if config.activation.gated else inter
            raise ValueError(
                f"quant_info.w13: expected {rows} rows for {config.activation.value}, got {int(quant_info.w13.shape[1])}"
            )
        check_biases(config, quant_info.biases)

    def launches(self, config: MoeRunnerConfig, dispatch: DispatchOutput, quant_info: TritonDenseWeights) -> Launches:
        """The two 16-bit GEMMs."""
        return Launches(*dense_gemms(quant_info, *_configs(config, dispatch, _sixteen_bit(quant_info.w13.dtype))))


@final
@attrs.frozen
class Nvfp4W4A16Plan:
    """NVFP4 weights with 16-bit activations: fused below the crossover (:func:`~.configs.nvfp4_dequantizes`), a
    workspace from it on; ``path`` forces one (benchmarks)."""

    path: W4A16Path | None = None

    def check(self, config: MoeRunnerConfig, quant_info: TritonNvfp4W4A16Weights) -> None:
        """A gated layer without biases."""
        check_gated_layer(config)

    def launches(self, config: MoeRunnerConfig, dispatch: DispatchOutput, quant_info: TritonNvfp4W4A16Weights) -> Launches:
        """The fused or the workspace GEMMs, with that path's tiles."""
        if _w4a16_path(self.path, nvfp4_dequantizes, config, dispatch) is W4A16Path.WORKSPACE:
            tiles = _configs(config, dispatch, _sixteen_bit(dispatch.hidden_states.dtype))
            return Launches(*nvfp4_w4a16_gemms(quant_info, *tiles, dequantize=True))
        return Launches(*nvfp4_w4a16_gemms(quant_info, *_configs(config, dispatch, "nvfp4")))


@final
@attrs.frozen
class Mxfp4W4A16Plan:
    """MXFP4 weights (gpt-oss's biases allowed) with 16-bit activations: fused below the crossover
    (:func:`~.configs.mxfp4_dequantizes`), a bf16 workspace from it on; ``path`` forces one (benchmarks)."""

    path: W4A16Path | None = None

    def check(self, config: MoeRunnerConfig, quant_info: TritonMxfp4W4A16Weights) -> None:
        """A gated layer, biases where the config says."""
        check_gated(config)
        check_biases(config, quant_info.biases)

    def launches(self, config: MoeRunnerConfig, dispatch: DispatchOutput, quant_info: TritonMxfp4W4A16Weights) -> Launches:
        """The fused or the workspace GEMMs, with that path's tiles."""
        if _w4a16_path(self.path, mxfp4_dequantizes, config, dispatch) is W4A16Path.WORKSPACE:
            return Launches(*mxfp4_w4a16_gemms(quant_info, *_configs(config, dispatch, "bf16"), dequantize=True))
        return Launches(*mxfp4_w4a16_gemms(quant_info, *_configs(config, dispatch, "mxfp4")))


@final
@attrs.frozen
class Fp8Plan:
    """FP8 W8A8 weights with per-channel scales; the inputs quantized as the quant info's activations say."""

    def check(self, config: MoeRunnerConfig, quant_info: TritonFp8Weights) -> None:
        """A gated layer without biases."""
        check_gated_layer(config)

    def launches(self, config: MoeRunnerConfig, dispatch: DispatchOutput, quant_info: TritonFp8Weights) -> Launches:
        """The two FP8 GEMMs and the activations' scheme."""
        return Launches(*fp8_gemms(quant_info, *_configs(config, dispatch, "fp8")), quant_info.activations)


@final
@attrs.frozen
class Fp8BlockPlan:
    """Block-scaled FP8 weights; the inputs quantized per row and 128-column group."""

    def check(self, config: MoeRunnerConfig, quant_info: TritonFp8BlockWeights) -> None:
        """A gated layer without biases."""
        check_gated_layer(config)

    def launches(self, config: MoeRunnerConfig, dispatch: DispatchOutput, quant_info: TritonFp8BlockWeights) -> Launches:
        """The two block-scaled GEMMs."""
        return Launches(*fp8_block_gemms(quant_info, *_configs(config, dispatch, "fp8-block")), PerGroupFp8Activations())
