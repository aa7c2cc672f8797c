"""The Triton backend against the reference backends.

On the CPU the kernels run under Triton's interpreter (``TRITON_INTERPRET=1``,
set in ``conftest.py``) at tiny shapes, in fp16 and fp32 (the interpreter
multiplies bf16 wrongly; the kernels then compute their dot products in
float32). On a CUDA device the same checks run compiled, at real sizes, in
bf16 and fp16.

Tolerances (relative l2 against the reference on the same weights): the
kernels store the gated activation and the second GEMM's rows in the
activations' dtype before the combine (the reference keeps float32), so the
error is a few roundings of that dtype: fp16 6e-3 (6 of its epsilons), bf16
1.6e-2 (2 of its epsilons); float32 activations 1e-5 under the interpreter
(float32 dot products) and 5e-3 on a GPU (TF32 dot products).

FP8 W8A8 against the FP8 references on the same codes: with float32
activations the kernels' E4M3 codes are the reference's (IEEE division, the
same saturation and rounding), so only the summation order differs, and that
can move an intermediate value across an E4M3 rounding boundary: a rare code
flips (one seen on the CPU: 3e-4; bound 2e-3). On a GPU 5e-3: on the H200,
with the MMAs promoted to float32 every K tile, 3.4-3.6e-3 was seen at
K=4096-7168 (Hopper's FP8 MMAs keep fewer bits). Static scales quantize the
gated activation from float32 as the reference does (the 16-bit tolerances
above). Dynamic per-token scales quantize it after it is stored in the
activations' dtype (as vLLM and SGLang do), so a few percent of its codes
round to the neighbouring E4M3 value (1/16 apart): fp16 3e-2, bf16 5e-2
(worst seen on the CPU, fp16, T=1: 1.8e-2). Block-scaled FP8 sums its
per-group products in another order than the reference, so with float32
activations intermediate codes flip a little more often (3.4e-4 seen on the
CPU, 3.3-3.5e-3 on the H200; bound 5e-3).

gpt-oss's clamped SwiGLU, ReLU^2 and per-expert biases are checked the same
way, against the float32 reference on the kernels' own weights (and biases),
with the same tolerances: they change the epilogue's float32 arithmetic, not
what is rounded to the activations' dtype. Their layers' pre-activations are
spread wider than the clamp limit, so the clamp is hit from both sides (each
test checks that it is, and that the clamp and the biases move the output
well past the tolerance).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import attrs
import pytest
import torch

from moe_core import (
    Activation,
    ClampedSwiglu,
    DenseMoeWeights,
    Fp8ChannelExpertWeights,
    Fp8ChannelMoeWeights,
    Fp8BlockScales,
    Fp8ChannelScales,
    GateClamp,
    LimitedSwiglu,
    Llama4Sigmoid,
    MoeForward,
    MoeRunnerConfig,
    StandardDispatchOutput,
    TopKOutput,
    create_runner,
    select_experts,
)
from moe_core.capability import DeviceSpec, LayerSpec
from moe_core.config import ExpertActivation
from moe_core.formats import DENSE, FP8, FP8_BLOCK_SCALED, FP8_CHANNEL, MXFP4, NVFP4_W4A16, Mxfp4MoeWeights
from moe_core.formats.dense import ExpertBiases
from moe_core.backends.reference import (
    REFERENCE_DENSE,
    REFERENCE_MXFP4,
    REFERENCE_FP8,
    REFERENCE_FP8_BLOCK,
    REFERENCE_FP8_CHANNEL,
    REFERENCE_NVFP4_W4A16,
)
from moe_core.backends.triton import TRITON_DENSE, TRITON_FP8, TRITON_FP8_BLOCK, TRITON_NVFP4_W4A16, plans
from moe_core.backends.triton.quant_info import (
    DynamicFp8Activations,
    StaticFp8Activations,
    TritonDenseWeights,
    TritonFp8BlockWeights,
    TritonFp8Weights,
    TritonNvfp4W4A16Weights,
)
from moe_core.backends.triton.quantize import quantize_fp8_groups, quantize_fp8_rows
from moe_core.backends.triton.launch import dequantize_nvfp4
from moe_core.backends.triton.runner import TritonRunner
from moe_core.backends.triton.sorting import sort_tokens
from moe_core.check import relative_error
from moe_core.float64_moe import float64_moe
from moe_core.mxfp4 import Mxfp4ExpertWeights
from moe_core.registry import choose
from moe_core.fp8 import MIN_DYNAMIC_SCALE, Fp8TensorScale, dynamic_fp8_scales, fake_quantize_fp8, group_fp8_scales, quantize_fp8
from moe_core.nvfp4 import Nvfp4ExpertWeights, decode_e2m1, unpack_e2m1
from moe_core.synthetic import quantize_fp8_block_layer, quantize_fp8_channel_layer, quantize_fp8_layer, quantize_nvfp4_layer

CUDA = torch.cuda.is_available()
DEVICE = torch.device("cuda" if CUDA else "cpu")
TOLERANCE = {torch.float16: 6e-3, torch.bfloat16: 1.6e-2, torch.float32: 1e-5 if not CUDA else 5e-3}
DTYPES = [torch.bfloat16, torch.float16] if CUDA else [torch.float16, torch.float32]

FP8_DTYPES = [torch.bfloat16, torch.float32] if CUDA else [torch.float16, torch.float32]
FP8_EXACT = 5e-3 if CUDA else 2e-3
FP8_STATIC_TOLERANCE = {**TOLERANCE, torch.float32: FP8_EXACT}
FP8_DYNAMIC_TOLERANCE = {torch.float16: 3e-2, torch.bfloat16: 5e-2, torch.float32: FP8_EXACT}

SMALL = [
    # (tokens, experts, top_k, hidden, inter, local experts, offset)
    (1, 4, 1, 64, 32, 4, 0),
    (17, 8, 2, 64, 64, 8, 0),
    (9, 8, 3, 48, 80, 4, 4),
]
REAL = [
    (1, 8, 2, 4096, 14336, 8, 0),
    (37, 128, 8, 2048, 768, 128, 0),
    (1000, 256, 8, 7168, 2048, 64, 64),
    (8192, 8, 2, 4096, 14336, 8, 0),
]
SHAPES = REAL if CUDA else SMALL
BLOCK_SHAPES = REAL if CUDA else [(1, 4, 1, 128, 128, 4, 0), (9, 8, 2, 256, 128, 4, 4)]
"""Block-scaled FP8 needs H and I multiples of 128."""
FP8_BLOCK_TOLERANCE = {torch.float16: 5e-2, torch.bfloat16: 5e-2, torch.float32: 5e-3}
"""The kernel quantizes the gated activation after writing it in the hidden dtype, the reference from float32: an
element within an fp16 ulp of an E4M3 rounding boundary takes the other code (one 2^-3 step). At one token (128
outputs) a flip on a large element shows: 520 seeds of the T=1 fp16 case measured up to 3.5e-2 (seed 63)."""


def shape_id(shape: tuple[int, ...]) -> str:
    """A layer shape's test id: tokens, experts, top-k, hidden, intermediate, local experts."""
    return f"T{shape[0]}-E{shape[1]}-k{shape[2]}-H{shape[3]}-I{shape[4]}-local{shape[5]}"


