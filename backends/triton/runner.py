"""The Triton backend's runners: sort the tokens, two grouped GEMMs, the combine; nothing else.

``run`` checks the dispatch and quant info from metadata only, allocates its
buffers from the caching allocator and reads nothing back to the host, so a
forward can be captured in a CUDA graph and replayed.
"""

from __future__ import annotations

import functools
import os
from typing import final

import attrs
import torch

from moe_core import Activation, DispatchFormat, DispatchOutput, MoeRunnerConfig, check_run_inputs
from moe_core.backends.triton.configs import KernelConfig, choose
from moe_core.backends.triton.kernels import GELU, SILU, combine_kernel, moe_gemm_kernel
from moe_core.backends.triton.quant_info import TritonDenseWeights, TritonNvfp4W4A16Weights
from moe_core.backends.triton.sorting import SortedTokens, cdiv, sort_tokens

COMBINE_BLOCK = 1024
"""Hidden columns per combine program."""


def interpreted() -> bool:
    """True under Triton's CPU interpreter (``TRITON_INTERPRET=1``)."""
    return os.environ.get("TRITON_INTERPRET") == "1"


@functools.cache
def _device_name(device: torch.device) -> str:
    """The name the tuned tables are keyed by, asked once per device (not on every forward)."""
    return torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"


@final
@attrs.frozen(eq=False)
class Gemm:
    """One grouped GEMM launch's operands: ``B`` (and for NVFP4 its block scales and per-expert dequantize
    factors), the output columns ``n``, the reduction ``k`` and the block sizes."""

    b: torch.Tensor
    b_scales: torch.Tensor | None
    dequant: torch.Tensor | None
    n: int
    k: int
    config: KernelConfig


def launch(
    a: torch.Tensor, gemm: Gemm, out: torch.Tensor, topk_weights: torch.Tensor, sorted_tokens: SortedTokens,
    top_k: int, gated: bool, activation: int,
) -> None:
    """Launch the grouped GEMM: gated (the first GEMM) or weighted by the top-k weights (the second)."""
    config = gemm.config
    grid = (sorted_tokens.max_blocks * cdiv(gemm.n, config.block_n),)
    scales, dequant = gemm.b_scales, gemm.dequant
    moe_gemm_kernel[grid](
        a, gemm.b, gemm.b if scales is None else scales, topk_weights if dequant is None else dequant,
        out, topk_weights, sorted_tokens.sorted_ids, sorted_tokens.expert_ids, sorted_tokens.num_rows,
        gemm.n, gemm.k, topk_weights.numel(), top_k, sorted_tokens.max_blocks,
        a.stride(0), gemm.b.stride(0), gemm.b.stride(1),
        0 if scales is None else scales.stride(0), 0 if scales is None else scales.stride(1),
        0 if dequant is None else (dequant.stride(0) if dequant.dim() > 1 else 1), out.stride(0),
        GATED=gated, NVFP4=scales is not None, ACTIVATION=activation, UPCAST=interpreted(),
        EVEN_K=gemm.k % config.block_k == 0, BLOCK_M=config.block_m, BLOCK_N=config.block_n,
        BLOCK_K=config.block_k, GROUP_M=config.group_m, num_warps=config.num_warps, num_stages=config.num_stages,
    )


def fused_moe(config: MoeRunnerConfig, dispatch: DispatchOutput, w13: Gemm, w2: Gemm) -> torch.Tensor:
    """Sort, ``act(x @ w13.T)``, ``@ w2.T`` times the top-k weights, and the combine."""
    hidden = dispatch.hidden_states
    ids, weights = dispatch.topk.topk_ids, dispatch.topk.topk_weights.contiguous()
    tokens, top_k = ids.shape
    sorted_tokens = sort_tokens(ids, config.num_local_experts, config.local_expert_offset, w13.config.block_m)
    activation = SILU if config.activation is Activation.SILU_GATED else GELU
    x = hidden.contiguous()
    inter = torch.empty((tokens * top_k, w13.n), dtype=hidden.dtype, device=hidden.device)
    launch(x, w13, inter, weights, sorted_tokens, top_k, True, activation)
    down = torch.empty((tokens * top_k, w2.n), dtype=hidden.dtype, device=hidden.device)
    launch(inter, w2, down, weights, sorted_tokens, top_k, False, activation)
    out = torch.empty_like(x)
    grid = (tokens, cdiv(w2.n, COMBINE_BLOCK))
    combine_kernel[grid](
        down, ids, out, w2.n, top_k, config.local_expert_offset, config.num_local_experts,
        config.routed_scaling_factor, down.stride(0), out.stride(0), BLOCK_H=COMBINE_BLOCK,
    )
    return out


def _configs(config: MoeRunnerConfig, dispatch: DispatchOutput, fmt: str) -> tuple[KernelConfig, KernelConfig]:
    hidden = dispatch.hidden_states
    return choose(
        _device_name(hidden.device), int(hidden.shape[0]), config.top_k, config.num_local_experts,
        config.hidden_size, config.intermediate_size_per_partition, fmt, interpreted(),
    )


def dense_gemms(quant_info: TritonDenseWeights, w13: KernelConfig, w2: KernelConfig) -> tuple[Gemm, Gemm]:
    """The two GEMM launches of dense weights under the given block sizes."""
    inter, hidden = quant_info.intermediate_size, quant_info.hidden_size
    return Gemm(quant_info.w13, None, None, inter, hidden, w13), Gemm(quant_info.w2, None, None, hidden, inter, w2)


def nvfp4_w4a16_gemms(quant_info: TritonNvfp4W4A16Weights, w13: KernelConfig, w2: KernelConfig) -> tuple[Gemm, Gemm]:
    """The two GEMM launches of NVFP4 W4A16 weights under the given block sizes."""
    inter, hidden = quant_info.intermediate_size, quant_info.hidden_size
    return (
        Gemm(quant_info.w13_packed, quant_info.w13_block_scales.data, quant_info.gate_up_dequant, inter, hidden, w13),
        Gemm(quant_info.w2_packed, quant_info.w2_block_scales.data, quant_info.w2_scales.value, hidden, inter, w2),
    )


@final
@attrs.frozen
class TritonDenseRunner:
    """bf16/fp16 experts through the fused Triton kernels."""

    config: MoeRunnerConfig

    def run(self, dispatch: DispatchOutput, quant_info: TritonDenseWeights, /) -> torch.Tensor:
        """The ``[T, H]`` MoE output in the activations' dtype."""
        check_run_inputs(self.config, dispatch, quant_info, (DispatchFormat.STANDARD,))
        fmt = "bf16" if quant_info.w13.dtype == torch.bfloat16 else "fp16"
        return fused_moe(self.config, dispatch, *dense_gemms(quant_info, *_configs(self.config, dispatch, fmt)))


@final
@attrs.frozen
class TritonNvfp4W4A16Runner:
    """NVFP4 weights with bf16/fp16 activations (W4A16), dequantized inside the fused Triton kernels."""

    config: MoeRunnerConfig

    def run(self, dispatch: DispatchOutput, quant_info: TritonNvfp4W4A16Weights, /) -> torch.Tensor:
        """The ``[T, H]`` MoE output in the activations' dtype."""
        check_run_inputs(self.config, dispatch, quant_info, (DispatchFormat.STANDARD,))
        return fused_moe(self.config, dispatch, *nvfp4_w4a16_gemms(quant_info, *_configs(self.config, dispatch, "nvfp4")))
