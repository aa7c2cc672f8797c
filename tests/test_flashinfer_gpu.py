"""FlashInfer's CUTLASS fused MoE for real, on a GPU where its backend runs, against the reference backend.

Skipped where ``flashinfer-cutlass-bf16`` is unavailable (the CPU, pre-Hopper
GPUs, no FlashInfer); on SM90 FlashInfer must find its fused-MoE module built.
The pruned bf16-only build used on the H200 (benchmarks/flashinfer_h200) lacks
the fp16 and FP8 kernels, and a call reaching them ends the process: run
``-k bfloat16`` there.

Tolerance: relative l2 error against ``reference-dense`` on the same bf16/fp16
weights; the kernel writes the gated activation in the activations' dtype
before the second GEMM and accumulates the top-k sum in its own order, so
two of that dtype's epsilons (bf16 1.6e-2, fp16 2e-3). FP8 against
``reference-fp8`` on the weights with w1/w3 on their shared scale: both round
the activation to FP8 from float32 (the kernel multiplies by the reciprocal
scale, the reference divides, so an E4M3 rounding may differ at a tie) and
write bf16; bound 1.6e-2.
"""

from __future__ import annotations

import math

import pytest
import torch

from moe_core import DenseMoeWeights, MoeRunnerConfig, StandardDispatchOutput, TopKOutput, create_runner, select_experts
from moe_core.backends.flashinfer_cutlass import FLASHINFER_CUTLASS_BF16, FLASHINFER_CUTLASS_FP8, bf16_device_support
from moe_core.capability import DeviceSpec
from moe_core.backends.flashinfer_cutlass.quant_info import CutlassBf16Weights, CutlassFp8Weights
from moe_core.backends.reference import REFERENCE_DENSE, REFERENCE_FP8
from moe_core.synthetic import quantize_fp8_layer
from tests.one_scale_layers import fp8_shared_scale
from moe_core.check import relative_error

CUDA = torch.device("cuda") if torch.cuda.is_available() else None
AVAILABLE = CUDA is not None and bf16_device_support(DeviceSpec.of(CUDA)).ok
pytestmark = pytest.mark.skipif(not AVAILABLE, reason="flashinfer-cutlass-bf16 is unavailable here")

TOLERANCE = {torch.bfloat16: 1.6e-2, torch.float16: 2e-3}

SHAPES = [
    # (tokens, experts, top_k, hidden, inter, local experts, offset)
    (1, 8, 2, 4096, 14336, 8, 0),
    (37, 128, 8, 2048, 768, 128, 0),
    (1000, 256, 8, 7168, 2048, 64, 64),
    (4096, 8, 2, 4096, 14336, 8, 0),
    (5, 8, 1, 256, 128, 2, 6),
]


def layer(
    shape: tuple[int, int, int, int, int, int, int], dtype: torch.dtype, gen: torch.Generator
) -> tuple[MoeRunnerConfig, DenseMoeWeights, StandardDispatchOutput]:
    assert CUDA is not None
    tokens, experts, top_k, hidden, inter, local, offset = shape
    config = MoeRunnerConfig(
        num_experts=experts, hidden_size=hidden, intermediate_size_per_partition=inter, top_k=top_k,
        num_local_experts=local, local_expert_offset=offset,
    )
    w13 = (torch.randn(local, 2 * inter, hidden, generator=gen) / math.sqrt(hidden)).to(CUDA, dtype)
    w2 = (torch.randn(local, hidden, inter, generator=gen) / math.sqrt(inter)).to(CUDA, dtype)
    x = torch.randn(tokens, hidden, generator=gen).to(CUDA, dtype)
    topk = select_experts(torch.randn(tokens, experts, generator=gen).to(CUDA), config)
    return config, DenseMoeWeights(w13=w13, w2=w2), StandardDispatchOutput(x, TopKOutput(topk.topk_ids, topk.topk_weights, num_experts=experts))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_cutlass_bf16_matches_reference(shape: tuple[int, int, int, int, int, int, int], dtype: torch.dtype, gen: torch.Generator) -> None:
    config, weights, dispatch = layer(shape, dtype, gen)
    tokens, hidden = dispatch.hidden_states.shape
    out = create_runner(FLASHINFER_CUTLASS_BF16, config).run(dispatch, CutlassBf16Weights.from_dense(weights))
    expected = create_runner(REFERENCE_DENSE, config).run(dispatch, weights)
    assert out.dtype == dtype and out.shape == (tokens, hidden)
    assert relative_error(out, expected) < TOLERANCE[dtype]


@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_cutlass_fp8_matches_reference(shape: tuple[int, int, int, int, int, int, int], gen: torch.Generator) -> None:
    config, dense, dispatch = layer(shape, torch.bfloat16, gen)
    weights = quantize_fp8_layer(config, dense, dispatch)
    out = create_runner(FLASHINFER_CUTLASS_FP8, config).run(dispatch, CutlassFp8Weights.from_fp8(weights))
    expected = create_runner(REFERENCE_FP8, config).run(dispatch, fp8_shared_scale(weights))
    assert out.dtype == torch.bfloat16 and out.shape == dispatch.hidden_states.shape
    assert relative_error(out, expected) < 1.6e-2
