"""The Triton MXFP4 W4A16 backend (``triton-mxfp4-w4a16``) against the MXFP4 reference, its selection and refusals.

On the CPU the kernels run under Triton's interpreter at tiny shapes (H and I
multiples of 32: whole E8M0 scale blocks), with float32 dot products; on a
CUDA device the same checks run compiled, at real sizes, with bf16 dot
products. The weights are MXFP4 codes of random layers, quantized afresh
each run (``gen``), and the reference (``reference-mxfp4``) runs on the same
codes and biases, in float32.

Tolerance (relative l2): bf16's 1.6e-2 from ``tests/test_triton.py`` for
both activation dtypes. The kernels store the gated activation and the second
GEMM's rows in the activations' dtype before the combine (the reference keeps
float32); and on a GPU the dot products are bf16 whatever the activations'
dtype (fp16 activations are rounded to bf16, as the MXFP4 -> dense bf16
degradation rounds them), so fp16 activations get bf16's tolerance, not
fp16's. The decoded weights are exact (an E2M1 value times a power of two).

gpt-oss's layers (clamped SwiGLU, biases on both GEMMs) are checked with the
clamp hit from both sides, and the clamp and the biases each moving the
output well past the tolerance.
"""

from __future__ import annotations

import math
from pathlib import Path

import attrs
import pytest
import torch

from moe_core import (
    Activation,
    ClampedSwiglu,
    DenseMoeWeights,
    MoeRunnerConfig,
    Llama4Sigmoid,
    StandardDispatchOutput,
    TopKOutput,
    create_runner,
    select_experts,
)
from moe_core.backends.reference import REFERENCE_MXFP4
from moe_core.backends.triton import TRITON_MXFP4_W4A16, plans
from moe_core.backends.triton.configs import MXFP4_DEQUANTIZE_ROWS, KernelConfig, crossover_file, mxfp4_dequantizes
from moe_core.backends.triton.quant_info import TritonMxfp4W4A16Weights
from moe_core.mxfp4 import E8M0_MAX_CODE
from moe_core.backends.triton.launch import dequantize_mxfp4
from moe_core.backends.triton.runner import TritonRunner
from moe_core.capability import DeviceSpec, LayerSpec
from moe_core.check import relative_error
from moe_core.checkpoint import MoeCheckpoint
from moe_core.config import ExpertActivation
from moe_core.formats import MXFP4, Mxfp4MoeWeights
from moe_core.formats.dense import ExpertBiases
from moe_core.mxfp4 import E8M0Scales, Mxfp4ExpertWeights
from moe_core.registry import choose
from tests.test_triton import CLAMP, CLAMP_GAIN, CUDA, DEVICE, ON_GPU, TOLERANCE, assert_clamp_is_hit

MXFP4_TOLERANCE = TOLERANCE[torch.bfloat16]
"""bf16's, for bf16 and fp16 activations alike (see the module docstring)."""
ACTIVATION_DTYPES = [torch.bfloat16, torch.float16]

SHAPES = [
    # (tokens, experts, top_k, hidden, inter, local experts, offset)
    (1, 4, 1, 64, 32, 4, 0),
    (17, 8, 2, 96, 64, 8, 0),
    (9, 8, 3, 64, 96, 4, 4),
    (11, 8, 2, 64, 64, 4, 0),
] if not CUDA else [
    (1, 32, 4, 2880, 2880, 32, 0),
    (37, 128, 4, 2880, 2880, 128, 0),
    (1000, 128, 4, 2880, 2880, 64, 64),
    (8192, 32, 4, 2880, 2880, 32, 0),
]
"""Decode, several rows per expert, expert parallelism (half the experts local, at offset 4 and 0); gpt-oss-20b/120b's
sizes on a GPU."""

FIXTURE = Path(__file__).resolve().parent / "fixtures" / "gpt_oss_mxfp4"


def shape_id(shape: tuple[int, ...]) -> str:
    """A layer shape's test id."""
    return f"T{shape[0]}-E{shape[1]}-k{shape[2]}-H{shape[3]}-I{shape[4]}-local{shape[5]}-at{shape[6]}"