def make_layer(
    gen: torch.Generator, shape: tuple[int, ...], dtype: torch.dtype,
    activation: ExpertActivation = Activation.SILU_GATED, *, gain: float = 1.0, biases: bool = False,
) -> tuple[MoeRunnerConfig, DenseMoeWeights, StandardDispatchOutput]:
    """A random layer: w13's rows scaled by ``gain`` (the up half twice more), ``I`` rows of it for a non-gated
    activation; with ``biases``, nonzero ones on both GEMMs (and the config says so)."""
    tokens, experts, top_k, hidden, inter, local, offset = shape
    config = MoeRunnerConfig(
        num_experts=experts, hidden_size=hidden, intermediate_size_per_partition=inter, top_k=top_k,
        num_local_experts=local, local_expert_offset=offset, activation=activation, routed_scaling_factor=1.5,
        expert_biases=biases,
    )
    weight_dtype = torch.float32 if dtype == torch.float32 else dtype
    w13 = torch.randn(local, 2 * inter, hidden, generator=gen) * (gain / math.sqrt(hidden))
    w13[:, inter:] *= 2.0
    if not activation.gated:
        w13 = w13[:, :inter].contiguous()
    w2 = (torch.randn(local, hidden, inter, generator=gen) / math.sqrt(inter)).to(weight_dtype)
    x = torch.randn(tokens, hidden, generator=gen).to(dtype)
    logits = torch.randn(tokens, experts, generator=gen)
    dispatch = StandardDispatchOutput(x.to(DEVICE), select_experts(logits.to(DEVICE), config))
    expert_biases = None
    if biases:
        w13_bias = (torch.randn(local, w13.shape[1], generator=gen) * 0.5).to(weight_dtype)
        w2_bias = (torch.randn(local, hidden, generator=gen) * 0.5).to(weight_dtype)
        expert_biases = ExpertBiases(w13=w13_bias.to(DEVICE), w2=w2_bias.to(DEVICE))
    return config, DenseMoeWeights(w13=w13.to(weight_dtype).to(DEVICE), w2=w2.to(DEVICE), biases=expert_biases), dispatch


@pytest.mark.parametrize("shape", SHAPES, ids=shape_id)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_dense_matches_reference(gen: torch.Generator, shape: tuple[int, ...], dtype: torch.dtype) -> None:
    config, weights, dispatch = make_layer(gen, shape, dtype)
    kernel_weights = TritonDenseWeights.from_dense(weights)
    out = create_runner(TRITON_DENSE, config).run(dispatch, kernel_weights)
    expected = create_runner(REFERENCE_DENSE, config).run(
        dispatch, DenseMoeWeights(w13=kernel_weights.w13, w2=kernel_weights.w2)
    )
    assert out.shape == dispatch.hidden_states.shape and out.dtype == dispatch.hidden_states.dtype
    assert relative_error(out, expected) < TOLERANCE[dtype]


@pytest.mark.parametrize("shape", SHAPES, ids=shape_id)
def test_nvfp4_w4a16_matches_reference(gen: torch.Generator, shape: tuple[int, ...]) -> None:
    dtype = DTYPES[0]
    config, dense, dispatch = make_layer(gen, shape, dtype)
    w4a4 = quantize_nvfp4_layer(config, DenseMoeWeights(w13=dense.w13.float(), w2=dense.w2.float()), dispatch)
    weights = w4a4.without_activation_quantization()
    assert not torch.equal(weights.w13.gate.global_scales.value, weights.w13.up.global_scales.value)
    out = create_runner(TRITON_NVFP4_W4A16, config).run(dispatch, TritonNvfp4W4A16Weights.from_nvfp4(weights))
    expected = create_runner(REFERENCE_NVFP4_W4A16, config).run(dispatch, weights)
    assert relative_error(out, expected) < TOLERANCE[dtype]


def test_nvfp4_dequantize_is_exact(gen: torch.Generator) -> None:
    """The prefill path's workspace: each code times its block scale, exactly, in every activation dtype."""
    weights = Nvfp4ExpertWeights.quantize(torch.randn(3, 40, 176, generator=gen).to(DEVICE))  # 88 bytes: a partial tile
    expected = (
        decode_e2m1(unpack_e2m1(weights.packed)).reshape(3, 40, 11, 16) * weights.block_scales.data.float()[..., None]
    ).reshape(3, 40, 176)
    for dtype in (torch.float16, torch.bfloat16, torch.float32):
        out = dequantize_nvfp4(weights.packed, weights.block_scales.data, dtype)
        assert out.dtype == dtype and torch.equal(out.float(), expected)


@pytest.mark.parametrize("shape", SHAPES, ids=shape_id)
def test_nvfp4_w4a16_dequantized_path_matches_reference(gen: torch.Generator, shape: tuple[int, ...]) -> None:
    """Prefill's path (weights expanded into a 16-bit workspace, global scales on the accumulator) at any token count:
    within the 16-bit tolerance of the reference and of the fused kernel (the same products, summed in another order)."""
    dtype = DTYPES[0]
    config, dense, dispatch = make_layer(gen, shape, dtype)
    w4a4 = quantize_nvfp4_layer(config, DenseMoeWeights(w13=dense.w13.float(), w2=dense.w2.float()), dispatch)
    weights = w4a4.without_activation_quantization()
    kernel_weights = TritonNvfp4W4A16Weights.from_nvfp4(weights)
    fused, out = (
        TritonRunner(config, plans.Nvfp4W4A16Plan(path)).run(dispatch, kernel_weights)
        for path in (plans.W4A16Path.FUSED, plans.W4A16Path.WORKSPACE)
    )
    expected = create_runner(REFERENCE_NVFP4_W4A16, config).run(dispatch, weights)
    assert relative_error(out, expected) < TOLERANCE[dtype]
    assert relative_error(out, fused) < TOLERANCE[dtype]


def fp8_layers(
    gen: torch.Generator, shape: tuple[int, ...], dtype: torch.dtype
) -> tuple[MoeRunnerConfig, StandardDispatchOutput, DenseMoeWeights]:
    config, dense, dispatch = make_layer(gen, shape, dtype)
    return config, dispatch, DenseMoeWeights(w13=dense.w13.float(), w2=dense.w2.float())