def mxfp4_layer(
    gen: torch.Generator, shape: tuple[int, ...], dtype: torch.dtype,
    activation: ExpertActivation = CLAMP, *, biases: bool = True, gain: float = CLAMP_GAIN,
) -> tuple[MoeRunnerConfig, Mxfp4MoeWeights, StandardDispatchOutput]:
    """A random MXFP4 layer of this rank's experts (w13's up half twice the gate's scale, nonzero biases on both
    GEMMs with ``biases``) and a dispatch of ``dtype`` hidden states."""
    tokens, experts, top_k, hidden, inter, local, offset = shape
    config = MoeRunnerConfig(
        num_experts=experts, hidden_size=hidden, intermediate_size_per_partition=inter, top_k=top_k,
        num_local_experts=local, local_expert_offset=offset, activation=activation, routed_scaling_factor=1.5,
        expert_biases=biases,
    )
    w13 = torch.randn(local, 2 * inter, hidden, generator=gen) * (gain / math.sqrt(hidden))
    w13[:, inter:] *= 2.0
    w2 = torch.randn(local, hidden, inter, generator=gen) / math.sqrt(inter)
    expert_biases = None
    if biases:
        expert_biases = ExpertBiases(
            w13=(torch.randn(local, 2 * inter, generator=gen) * 0.5).to(DEVICE),
            w2=(torch.randn(local, hidden, generator=gen) * 0.5).to(DEVICE),
        )
    weights = Mxfp4MoeWeights(
        w13=Mxfp4ExpertWeights.quantize(w13.to(DEVICE)), w2=Mxfp4ExpertWeights.quantize(w2.to(DEVICE)), biases=expert_biases
    )
    x = torch.randn(tokens, hidden, generator=gen).to(dtype)
    logits = torch.randn(tokens, experts, generator=gen)
    return config, weights, StandardDispatchOutput(x.to(DEVICE), select_experts(logits.to(DEVICE), config))


def run_paths(
    config: MoeRunnerConfig, weights: Mxfp4MoeWeights, dispatch: StandardDispatchOutput
) -> tuple[torch.Tensor, torch.Tensor]:
    """The fused path's and the dequantize-then-bf16 path's outputs on the same weights (each path forced by its plan)."""
    kernel_weights = TritonMxfp4W4A16Weights.from_mxfp4(weights)
    fused, workspace = (
        TritonRunner(config, plans.Mxfp4W4A16Plan(path)).run(dispatch, kernel_weights)
        for path in (plans.W4A16Path.FUSED, plans.W4A16Path.WORKSPACE)
    )
    return fused, workspace


def assert_nontrivial(out: torch.Tensor, dispatch: StandardDispatchOutput, config: MoeRunnerConfig) -> None:
    """The output has the hidden states' shape and dtype, is finite, and is not zero where tokens reach local experts."""
    assert out.shape == dispatch.hidden_states.shape and out.dtype == dispatch.hidden_states.dtype
    assert bool(out.isfinite().all())
    ids = dispatch.topk.topk_ids - config.local_expert_offset
    reached = ((ids >= 0) & (ids < config.num_local_experts)).any(dim=1)
    assert bool(reached.any()), "some token reaches a local expert"
    assert bool((out[reached].abs().amax(dim=1) > 0).all())


@pytest.mark.parametrize("shape", SHAPES, ids=shape_id)
@pytest.mark.parametrize("dtype", ACTIVATION_DTYPES, ids=str)
def test_gpt_oss_layers_match_the_mxfp4_reference(
    gen: torch.Generator, shape: tuple[int, ...], dtype: torch.dtype
) -> None:
    """Clamped SwiGLU and both biases, fused (decode) and through the bf16 workspace (prefill), against the MXFP4
    reference; the clamp and the biases each move the output far beyond the tolerance."""
    config, weights, dispatch = mxfp4_layer(gen, shape, dtype)
    dense = weights.dequantize()
    assert_clamp_is_hit(dense, dispatch, CLAMP.limit)
    fused, dequantized = run_paths(config, weights, dispatch)
    expected = create_runner(REFERENCE_MXFP4, config).run(dispatch, weights)
    assert_nontrivial(fused, dispatch, config)
    assert relative_error(fused, expected) < MXFP4_TOLERANCE
    assert relative_error(dequantized, expected) < MXFP4_TOLERANCE
    assert relative_error(dequantized, fused) < MXFP4_TOLERANCE
    unclamped = attrs.evolve(config, activation=ClampedSwiglu(alpha=CLAMP.alpha, limit=1e4))
    assert relative_error(create_runner(REFERENCE_MXFP4, unclamped).run(dispatch, weights), expected) > 0.05
    unbiased = Mxfp4MoeWeights(w13=weights.w13, w2=weights.w2)
    no_biases = create_runner(REFERENCE_MXFP4, attrs.evolve(config, expert_biases=False)).run(dispatch, unbiased)
    assert relative_error(no_biases, expected) > 0.05


@pytest.mark.parametrize(
    "activation", [Activation.SILU_GATED, Activation.GELU_GATED, Activation.GELU_TANH_GATED], ids=lambda a: a.value
)
@pytest.mark.parametrize("biases", [False, True], ids=["no-biases", "biases"])
def test_the_other_gated_activations_with_and_without_biases(
    gen: torch.Generator, activation: Activation, biases: bool
) -> None:
    config, weights, dispatch = mxfp4_layer(gen, SHAPES[2], torch.bfloat16, activation, biases=biases, gain=1.0)
    fused, dequantized = run_paths(config, weights, dispatch)
    expected = create_runner(REFERENCE_MXFP4, config).run(dispatch, weights)
    assert_nontrivial(fused, dispatch, config)
    assert relative_error(fused, expected) < MXFP4_TOLERANCE
    assert relative_error(dequantized, expected) < MXFP4_TOLERANCE


@pytest.mark.parametrize("block", [(64, 64), (128, 128)], ids=["K64-N64", "K128-N128"])
def test_k_and_n_tails(gen: torch.Generator, block: tuple[int, int], monkeypatch: pytest.MonkeyPatch) -> None:
    """K tiles that leave a tail (H = I = 96 with 64-wide tiles: the masked loads of codes and exponents) and output
    columns that leave a tail (96 of 64- and 128-wide tiles; a 128 K tile is all tail), as a tuned table may choose them."""
    block_k, block_n = block
    shape = (13, 4, 2, 96, 96, 4, 0) if not CUDA else (13, 32, 4, 2880, 2880 + 32, 32, 0)
    config, weights, dispatch = mxfp4_layer(gen, shape, torch.bfloat16)
    original = plans._configs
    seen: list[KernelConfig] = []

    def configs(*args: object) -> tuple[KernelConfig, KernelConfig]:
        w13, w2 = (attrs.evolve(c, block_k=block_k, block_n=block_n) for c in original(*args))  # type: ignore[arg-type]
        seen.extend((w13, w2))
        return w13, w2

    monkeypatch.setattr(plans, "_configs", configs)
    fused = TritonRunner(config, plans.Mxfp4W4A16Plan(plans.W4A16Path.FUSED))
    out = fused.run(dispatch, TritonMxfp4W4A16Weights.from_mxfp4(weights))
    assert seen and all(c.block_k == block_k for c in seen)
    assert shape[3] % block_k or shape[4] % block_k, "a K tail"
    expected = create_runner(REFERENCE_MXFP4, config).run(dispatch, weights)
    assert_nontrivial(out, dispatch, config)
    assert relative_error(out, expected) < MXFP4_TOLERANCE


def test_dequantize_is_exact(gen: torch.Generator) -> None:
    """The prefill path's bf16 workspace: each code times its power of two, exactly (partial tiles of rows and bytes;
    exponents across the range, 0 and 240 included: exact in float32 everywhere). Under the interpreter, bf16 is
    checked where the products are normal bf16 numbers (exponent 2 on): its float32 -> bf16 cast rounds subnormals
    wrongly (the float32 products are exact, and torch rounds them to the reference's bf16)."""
    weights = Mxfp4ExpertWeights.quantize(torch.randn(3, 40, 352, generator=gen).to(DEVICE))  # 176 bytes a row
    codes = torch.randint(100, 150, weights.scales.shape, generator=gen, dtype=torch.uint8)
    codes[0, 0, 0], codes[0, 1, 1], codes[1, 2, 3], codes[2, 39, 10] = 0, 2, E8M0_MAX_CODE, 127
    weights = Mxfp4ExpertWeights(weights.packed, E8M0Scales.from_checkpoint(codes.to(DEVICE)))
    exact = weights.dequantize()
    wide = dequantize_mxfp4(weights.packed, weights.scales.codes, torch.float32)
    assert wide.shape == (3, 40, 352) and torch.equal(wide, exact)
    out = dequantize_mxfp4(weights.packed, weights.scales.codes)
    assert out.dtype == torch.bfloat16 and torch.equal(wide.to(torch.bfloat16), weights.dequantize(torch.bfloat16))
    normal = codes.to(DEVICE).repeat_interleave(32, dim=-1) >= (0 if CUDA else 2)
    assert torch.equal(out[normal], weights.dequantize(torch.bfloat16)[normal])