@pytest.mark.parametrize("shape", SHAPES, ids=shape_id)
@pytest.mark.parametrize("dtype", FP8_DTYPES, ids=str)
def test_fp8_per_tensor_static_matches_reference(gen: torch.Generator, shape: tuple[int, ...], dtype: torch.dtype) -> None:
    config, dispatch, dense = fp8_layers(gen, shape, dtype)
    weights = quantize_fp8_layer(config, dense, dispatch)
    assert not torch.equal(weights.w13.gate.scales.value, weights.w13.up.scales.value)
    out = create_runner(TRITON_FP8, config).run(dispatch, TritonFp8Weights.from_fp8(weights))
    expected = create_runner(REFERENCE_FP8, config).run(dispatch, weights)
    assert out.shape == dispatch.hidden_states.shape and out.dtype == dtype
    assert relative_error(out, expected) < FP8_STATIC_TOLERANCE[dtype]


@pytest.mark.parametrize("shape", SHAPES, ids=shape_id)
@pytest.mark.parametrize("dtype", FP8_DTYPES, ids=str)
def test_fp8_per_channel_dynamic_matches_reference(gen: torch.Generator, shape: tuple[int, ...], dtype: torch.dtype) -> None:
    config, dispatch, dense = fp8_layers(gen, shape, dtype)
    weights = quantize_fp8_channel_layer(config, dense, dispatch)
    out = create_runner(TRITON_FP8, config).run(dispatch, TritonFp8Weights.from_fp8_channel(weights))
    expected = create_runner(REFERENCE_FP8_CHANNEL, config).run(dispatch, weights)
    assert out.shape == dispatch.hidden_states.shape and out.dtype == dtype
    assert relative_error(out, expected) < FP8_DYNAMIC_TOLERANCE[dtype]


def repaired(weights: TritonFp8Weights, activations: StaticFp8Activations | DynamicFp8Activations) -> TritonFp8Weights:
    """``weights`` with another activations' scheme than their format's, through the private builder: no public path
    pairs them so (a checkpoint run so computes another layer), but the kernel runs every pairing, checked here."""
    return TritonFp8Weights._of(
        w13=weights.w13, w13_scales=weights.w13_scales, w2=weights.w2, w2_scales=weights.w2_scales, activations=activations
    )


def test_fp8_per_tensor_weights_with_dynamic_activations(gen: torch.Generator) -> None:
    """The other pairing: per-tensor weight scales (each half its own) with per-token activation scales."""
    config, dispatch, dense = fp8_layers(gen, SHAPES[1], torch.float32)
    weights = quantize_fp8_layer(config, dense, dispatch)
    kernel_weights = repaired(TritonFp8Weights.from_fp8(weights), DynamicFp8Activations())
    channel = Fp8ChannelMoeWeights(
        w13=Fp8ChannelExpertWeights(kernel_weights.w13, kernel_weights.w13_scales),
        w2=Fp8ChannelExpertWeights(kernel_weights.w2, kernel_weights.w2_scales),
    )
    out = create_runner(TRITON_FP8, config).run(dispatch, kernel_weights)
    expected = create_runner(REFERENCE_FP8_CHANNEL, config).run(dispatch, channel)
    assert relative_error(out, expected) < FP8_EXACT


def test_fp8_per_channel_weights_with_static_activations(gen: torch.Generator) -> None:
    """The other pairing: per-channel weight scales with calibrated static input scales, against the float64 MoE.

    At a small layer on every device: the tokens with an input at an E4M3 tie are left out, and at a real layer's
    width (H=2048, 8 experts a token) every token has some (36 of 37 left out on the H100)."""
    config, dispatch, dense = fp8_layers(gen, SMALL[1], torch.float32)
    scales = quantize_fp8_layer(config, dense, dispatch)
    channel = quantize_fp8_channel_layer(config, dense, dispatch)
    static = StaticFp8Activations(w13_input_scale=scales.w13_input_scale, w2_input_scale=scales.w2_input_scale)
    kernel_weights = repaired(TritonFp8Weights.from_fp8_channel(channel), static)
    out = create_runner(TRITON_FP8, config).run(dispatch, kernel_weights)
    on_cpu = (static.w13_input_scale.to("cpu"), static.w2_input_scale.to("cpu"))
    ties = E4m3Ties(config, dispatch)
    expected = float64_moe(
        config, dispatch, channel.w13.dequantize(), channel.w2.dequantize(),
        (ties.round_trip(on_cpu[0]), ties.round_trip(on_cpu[1])),
    )
    kept = ~ties.tokens()
    assert int(kept.sum()) >= dispatch.topk.num_tokens // 2
    assert relative_error(out[kept.to(out.device)], expected[kept].to(out.device)) < FP8_EXACT + 1e-5


class E4m3Ties:
    """The float64 MoE's static FP8 round trips, noting the tokens with a GEMM input at an E4M3 rounding midpoint
    (within 2^-16 relative): the kernel reaches those inputs in float32 and may round them the other way, one
    E4M3 step (MOE_CORE_SEED=245001349: 8.6e-3 over a whole batch, a handful of elements)."""

    def __init__(self, config: MoeRunnerConfig, dispatch: StandardDispatchOutput) -> None:
        ids = dispatch.topk.topk_ids.cpu() - config.local_expert_offset
        self._calls = [  # float64_moe's call order: token by token, each of its local experts
            t for t in range(ids.shape[0]) for k in range(ids.shape[1]) if 0 <= int(ids[t, k]) < config.num_local_experts
        ]
        self._seen = [0, 0]
        self._tied = torch.zeros(ids.shape[0], dtype=torch.bool)
        self._trips = 0

    def round_trip(self, scale: Fp8TensorScale) -> Callable[[int, torch.Tensor], torch.Tensor]:
        """The round trip of one GEMM's input under ``scale``, noting tied tokens (call it once per GEMM, in order)."""
        gemm = self._trips
        self._trips += 1

        def trip(_: int, x: torch.Tensor) -> torch.Tensor:
            token = self._calls[self._seen[gemm]]
            self._seen[gemm] += 1
            low, high = (fake_quantize_fp8((x * (1 + d)).float(), scale) for d in (-2.0**-16, 2.0**-16))
            if not torch.equal(low, high):
                self._tied[token] = True
            return fake_quantize_fp8(x.float(), scale).double()

        return trip

    def tokens(self) -> torch.Tensor:
        """``[T]`` bool: the tokens with a tied input in either GEMM."""
        return self._tied