def test_conversion_keeps_codes_and_exponents_and_the_format_refuses_what_no_kernel_decodes(gen: torch.Generator) -> None:
    config, weights, _ = mxfp4_layer(gen, SHAPES[0], torch.bfloat16)
    kernel_weights = TritonMxfp4W4A16Weights.from_mxfp4(weights)
    assert torch.equal(kernel_weights.w13_packed, weights.w13.packed)
    assert torch.equal(kernel_weights.w2_scales.codes, weights.w2.scales.codes)
    assert kernel_weights.biases is not None and kernel_weights.biases.w13.dtype == torch.float32
    _, _, _, hidden, inter, local, _ = SHAPES[0]
    assert (kernel_weights.num_experts, kernel_weights.hidden_size, kernel_weights.intermediate_size) == (local, hidden, inter)
    codes = weights.w2.scales.codes.clone()
    codes[1, 3, 0] = E8M0_MAX_CODE + 1  # beyond what the kernels decode: refused by the format, before any backend
    with pytest.raises(ValueError, match=r"E8M0Scales.codes: expected exponents up to 240 .* found 241"):
        E8M0Scales.from_checkpoint(codes)


def test_weights_that_disagree_with_the_activation_or_biases_are_refused(gen: torch.Generator) -> None:
    config, weights, dispatch = mxfp4_layer(gen, SHAPES[0], torch.bfloat16)
    kernel_weights = TritonMxfp4W4A16Weights.from_mxfp4(weights)
    with pytest.raises(ValueError, match="the config says expert_biases=False, the weights carry some"):
        create_runner(TRITON_MXFP4_W4A16, attrs.evolve(config, expert_biases=False)).run(dispatch, kernel_weights)
    unbiased = attrs.evolve(kernel_weights, biases=None)
    with pytest.raises(ValueError, match="the config says expert_biases=True, the weights carry none"):
        create_runner(TRITON_MXFP4_W4A16, config).run(dispatch, unbiased)
    relu2 = attrs.evolve(config, activation=Activation.RELU2, expert_biases=False)
    with pytest.raises(ValueError, match=r"these weights are gated \(w13 \[E, 2I, H\]\), not relu2"):
        create_runner(TRITON_MXFP4_W4A16, relu2).run(dispatch, unbiased)


GPT_OSS_LAYER = MoeRunnerConfig(
    num_experts=32, hidden_size=2880, intermediate_size_per_partition=2880, top_k=4,
    activation=ClampedSwiglu(alpha=1.702, limit=7.0), expert_biases=True,
)


def test_hopper_chooses_it_for_gpt_oss_and_keeps_the_bf16_degradation_as_fallback() -> None:
    """On sm90 the MXFP4 format runs on its own kernel (no degradation) for gpt-oss's layers and the plain gated ones;
    a layer it refuses still reaches triton-dense through the bf16 degradation."""
    for config in (GPT_OSS_LAYER, attrs.evolve(GPT_OSS_LAYER, activation=Activation.SILU_GATED, expert_biases=False)):
        for dtype in (torch.bfloat16, torch.float16):
            selection = choose(MXFP4, DeviceSpec.parse("sm90"), LayerSpec(config, MXFP4, dtype))
            assert selection.chosen.name == "triton-mxfp4-w4a16" and selection.degradation is None
    assert choose(MXFP4, DeviceSpec.parse("sm80"), LayerSpec(GPT_OSS_LAYER, MXFP4, torch.bfloat16)).chosen.name == (
        "triton-mxfp4-w4a16"
    )
    odd = attrs.evolve(GPT_OSS_LAYER, hidden_size=2880 + 16)  # not whole MXFP4 blocks: the kernel refuses, dense takes it
    fallback = choose(MXFP4, DeviceSpec.parse("sm90"), LayerSpec(odd, MXFP4, torch.bfloat16))
    assert fallback.chosen.name == "triton-dense"
    assert fallback.degradation is not None and fallback.degradation.startswith("mxfp4 -> dense")
    by_name = choose(MXFP4, DeviceSpec.parse("sm90"), LayerSpec(GPT_OSS_LAYER, MXFP4, torch.bfloat16), name="triton-dense")
    assert by_name.chosen.name == "triton-dense" and by_name.degradation is not None
    assert choose(MXFP4, DeviceSpec.parse("cpu"), LayerSpec(GPT_OSS_LAYER, MXFP4, torch.bfloat16)).chosen.name == (
        "reference-mxfp4"
    )


def test_capability_refusals_are_named() -> None:
    def reasons(config: MoeRunnerConfig, dtype: torch.dtype = torch.bfloat16, device: DeviceSpec = ON_GPU) -> tuple[str, ...]:
        return TRITON_MXFP4_W4A16.supports(device, LayerSpec(config, MXFP4, dtype)).reasons

    assert reasons(GPT_OSS_LAYER) == () and reasons(GPT_OSS_LAYER, torch.float16) == ()
    assert reasons(GPT_OSS_LAYER, torch.float32) == ("takes bf16/fp16 hidden states, not torch.float32",)
    relu2 = attrs.evolve(GPT_OSS_LAYER, activation=Activation.RELU2)
    assert reasons(relu2) == ("the mxfp4 weights are gated (w13 [E, 2I, H]), not relu2",)
    llama4 = attrs.evolve(GPT_OSS_LAYER, routing_method=Llama4Sigmoid(), top_k=1)
    assert reasons(llama4) == ("its kernels weight each expert's output, not its input (llama4_sigmoid routing)",)
    odd = attrs.evolve(GPT_OSS_LAYER, intermediate_size_per_partition=2880 + 16)
    assert reasons(odd) == (
        "its MXFP4 tiles hold whole 32-element scale blocks: hidden and intermediate sizes must be multiples of 32, "
        "got (2880, 2896)",
    )
    assert reasons(GPT_OSS_LAYER, device=DeviceSpec.parse("sm75+triton")) == ("needs compute capability 8.0+, found SM75",)
    assert reasons(GPT_OSS_LAYER, device=DeviceSpec.parse("sm90-triton"))[0].startswith("triton is not installed")
    cpu = DeviceSpec.parse("cpu+triton")
    assert reasons(GPT_OSS_LAYER, device=attrs.evolve(cpu, triton_interpreter=False))[0].startswith("needs a CUDA GPU")
    interpreter = TRITON_MXFP4_W4A16.supports(
        attrs.evolve(cpu, triton_interpreter=True), LayerSpec(GPT_OSS_LAYER, MXFP4, torch.bfloat16)
    )
    assert interpreter.reasons == () and interpreter.by_name_only is not None