def test_fp8_row_quantization_equals_torch(gen: torch.Generator) -> None:
    """The kernel's E4M3 codes are torch's for its scales, bit for bit, per token and static; the per-token scales
    are torch's within one float32 rounding (torch on CUDA divides by a scalar as a multiply by its reciprocal);
    a zero row takes the scale floor."""
    x = (torch.randn(6, 300, generator=gen) * torch.logspace(-3, 3, 6)[:, None]).to(DEVICE)
    x[2] = 0.0
    codes, scales = quantize_fp8_rows(x, None)
    torch.testing.assert_close(scales, dynamic_fp8_scales(x)[:, 0], rtol=2**-23, atol=0)
    assert float(scales[2]) == pytest.approx(MIN_DYNAMIC_SCALE)
    assert torch.equal(codes.view(torch.uint8), quantize_fp8(x, scales[:, None]).view(torch.uint8))
    static = torch.tensor([0.01], device=DEVICE)
    codes, scales = quantize_fp8_rows(x, static)
    assert scales is static
    assert torch.equal(codes.view(torch.uint8), quantize_fp8(x, static).view(torch.uint8))


@pytest.mark.parametrize("shape", BLOCK_SHAPES, ids=shape_id)
@pytest.mark.parametrize("dtype", FP8_DTYPES, ids=str)
def test_fp8_block_matches_reference(gen: torch.Generator, shape: tuple[int, ...], dtype: torch.dtype) -> None:
    config, dispatch, dense = fp8_layers(gen, shape, dtype)
    weights = quantize_fp8_block_layer(config, dense, dispatch)
    out = create_runner(TRITON_FP8_BLOCK, config).run(dispatch, TritonFp8BlockWeights.from_fp8_block(weights))
    expected = create_runner(REFERENCE_FP8_BLOCK, config).run(dispatch, weights)
    assert out.shape == dispatch.hidden_states.shape and out.dtype == dtype
    assert relative_error(out, expected) < FP8_BLOCK_TOLERANCE[dtype]


def test_fp8_group_quantization_equals_torch(gen: torch.Generator) -> None:
    """Per-group codes are torch's for the kernel's scales; the scales are torch's within one float32 rounding."""
    x = (torch.randn(5, 384, generator=gen) * torch.logspace(-2, 2, 384)[None, :]).to(DEVICE)
    codes, scales = quantize_fp8_groups(x)
    torch.testing.assert_close(scales, group_fp8_scales(x), rtol=2**-23, atol=0)
    expected = quantize_fp8(x.reshape(5, 3, 128), scales[:, :, None]).reshape(5, 384)
    assert torch.equal(codes.view(torch.uint8), expected.view(torch.uint8))
    with pytest.raises(ValueError, match="expected a multiple of 128 columns, got 200"):
        quantize_fp8_groups(x[:, :200])


def test_fp8_block_refuses_sizes_off_the_128_grid(gen: torch.Generator) -> None:
    codes = torch.randn(2, 192, 128, generator=gen).to(torch.float8_e4m3fn)
    with pytest.raises(ValueError, match="expected dimensions that are multiples of 128, got \\(192, 128\\)"):
        TritonFp8BlockWeights(
            w13=codes, w13_scales=Fp8BlockScales.from_checkpoint(torch.ones(2, 2, 1)),
            w2=torch.randn(2, 128, 96, generator=gen).to(torch.float8_e4m3fn), w2_scales=Fp8BlockScales.from_checkpoint(torch.ones(2, 1, 1)),
        )


@pytest.mark.parametrize("activation", [Activation.GELU_GATED, Activation.GELU_TANH_GATED], ids=lambda a: a.value)
def test_gelu_and_uneven_k(gen: torch.Generator, activation: Activation) -> None:
    config, weights, dispatch = make_layer(gen, (5, 4, 2, 40, 24, 4, 0), DTYPES[0], activation)
    kernel_weights = TritonDenseWeights.from_dense(weights)
    out = create_runner(TRITON_DENSE, config).run(dispatch, kernel_weights)
    expected = create_runner(REFERENCE_DENSE, config).run(dispatch, DenseMoeWeights(w13=kernel_weights.w13, w2=kernel_weights.w2))
    assert relative_error(out, expected) < TOLERANCE[DTYPES[0]]


@pytest.mark.parametrize("routing", ["all-on-one-expert", "expert-without-tokens", "all-elsewhere"])
def test_odd_routings(gen: torch.Generator, routing: str) -> None:
    tokens = 19
    config, weights, dispatch = make_layer(gen, (tokens, 8, 2, 64, 32, 4, 4), DTYPES[0])
    if routing == "all-on-one-expert":
        ids = torch.tensor([[5, 1]] * tokens, dtype=torch.int32)
    elif routing == "expert-without-tokens":
        ids = torch.stack([torch.tensor([4, 6]), torch.tensor([5, 7])] * 9 + [torch.tensor([4, 0])]).to(torch.int32)
    else:
        ids = torch.tensor([[0, 3]] * tokens, dtype=torch.int32)
    weights_of_k = torch.rand(tokens, 2, generator=gen)
    topk = TopKOutput(ids.to(DEVICE), (weights_of_k / weights_of_k.sum(dim=1, keepdim=True)).to(DEVICE), num_experts=8)
    dispatch = StandardDispatchOutput(dispatch.hidden_states, topk)
    kernel_weights = TritonDenseWeights.from_dense(weights)
    out = create_runner(TRITON_DENSE, config).run(dispatch, kernel_weights)
    expected = create_runner(REFERENCE_DENSE, config).run(dispatch, DenseMoeWeights(w13=kernel_weights.w13, w2=kernel_weights.w2))
    if routing == "all-elsewhere":
        assert torch.count_nonzero(out) == 0  # nothing routed to this rank's experts contributes
    else:
        assert relative_error(out, expected) < TOLERANCE[DTYPES[0]]


def test_top_k_ids_that_are_a_column_view_combine_as_contiguous_ones(gen: torch.Generator) -> None:
    """Expert parallelism with ``topk_ids`` a column slice of a wider tensor (an engine that appends a fused shared
    expert's id): the combine reads each token's ids as the sort did (once garbage: uninitialized rows summed)."""
    config, weights, dispatch = make_layer(gen, (19, 8, 2, 64, 32, 4, 4), DTYPES[0])
    topk = dispatch.topk
    wide = torch.cat((topk.topk_ids, torch.full((19, 1), 7, dtype=torch.int32, device=DEVICE)), dim=1)
    sliced = TopKOutput(wide[:, :2], topk.topk_weights, topk.router_logits, num_experts=8, from_router_logits=False)
    assert not sliced.topk_ids.is_contiguous()
    kernel_weights = TritonDenseWeights.from_dense(weights)
    runner = create_runner(TRITON_DENSE, config)
    out = runner.run(StandardDispatchOutput(dispatch.hidden_states, sliced), kernel_weights)
    assert torch.equal(out, runner.run(dispatch, kernel_weights))
    expected = create_runner(REFERENCE_DENSE, config).run(dispatch, DenseMoeWeights(w13=kernel_weights.w13, w2=kernel_weights.w2))
    assert relative_error(out, expected) < TOLERANCE[DTYPES[0]]