def test_the_crossover_default_and_the_interpreter() -> None:
    """Untuned: the bf16 workspace from MXFP4_DEQUANTIZE_ROWS rows per local expert on average."""
    rows = MXFP4_DEQUANTIZE_ROWS
    assert not mxfp4_dequantizes("NVIDIA H200", rows * 32 // 4 - 1, 4, 32, 2880, 2880, False)
    assert mxfp4_dequantizes("NVIDIA H200", rows * 32 // 4, 4, 32, 2880, 2880, False)
    assert mxfp4_dequantizes("cpu", rows * 32 // 4, 4, 32, 2880, 2880, True)


def test_gpt_oss_120b_takes_its_measured_h200_crossover() -> None:
    """The H200 measurement (benchmarks/RESULTS.md): the fused kernel up to 16 rows per expert (T=512), the workspace
    from 32 (T=1024)."""
    assert crossover_file("NVIDIA H200").exists()
    assert not mxfp4_dequantizes("NVIDIA H200", 512, 4, 128, 2880, 2880, False)
    assert mxfp4_dequantizes("NVIDIA H200", 1024, 4, 128, 2880, 2880, False)


@pytest.mark.parametrize("dequantize", [False, True], ids=["fused", "dequantized"])
def test_the_gpt_oss_fixture_runs_on_it_against_the_reference(
    gen: torch.Generator, dequantize: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """tests/fixtures/gpt_oss_mxfp4 through moe_core.schemes.gpt_oss_mxfp4 with backend="triton-mxfp4-w4a16" (under
    the interpreter on the CPU: by name), against the same layer loaded onto reference-mxfp4."""
    monkeypatch.setattr(plans, "mxfp4_dequantizes", lambda *_: dequantize)
    checkpoint = MoeCheckpoint(FIXTURE)
    for index in checkpoint.moe_layers():
        layer = checkpoint.load_layer(index, device=DEVICE, backend="triton-mxfp4-w4a16", keep_canonical=True)
        assert "triton-mxfp4-w4a16" in layer.backend_summary()
        reference = checkpoint.load_layer(index, device=DEVICE, backend="reference-mxfp4")
        config = layer.config
        assert isinstance(config.activation, ClampedSwiglu) and config.expert_biases
        x = torch.randn(19, config.hidden_size, generator=gen).to(torch.bfloat16).to(DEVICE)
        logits = torch.randn(19, config.num_experts, generator=gen).to(DEVICE)
        dispatch = StandardDispatchOutput(x, select_experts(logits, config))
        weights = layer.weights
        assert isinstance(weights, Mxfp4MoeWeights) and weights.biases is not None
        assert bool(weights.biases.w13.abs().amax() > 0) and bool(weights.biases.w2.abs().amax() > 0)
        out, expected = layer.apply(dispatch), reference.apply(dispatch)
        assert_nontrivial(out, dispatch, config)
        assert relative_error(out, expected) < MXFP4_TOLERANCE
        assert torch.equal(expected, create_runner(REFERENCE_MXFP4, config).run(dispatch, weights))


def test_the_degradation_and_the_kernel_agree(gen: torch.Generator) -> None:
    """The same layer through the MXFP4 kernel and through its bf16 degradation on triton-dense."""
    config, weights, dispatch = mxfp4_layer(gen, SHAPES[1], torch.bfloat16)
    fused, _ = run_paths(config, weights, dispatch)
    route = choose(MXFP4, ON_GPU if not CUDA else DeviceSpec.of(DEVICE), LayerSpec(config, MXFP4, torch.bfloat16),
                   name="triton-dense").chosen
    degraded = route.bind(config, weights)(dispatch)
    assert relative_error(fused, degraded) < MXFP4_TOLERANCE
    assert isinstance(weights.dequantized_bf16(), DenseMoeWeights)


@pytest.mark.skipif(not CUDA, reason="needs CUDA graphs")
@pytest.mark.parametrize("dequantize", [False, True], ids=["fused", "dequantized"])
def test_forward_is_captured_and_replayed_in_a_cuda_graph(
    gen: torch.Generator, dequantize: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """gpt-oss's layer (clamped SwiGLU, biases) captured once, replayed on fresh inputs copied into the captured
    buffers: bit-identical to an eager forward on those inputs, on both paths (the workspace allocated inside the
    capture)."""
    monkeypatch.setattr(plans, "mxfp4_dequantizes", lambda *_: dequantize)
    shape = (16, 32, 4, 2880, 2880, 32, 0)
    config, weights, dispatch = mxfp4_layer(gen, shape, torch.bfloat16)
    bound = TRITON_MXFP4_W4A16.bind(config, TritonMxfp4W4A16Weights.from_mxfp4(weights))
    static_x = dispatch.hidden_states.clone()
    static_ids, static_w = dispatch.topk.topk_ids.clone(), dispatch.topk.topk_weights.clone()

    def forward() -> torch.Tensor:
        topk = TopKOutput(static_ids, static_w, num_experts=config.num_experts, check_values=False)
        return bound(StandardDispatchOutput(static_x, topk))

    forward()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = forward()
    _, _, fresh = mxfp4_layer(gen, shape, torch.bfloat16)
    static_x.copy_(fresh.hidden_states)
    static_ids.copy_(fresh.topk.topk_ids)
    static_w.copy_(fresh.topk.topk_weights)
    graph.replay()
    expected = bound(fresh)
    assert_nontrivial(expected, fresh, config)
    torch.testing.assert_close(captured, expected, rtol=0, atol=0)