def test_a_runner_taken_by_key_refuses_input_side_weights() -> None:
    """``create_runner``/``key.bind`` never ask ``supports``: the runner itself refuses Llama 4's routing, whose
    weights scale the experts' inputs (the kernels weight outputs: 0.57 off, silently, before)."""
    config = MoeRunnerConfig(num_experts=4, hidden_size=64, intermediate_size_per_partition=64, top_k=1,
                             routing_method=Llama4Sigmoid())
    refusal = r"weight each expert's output, not its input \(llama4_sigmoid routing\)"
    for make in (
        lambda: create_runner(TRITON_DENSE, config), lambda: create_runner(TRITON_FP8, config),
        lambda: create_runner(TRITON_FP8_BLOCK, config), lambda: create_runner(TRITON_NVFP4_W4A16, config),
    ):
        with pytest.raises(ValueError, match=refusal):
            make()


@pytest.mark.parametrize(("tokens", "top_k", "experts", "local", "offset", "block_m"), [
    (1, 1, 4, 4, 0, 16), (37, 3, 16, 8, 4, 16), (200, 8, 64, 16, 48, 64), (5, 2, 8, 8, 0, 128),
    (700, 8, 64, 16, 48, 64), (600, 8, 256, 256, 0, 16),  # over ONE_PROGRAM_PAIRS: the three-launch sort
])
def test_sorting_groups_every_local_pair_once(
    gen: torch.Generator, tokens: int, top_k: int, experts: int, local: int, offset: int, block_m: int
) -> None:
    ids = torch.stack([torch.randperm(experts, generator=gen)[:top_k] for _ in range(tokens)]).to(torch.int32)
    result = sort_tokens(ids.to(DEVICE), local, offset, block_m)
    flat = ids.reshape(-1)
    rows, sorted_ids, expert_ids = int(result.num_rows), result.sorted_ids.cpu(), result.expert_ids.cpu()
    assert rows % block_m == 0 and rows <= sorted_ids.numel()
    for block in range(rows // block_m):
        pairs = sorted_ids[block * block_m : (block + 1) * block_m]
        real = pairs[pairs < flat.numel()]
        assert real.numel() > 0, "a block in use holds at least one pair"
        assert bool((flat[real.long()] - offset == expert_ids[block]).all())
    assert bool((expert_ids[rows // block_m :] == -1).all())
    placed = sorted(int(p) for p in sorted_ids[:rows] if p < flat.numel())
    assert placed == [i for i in range(flat.numel()) if offset <= int(flat[i]) < offset + local]


def bound_forward(fmt: str, config: MoeRunnerConfig, weights: DenseMoeWeights, dispatch: StandardDispatchOutput) -> MoeForward:
    """The layer through the Triton backend of ``fmt`` (FP8 ones quantized from ``weights``)."""
    dense = DenseMoeWeights(w13=weights.w13.float(), w2=weights.w2.float())
    if fmt == "dense":
        return TRITON_DENSE.bind(config, TritonDenseWeights.from_dense(weights))
    if fmt == "fp8-static":
        return TRITON_FP8.bind(config, TritonFp8Weights.from_fp8(quantize_fp8_layer(config, dense, dispatch)))
    if fmt == "fp8-dynamic":
        return TRITON_FP8.bind(config, TritonFp8Weights.from_fp8_channel(quantize_fp8_channel_layer(config, dense, dispatch)))
    if fmt == "nvfp4-w4a16":
        nvfp4 = quantize_nvfp4_layer(config, dense, dispatch).without_activation_quantization()
        return TRITON_NVFP4_W4A16.bind(config, TritonNvfp4W4A16Weights.from_nvfp4(nvfp4))
    return TRITON_FP8_BLOCK.bind(config, TritonFp8BlockWeights.from_fp8_block(quantize_fp8_block_layer(config, dense, dispatch)))


@pytest.mark.skipif(not CUDA, reason="needs CUDA graphs")
@pytest.mark.parametrize("fmt", ["dense", "fp8-static", "fp8-dynamic", "fp8-block", "nvfp4-w4a16", "nvfp4-w4a16-dequantized"])
def test_forward_is_captured_and_replayed_in_a_cuda_graph(gen: torch.Generator, fmt: str, monkeypatch: pytest.MonkeyPatch) -> None:
    if fmt == "nvfp4-w4a16-dequantized":  # the workspace allocated inside the capture
        monkeypatch.setattr(plans, "nvfp4_dequantizes", lambda *_: True)
    config, weights, dispatch = make_layer(gen, (16, 64, 8, 2048, 768, 64, 0), torch.bfloat16)
    forward_of = bound_forward(fmt.removesuffix("-dequantized"), config, weights, dispatch)
    static_x = dispatch.hidden_states.clone()
    static_ids, static_w = dispatch.topk.topk_ids.clone(), dispatch.topk.topk_weights.clone()

    def forward() -> torch.Tensor:
        topk = TopKOutput(static_ids, static_w, num_experts=config.num_experts, check_values=False)
        return forward_of(StandardDispatchOutput(static_x, topk))

    forward()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = forward()
    _, _, fresh = make_layer(gen, (16, 64, 8, 2048, 768, 64, 0), torch.bfloat16)
    static_x.copy_(fresh.hidden_states)
    static_ids.copy_(fresh.topk.topk_ids)
    static_w.copy_(fresh.topk.topk_weights)
    graph.replay()
    torch.testing.assert_close(captured, forward_of(fresh), rtol=0, atol=0)


def test_shapes_that_disagree_with_the_config_are_refused(gen: torch.Generator) -> None:
    config, weights, dispatch = make_layer(gen, (3, 4, 2, 64, 32, 4, 0), DTYPES[0])
    other = MoeRunnerConfig(num_experts=4, hidden_size=64, intermediate_size_per_partition=64, top_k=2)
    with pytest.raises(ValueError, match="quant_info.intermediate_size: expected 64 from the config, got 32"):
        create_runner(TRITON_DENSE, other).run(dispatch, TritonDenseWeights.from_dense(weights))
    with pytest.raises(TypeError, match="TritonDenseWeights.w13: expected dtype torch.bfloat16 or torch.float16"):
        TritonDenseWeights(w13=weights.w13.float(), w2=weights.w2.float())


CLAMP = ClampedSwiglu(alpha=1.702, limit=3.0)
"""gpt-oss's alpha with a limit the test layers' pre-activations exceed: with ``gain`` 3 the gate half has a
standard deviation of about 3 (above 3 about 16% of the time), the up half about 6 (outside [-3, 3] about 60%)."""
CLAMP_GAIN = 3.0


def as_dense(weights: TritonDenseWeights) -> DenseMoeWeights:
    """The kernels' own weights and biases in the dense format, for the reference."""
    return DenseMoeWeights(w13=weights.w13, w2=weights.w2, biases=weights.biases)


def pre_activations(weights: DenseMoeWeights, dispatch: StandardDispatchOutput) -> tuple[torch.Tensor, torch.Tensor]:
    """Every token's float32 ``x @ w13.T (+ bias)`` for every local expert, split into gate and up halves."""
    x = dispatch.hidden_states.float()
    h = torch.einsum("th,erh->etr", x, weights.w13.float())
    if weights.biases is not None:
        h = h + weights.biases.w13.float()[:, None, :]
    gate, up = h.chunk(2, dim=-1)
    return gate, up


def assert_clamp_is_hit(weights: DenseMoeWeights, dispatch: StandardDispatchOutput, limit: float) -> None:
    gate, up = pre_activations(weights, dispatch)
    assert float((gate > limit).float().mean()) > 0.02, "the gate's clamp from above is hit"
    assert float((gate < -limit).float().mean()) > 0.02, "and the gate runs below -limit, unclamped"
    assert float((up > limit).float().mean()) > 0.05 and float((up < -limit).float().mean()) > 0.05, "up clamps both ways"


@pytest.mark.parametrize("shape", SHAPES, ids=shape_id)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_dense_clamped_swiglu_with_biases_matches_reference(
    gen: torch.Generator, shape: tuple[int, ...], dtype: torch.dtype
) -> None:
    """gpt-oss's layer: the clamped SwiGLU and both GEMMs' biases in the fused epilogues, against the float32
    reference; the clamp and the biases each move the output far beyond the tolerance."""
    config, weights, dispatch = make_layer(gen, shape, dtype, CLAMP, gain=CLAMP_GAIN, biases=True)
    kernel_weights = TritonDenseWeights.from_dense(weights)
    assert kernel_weights.biases is not None
    assert_clamp_is_hit(as_dense(kernel_weights), dispatch, CLAMP.limit)
    out = create_runner(TRITON_DENSE, config).run(dispatch, kernel_weights)
    expected = create_runner(REFERENCE_DENSE, config).run(dispatch, as_dense(kernel_weights))
    assert out.shape == dispatch.hidden_states.shape and out.dtype == dispatch.hidden_states.dtype
    assert relative_error(out, expected) < TOLERANCE[dtype]
    unclamped = attrs.evolve(config, activation=ClampedSwiglu(alpha=CLAMP.alpha, limit=1e4))
    assert relative_error(create_runner(REFERENCE_DENSE, unclamped).run(dispatch, as_dense(kernel_weights)), expected) > 0.05
    unbiased = attrs.evolve(config, expert_biases=False)
    no_biases = DenseMoeWeights(w13=kernel_weights.w13, w2=kernel_weights.w2)
    assert relative_error(create_runner(REFERENCE_DENSE, unbiased).run(dispatch, no_biases), expected) > 0.05


LIMIT = 1.0
"""A limit where the two placements of the gate's clamp differ much (``silu(1) = 0.73``) and the test layers'
pre-activations (gain 3) pass it often."""
LIMITS = {clamp: LimitedSwiglu(limit=LIMIT, gate_clamp=clamp) for clamp in GateClamp}
"""SiLU with limits, each placement of the gate's clamp."""


@pytest.mark.parametrize("clamp", list(GateClamp), ids=lambda c: c.value)
@pytest.mark.parametrize("shape", SHAPES, ids=shape_id)
def test_dense_limited_swiglu_matches_reference(gen: torch.Generator, shape: tuple[int, ...], clamp: GateClamp) -> None:
    """DeepSeek-V4's / GLM-5-Next's and Step 3.7's SiLU with limits in the fused epilogue, against the float32
    reference: the clamp is hit both ways, and the other placement of the gate's clamp, or none, is far off."""
    dtype = DTYPES[0]
    config, weights, dispatch = make_layer(gen, shape, dtype, LIMITS[clamp], gain=CLAMP_GAIN)
    assert_clamp_is_hit(weights, dispatch, LIMIT)
    out = create_runner(TRITON_DENSE, config).run(dispatch, TritonDenseWeights.from_dense(weights))
    expected = create_runner(REFERENCE_DENSE, config).run(dispatch, weights)
    assert relative_error(out, expected) < TOLERANCE[dtype]
    other = GateClamp.AFTER_SILU if clamp is GateClamp.BEFORE_SILU else GateClamp.BEFORE_SILU
    for wrong in (LIMITS[other], Activation.SILU_GATED):
        wrong_out = create_runner(REFERENCE_DENSE, attrs.evolve(config, activation=wrong)).run(dispatch, weights)
        assert relative_error(wrong_out, expected) > 0.05, wrong.value


@pytest.mark.parametrize("clamp", list(GateClamp), ids=lambda c: c.value)
@pytest.mark.parametrize("fmt", ["fp8-static", "nvfp4-w4a16"])
def test_quantized_limited_swiglu_matches_reference(gen: torch.Generator, fmt: str, clamp: GateClamp) -> None:
    """SiLU with limits in the quantized paths' shared epilogue, against each format's reference on the same codes."""
    dtype = torch.float32 if fmt == "fp8-static" else DTYPES[0]
    config, weights, dispatch = make_layer(gen, SHAPES[1], dtype, LIMITS[clamp], gain=CLAMP_GAIN)
    assert_clamp_is_hit(weights, dispatch, LIMIT)
    dense = DenseMoeWeights(w13=weights.w13.float(), w2=weights.w2.float())
    if fmt == "fp8-static":
        fp8 = quantize_fp8_layer(config, dense, dispatch)
        out = create_runner(TRITON_FP8, config).run(dispatch, TritonFp8Weights.from_fp8(fp8))
        expected, tolerance = create_runner(REFERENCE_FP8, config).run(dispatch, fp8), FP8_STATIC_TOLERANCE[dtype]
    else:
        nvfp4 = quantize_nvfp4_layer(config, dense, dispatch).without_activation_quantization()
        out = create_runner(TRITON_NVFP4_W4A16, config).run(dispatch, TritonNvfp4W4A16Weights.from_nvfp4(nvfp4))
        expected, tolerance = create_runner(REFERENCE_NVFP4_W4A16, config).run(dispatch, nvfp4), TOLERANCE[dtype]
    assert relative_error(out, expected) < tolerance


@pytest.mark.parametrize("biases", [False, True], ids=["no-biases", "biases"])
@pytest.mark.parametrize("shape", SHAPES, ids=shape_id)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_dense_relu2_matches_reference(gen: torch.Generator, shape: tuple[int, ...], dtype: torch.dtype, biases: bool) -> None:
    """Non-gated ReLU^2 (w13 of I rows), with and without biases, against the float32 reference."""
    config, weights, dispatch = make_layer(gen, shape, dtype, Activation.RELU2, biases=biases)
    kernel_weights = TritonDenseWeights.from_dense(weights)
    assert not kernel_weights.gated and kernel_weights.intermediate_size == shape[4]
    out = create_runner(TRITON_DENSE, config).run(dispatch, kernel_weights)
    expected = create_runner(REFERENCE_DENSE, config).run(dispatch, as_dense(kernel_weights))
    assert relative_error(out, expected) < TOLERANCE[dtype]


@pytest.mark.parametrize("activation", [CLAMP, Activation.RELU2, Activation.GELU_GATED], ids=lambda a: a.value)
def test_biases_alone_and_uneven_k(gen: torch.Generator, activation: ExpertActivation) -> None:
    """Biases with the other activations, and K not a multiple of the tile (masked loads before the epilogue)."""
    config, weights, dispatch = make_layer(gen, (5, 4, 2, 40, 24, 4, 0), DTYPES[0], activation, gain=CLAMP_GAIN, biases=True)
    kernel_weights = TritonDenseWeights.from_dense(weights)
    out = create_runner(TRITON_DENSE, config).run(dispatch, kernel_weights)
    expected = create_runner(REFERENCE_DENSE, config).run(dispatch, as_dense(kernel_weights))
    assert relative_error(out, expected) < TOLERANCE[DTYPES[0]]


QUANTIZED_CLAMPED = ["fp8-static", "fp8-dynamic", "fp8-block", "nvfp4-w4a16", "nvfp4-w4a16-dequantized"]


@pytest.mark.parametrize("fmt", QUANTIZED_CLAMPED)
def test_quantized_clamped_swiglu_matches_reference(gen: torch.Generator, fmt: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The clamped SwiGLU in the quantized paths' shared epilogue (no biases: those formats hold none), against
    each format's reference on the same codes, with the format's own tolerance."""
    dtype = torch.float32 if fmt.startswith("fp8") else DTYPES[0]
    shape = BLOCK_SHAPES[1] if fmt == "fp8-block" else SHAPES[1]
    config, weights, dispatch = make_layer(gen, shape, dtype, CLAMP, gain=CLAMP_GAIN)
    assert_clamp_is_hit(weights, dispatch, CLAMP.limit)
    dense = DenseMoeWeights(w13=weights.w13.float(), w2=weights.w2.float())
    if fmt == "fp8-static":
        fp8 = quantize_fp8_layer(config, dense, dispatch)
        out = create_runner(TRITON_FP8, config).run(dispatch, TritonFp8Weights.from_fp8(fp8))
        expected, tolerance = create_runner(REFERENCE_FP8, config).run(dispatch, fp8), FP8_STATIC_TOLERANCE[dtype]
    elif fmt == "fp8-dynamic":
        channel = quantize_fp8_channel_layer(config, dense, dispatch)
        out = create_runner(TRITON_FP8, config).run(dispatch, TritonFp8Weights.from_fp8_channel(channel))
        expected, tolerance = create_runner(REFERENCE_FP8_CHANNEL, config).run(dispatch, channel), FP8_DYNAMIC_TOLERANCE[dtype]
    elif fmt == "fp8-block":
        block = quantize_fp8_block_layer(config, dense, dispatch)
        out = create_runner(TRITON_FP8_BLOCK, config).run(dispatch, TritonFp8BlockWeights.from_fp8_block(block))
        expected, tolerance = create_runner(REFERENCE_FP8_BLOCK, config).run(dispatch, block), FP8_BLOCK_TOLERANCE[dtype]
    else:
        monkeypatch.setattr(plans, "nvfp4_dequantizes", lambda *_: fmt.endswith("-dequantized"))
        nvfp4 = quantize_nvfp4_layer(config, dense, dispatch).without_activation_quantization()
        out = create_runner(TRITON_NVFP4_W4A16, config).run(dispatch, TritonNvfp4W4A16Weights.from_nvfp4(nvfp4))
        expected, tolerance = create_runner(REFERENCE_NVFP4_W4A16, config).run(dispatch, nvfp4), TOLERANCE[dtype]
    assert relative_error(out, expected) < tolerance


ON_GPU = DeviceSpec.parse("sm90+triton")
"""An H100/H200 as the capability answers see it (nothing is launched)."""


def test_capability_answers_name_what_each_path_computes() -> None:
    """Dense weights: every activation, ReLU^2 and biases included; the quantized formats: the gated activations
    with the clamped SwiGLU, and named refusals for ReLU^2 (their weights are gated) and biases (they hold none)."""
    base = MoeRunnerConfig(num_experts=8, hidden_size=1024, intermediate_size_per_partition=1024, top_k=2)
    layers = {
        "clamped": attrs.evolve(base, activation=ClampedSwiglu(alpha=1.702, limit=7.0)),
        "clamped+biases": attrs.evolve(base, activation=ClampedSwiglu(), expert_biases=True),
        "relu2": attrs.evolve(base, activation=Activation.RELU2),
        "relu2+biases": attrs.evolve(base, activation=Activation.RELU2, expert_biases=True),
        "biases": attrs.evolve(base, expert_biases=True),
    }
    for name, config in layers.items():
        support = TRITON_DENSE.supports(ON_GPU, LayerSpec(config, DENSE, torch.bfloat16))
        assert support.ok, (name, support.describe())
    for key, fmt in ((TRITON_FP8, FP8), (TRITON_FP8, FP8_CHANNEL), (TRITON_FP8_BLOCK, FP8_BLOCK_SCALED),
                     (TRITON_NVFP4_W4A16, NVFP4_W4A16)):
        assert key.supports(ON_GPU, LayerSpec(layers["clamped"], fmt, torch.bfloat16)).ok, fmt.name
        relu2 = key.supports(ON_GPU, LayerSpec(layers["relu2"], fmt, torch.bfloat16))
        assert relu2.reasons == (f"the {fmt.name} weights are gated (w13 [E, 2I, H]), not relu2",)
        biases = key.supports(ON_GPU, LayerSpec(layers["biases"], fmt, torch.bfloat16))
        assert biases.reasons == (f"the {fmt.name} weights hold no expert biases",)


def test_weights_that_disagree_with_the_activation_or_biases_are_refused(gen: torch.Generator) -> None:
    config, weights, dispatch = make_layer(gen, (3, 4, 2, 64, 32, 4, 0), DTYPES[0], biases=True)
    kernel_weights = TritonDenseWeights.from_dense(weights)
    with pytest.raises(ValueError, match="the config says expert_biases=False, the weights carry some"):
        create_runner(TRITON_DENSE, attrs.evolve(config, expert_biases=False)).run(dispatch, kernel_weights)
    unbiased = TritonDenseWeights(w13=kernel_weights.w13, w2=kernel_weights.w2)
    with pytest.raises(ValueError, match="the config says expert_biases=True, the weights carry none"):
        create_runner(TRITON_DENSE, config).run(dispatch, unbiased)
    relu2 = attrs.evolve(config, activation=Activation.RELU2, expert_biases=False)
    with pytest.raises(ValueError, match="quant_info.w13: expected 32 rows for relu2, got 64"):
        create_runner(TRITON_DENSE, relu2).run(dispatch, unbiased)
    with pytest.raises(ValueError, match=r"TritonDenseWeights.biases.w2: expected a contiguous tensor of shape \(4, 64\)"):
        TritonDenseWeights(w13=kernel_weights.w13, w2=kernel_weights.w2,
                           biases=ExpertBiases(w13=kernel_weights.w13[:, :, 0].contiguous(), w2=kernel_weights.w13[:, :3, 0]))


def test_gpt_oss_mxfp4_layers_run_on_triton_dense_by_name(gen: torch.Generator) -> None:
    """gpt-oss (MXFP4 experts, clamped SwiGLU, biases) runs on Hopper on triton-mxfp4-w4a16 (tests/test_triton_mxfp4.py),
    and triton-dense stays its fallback (its weights dequantized once to bf16, exactly): that route, named and run here
    under the interpreter, matches the MXFP4 reference (float32 biases: bf16's tolerance covers their rounding)."""
    shape = (7, 8, 4, 2880, 2880, 8, 0) if CUDA else (7, 8, 4, 64, 64, 8, 0)
    tokens, experts, top_k, hidden, inter, _, _ = shape
    config = MoeRunnerConfig(
        num_experts=experts, hidden_size=hidden, intermediate_size_per_partition=inter, top_k=top_k,
        activation=ClampedSwiglu(alpha=1.702, limit=CLAMP.limit), expert_biases=True,
    )
    layer = LayerSpec(config, MXFP4, torch.bfloat16)
    assert choose(MXFP4, ON_GPU, layer).chosen.name == "triton-mxfp4-w4a16"
    w13 = torch.randn(experts, 2 * inter, hidden, generator=gen) * (CLAMP_GAIN / math.sqrt(hidden))
    weights = Mxfp4MoeWeights(
        w13=Mxfp4ExpertWeights.quantize(w13.to(DEVICE)),
        w2=Mxfp4ExpertWeights.quantize((torch.randn(experts, hidden, inter, generator=gen) / math.sqrt(inter)).to(DEVICE)),
        biases=ExpertBiases(w13=(torch.randn(experts, 2 * inter, generator=gen) * 0.5).to(DEVICE),
                            w2=(torch.randn(experts, hidden, generator=gen) * 0.5).to(DEVICE)),
    )
    x = torch.randn(tokens, hidden, generator=gen).to(torch.bfloat16)
    dispatch = StandardDispatchOutput(x.to(DEVICE), select_experts(torch.randn(tokens, experts, generator=gen).to(DEVICE), config))
    device = DeviceSpec.of(DEVICE) if CUDA else ON_GPU
    route = choose(MXFP4, device, layer, name="triton-dense").chosen
    assert route.name == "triton-dense" and route.degradation is not None
    out = route.bind(config, weights)(dispatch)
    expected = create_runner(REFERENCE_MXFP4, config).run(dispatch, weights)
    assert relative_error(out, expected) < TOLERANCE[torch.bfloat16]


@pytest.mark.parametrize("poison", [float("nan"), float("inf"), float("-inf")], ids=str)
@pytest.mark.parametrize("quantizer", ["static", "dynamic", "groups"])
def test_fp8_activation_quantizers_keep_non_finite_values(gen: torch.Generator, quantizer: str, poison: float) -> None:
    """Silent (adversarial pass 18, c10b): a NaN or infinite hidden state, under ``check_values=False``, came out of
    the FP8 layers as finite numbers (the quantizer saturated it to +-448). Its code is now E4M3's NaN (which holds
    no infinity); the other rows' codes are those of the clean input."""
    x = torch.randn(3, 256, generator=gen).to(torch.bfloat16).to(DEVICE)
    poisoned = x.clone()
    poisoned[1, 7] = poison

    def codes(rows: torch.Tensor) -> torch.Tensor:
        if quantizer == "groups":
            return quantize_fp8_groups(rows)[0].view(torch.uint8)
        return quantize_fp8_rows(rows, torch.tensor([0.01], device=DEVICE) if quantizer == "static" else None)[0].view(torch.uint8)

    got, clean = codes(poisoned), codes(x)
    assert int(got[1, 7]) & 0x7F == 0x7F, "E4M3's NaN, either sign"
    assert torch.equal(got[[0, 2]], clean[[0, 2]])


@pytest.mark.skipif(not CUDA, reason="Triton's interpreter reads E4M3's NaN byte as 480")
@pytest.mark.parametrize("poison", [float("nan"), float("inf"), float("-inf")], ids=str)
@pytest.mark.parametrize("fmt", ["fp8-static", "fp8-dynamic", "fp8-block"])
def test_fp8_layers_keep_non_finite_hidden_states(gen: torch.Generator, fmt: str, poison: float) -> None:
    """The layer around those quantizers: a poisoned token's output is NaN, the other tokens' exactly as without it."""
    config, weights, dispatch = make_layer(gen, (5, 4, 2, 128, 128, 4, 0), torch.bfloat16)
    forward = bound_forward(fmt, config, weights, dispatch)
    unchecked = TopKOutput(dispatch.topk.topk_ids, dispatch.topk.topk_weights, num_experts=4, check_values=False)
    x = dispatch.hidden_states.clone()
    x[2, 7] = poison
    out = forward(StandardDispatchOutput(x, unchecked))
    clean = forward(StandardDispatchOutput(dispatch.hidden_states, unchecked))
    assert bool(out[2].isnan().all())
    assert torch.equal(out[[0, 1, 3, 4]], clean[[0, 1, 3, 4]]) and bool(clean.isfinite().all())


def test_clamped_swiglu_keeps_nan(gen: torch.Generator) -> None:
    """A NaN pre-activation stays NaN through the clamps, as torch.clamp keeps it (a GPU's plain min/max would
    return the limit): a token with a NaN hidden state has a NaN output, the others none."""
    config, weights, dispatch = make_layer(gen, (5, 4, 2, 64, 32, 4, 0), DTYPES[0], CLAMP, gain=CLAMP_GAIN, biases=True)
    x = dispatch.hidden_states.clone()
    x[2, 7] = float("nan")
    out = create_runner(TRITON_DENSE, config).run(StandardDispatchOutput(x, dispatch.topk), TritonDenseWeights.from_dense(weights))
    assert bool(out[2].isnan().all()) and not bool(out[[0, 1, 3, 4]].isnan().any())
