"""NVFP4 W4A4 with per-expert input scales (format ``nvfp4-per-expert``): each expert's GEMM inputs quantized with
the scale calibrated on its own inputs, the layer-wide scalars kept beside them for one-scalar kernels.

Under the layer's one conservative scalar, an expert calibrated on inputs far
smaller than the others' (the split fixture's expert 5) quantizes its inputs
to zero; with its own scale it keeps them. The layer-wide scalars collapse
over every expert of the layer, so they are the same whatever a rank holds.
"""

from __future__ import annotations

import re
from pathlib import Path

import attrs
import pytest
import torch

from moe_core import (
    NVFP4_PER_EXPERT,
    ExpertInputScales,
    ExpertScalePolicy,
    LayerSpec,
    LinearBlockScales,
    MoeRunnerConfig,
    Nvfp4ExpertWeights,
    Nvfp4GateUpWeights,
    Nvfp4PerExpertMoeWeights,
    StandardDispatchOutput,
    TopKOutput,
    select_experts,
)
from moe_core.capability import DeviceSpec
from moe_core.check import relative_error
from moe_core.checkpoint import MoeCheckpoint
from moe_core.float64_moe import float64_moe, nvfp4_expert_round_trips, nvfp4_round_trips
from moe_core.registry import choose
from moe_core.scheme import SchemeSpec
from moe_core.schemes import compressed_tensors_w4a4_nvfp4, modelopt_nvfp4
from moe_core.synthetic import quantize_nvfp4_per_expert_layer, random_dense_layer
from tests.checkpoint_oracles import CT_NVFP4, CT_SPLIT, MODELOPT, expert_weights

BF16_OUTPUT = 4e-3
"""1.024 * 2**-8: the layer's bf16 output against the float64 MoE with the same NVFP4 round trips (the bound and its
reasoning as in tests/test_schemes.py; measured 1.6e-3 to 1.7e-3 over 20 seeds on the three fixtures)."""
W4A4_AGAINST_W4A16 = (0.05, 0.25)
"""The FP4 quantization of a GEMM's inputs, against the same weights with 16-bit inputs (tests/test_schemes.py's
band; 0.158 measured for the split fixture's expert 5)."""

SchemeClass = type[
    compressed_tensors_w4a4_nvfp4.CompressedTensorsW4A4Nvfp4PerExpertMoE | modelopt_nvfp4.ModelOptNvfp4PerExpertMoE
]
CHECKPOINTS = [
    pytest.param(CT_SPLIT, compressed_tensors_w4a4_nvfp4.CompressedTensorsW4A4Nvfp4PerExpertMoE, id="ct-split"),
    pytest.param(CT_NVFP4, compressed_tensors_w4a4_nvfp4.CompressedTensorsW4A4Nvfp4PerExpertMoE, id="ct"),
    pytest.param(MODELOPT, modelopt_nvfp4.ModelOptNvfp4PerExpertMoE, id="modelopt"),
]


def load(directory: Path, scheme_class: SchemeClass, config: MoeRunnerConfig | None = None) -> Nvfp4PerExpertMoeWeights:
    """Layer 0's canonical weights through the per-expert scheme (``config``: this rank's view)."""
    checkpoint = MoeCheckpoint(directory)
    scheme = checkpoint.load_into(0, scheme_class(config or checkpoint.runner_config()), keep_canonical=True)
    assert scheme.weights is not None
    return scheme.weights


def routed(checkpoint: MoeCheckpoint, config: MoeRunnerConfig, tokens: int, gen: torch.Generator) -> StandardDispatchOutput:
    x = torch.randn(tokens, checkpoint.hidden_size, generator=gen).to(torch.bfloat16)
    return StandardDispatchOutput(x, select_experts(x.float() @ checkpoint.router_weight(0).float().T, config))


@pytest.mark.parametrize(("directory", "spec"), [
    (CT_SPLIT, compressed_tensors_w4a4_nvfp4.PER_EXPERT_SCHEME),
    (CT_NVFP4, compressed_tensors_w4a4_nvfp4.PER_EXPERT_SCHEME),
    (MODELOPT, modelopt_nvfp4.PER_EXPERT_SCHEME),
], ids=["ct-split", "ct", "modelopt"])
def test_layer_matches_the_float64_moe_with_each_experts_own_input_scales(
    directory: Path, spec: SchemeSpec, gen: torch.Generator
) -> None:
    checkpoint = MoeCheckpoint(directory)
    scheme = checkpoint.load_layer(0, scheme=spec, keep_canonical=True)
    assert scheme.format is NVFP4_PER_EXPERT
    assert "backend reference-nvfp4-per-expert" in scheme.backend_summary()
    weights = scheme.weights
    assert isinstance(weights, Nvfp4PerExpertMoeWeights)
    dispatch = routed(checkpoint, scheme.config, 37, gen)
    expected = float64_moe(
        scheme.config, dispatch, weights.w13.dequantize(), weights.w2.dequantize(), nvfp4_expert_round_trips(weights)
    )
    assert relative_error(scheme.apply(dispatch), expected) < BF16_OUTPUT


def test_the_tiny_expert_keeps_its_inputs_with_its_own_scale(gen: torch.Generator) -> None:
    """Expert 5 of the split fixture: zero output under the layer's scalar (the oracle agrees), FP4-accurate under
    its own."""
    checkpoint = MoeCheckpoint(CT_SPLIT)
    weights = load(CT_SPLIT, compressed_tensors_w4a4_nvfp4.CompressedTensorsW4A4Nvfp4PerExpertMoE)
    config = checkpoint.runner_config()
    x = torch.randn(16, checkpoint.hidden_size, generator=gen).to(torch.bfloat16)
    ids = torch.tensor([[5, 0]] * 16, dtype=torch.int32)
    dispatch = StandardDispatchOutput(x, TopKOutput(ids, torch.tensor([[1.0, 0.0]] * 16), num_experts=8))
    w13, w2 = expert_weights(CT_SPLIT, 0)
    w4a16 = float64_moe(config, dispatch, w13, w2)
    layer_scalar = float64_moe(
        config, dispatch, weights.w13.dequantize(), weights.w2.dequantize(),
        nvfp4_round_trips(weights.with_layer_input_scales()),
    )
    assert torch.count_nonzero(layer_scalar) == 0
    own = choose(NVFP4_PER_EXPERT, DeviceSpec.parse("cpu"), LayerSpec(config, NVFP4_PER_EXPERT)).chosen
    out = own.bind(config, weights)(dispatch)
    low, high = W4A4_AGAINST_W4A16
    assert low < relative_error(out, w4a16) < high


@pytest.mark.parametrize(("directory", "scheme_class"), CHECKPOINTS)
def test_every_split_over_ranks_holds_the_same_scales(directory: Path, scheme_class: SchemeClass) -> None:
    """Over 1, 2 and 4 ranks: every rank holds every expert's input scales (bit for bit the whole layer's), its own
    experts' as its own, and the same layer-wide scalars."""
    whole = load(directory, scheme_class)
    config = MoeCheckpoint(directory).runner_config()
    for ranks in (2, 4):
        per_rank = config.num_experts // ranks
        for rank in range(ranks):
            local = attrs.evolve(config, num_local_experts=per_rank, local_expert_offset=rank * per_rank)
            part = load(directory, scheme_class, local)
            assert torch.equal(part.w13_input_scales.value, whole.w13_input_scales.value)
            assert torch.equal(part.w2_input_scales.value, whole.w2_input_scales.value)
            for expert in range(per_rank):
                mine, theirs = part.own_input_scales(expert), whole.own_input_scales(rank * per_rank + expert)
                assert [scale.item() for scale in mine] == [scale.item() for scale in theirs]
            assert torch.equal(part.w13_input_scale.value, whole.w13_input_scale.value)
            assert torch.equal(part.w2_input_scale.value, whole.w2_input_scale.value)


def test_selection_degrades_by_name_where_no_kernel_quantizes_per_expert() -> None:
    config = MoeRunnerConfig(num_experts=8, hidden_size=4096, intermediate_size_per_partition=1024, top_k=2)
    layer = LayerSpec(config, NVFP4_PER_EXPERT)
    hopper = choose(NVFP4_PER_EXPERT, DeviceSpec.parse("sm90"), layer)
    assert hopper.chosen.name == "triton-nvfp4-w4a16"
    assert hopper.degradation is not None and hopper.degradation.startswith("nvfp4-per-expert -> nvfp4-w4a16")
    blackwell = choose(NVFP4_PER_EXPERT, DeviceSpec.parse("sm100+flashinfer"), layer)
    assert blackwell.chosen.name == "flashinfer-cutlass-nvfp4", "the first declared degradation ranks first"
    assert blackwell.degradation is not None and "collapsed to the layer's conservative scalar" in blackwell.degradation
    assert choose(NVFP4_PER_EXPERT, DeviceSpec.parse("sm90"), layer, strict=True).chosen.name == (
        "reference-nvfp4-per-expert"
    )


def test_random_layer_oracle_matches_float64(gen: torch.Generator) -> None:
    """The check command's construction: per-expert scales calibrated on each expert's own routed tokens."""
    config = MoeRunnerConfig(num_experts=4, hidden_size=64, intermediate_size_per_partition=32, top_k=2)
    dense, dispatch = random_dense_layer(config, 24, torch.bfloat16, torch.device("cpu"), int(torch.randint(2**31, (1,), generator=gen)))
    weights = quantize_nvfp4_per_expert_layer(config, dense, dispatch)
    x, ids = dispatch.hidden_states.float(), dispatch.topk.topk_ids
    for expert in range(4):  # each expert's scale from the amax of the tokens routed to it (the layer's if none)
        routed = x[(ids == expert).any(dim=1)]
        amax = routed.abs().amax() if routed.numel() else x.abs().amax()
        assert weights.w13_input_scales.value[expert].item() == pytest.approx(2688 / float(amax), rel=1e-6)
    out = choose(NVFP4_PER_EXPERT, DeviceSpec.parse("cpu"), LayerSpec(config, NVFP4_PER_EXPERT)).chosen.bind(
        config, weights
    )(dispatch)
    expected = float64_moe(config, dispatch, weights.w13.dequantize(), weights.w2.dequantize(), nvfp4_expert_round_trips(weights))
    assert relative_error(out, expected) < BF16_OUTPUT


def last_two(experts: Nvfp4ExpertWeights) -> Nvfp4ExpertWeights:
    """Experts 2 and 3 of four: the second rank's half."""
    return Nvfp4ExpertWeights(
        experts.packed[2:].clone(),
        LinearBlockScales.from_checkpoint(experts.block_scales.data[2:].clone()),
        experts.global_scales.experts(2, 4),
    )


def test_the_layer_scalars_come_from_every_expert_and_the_counts_must_agree(gen: torch.Generator) -> None:
    """The scalars one-scalar kernels take are derived from every expert's scale under the policy (a rank's own, or
    a value from elsewhere, cannot stand in); the two GEMMs' scales cover the same experts, and this rank's are
    among them."""
    config = MoeRunnerConfig(num_experts=4, hidden_size=64, intermediate_size_per_partition=32, top_k=2)
    dense, dispatch = random_dense_layer(config, 24, torch.bfloat16, torch.device("cpu"), int(torch.randint(2**31, (1,), generator=gen)))
    weights = quantize_nvfp4_per_expert_layer(config, dense, dispatch)
    assert weights.w13_input_scale.item() == float(weights.w13_input_scales.value.min())
    assert weights.w2_input_scale.item() == float(weights.w2_input_scales.value.min())
    with pytest.raises(ValueError, match=re.escape("w2_input_scales: expected one scale per expert of the layer like w13_input_scales (4), got 2")):
        attrs.evolve(weights, w2_input_scales=weights.w2_input_scales.experts(0, 2))
    with pytest.raises(ValueError, match=re.escape("experts [1, 5) are not all among the layer's 4")):
        attrs.evolve(weights, local_expert_offset=1)
    distinct = ExpertInputScales.from_amax(torch.tensor([1.0, 2.0, 3.0, 4.0]))
    with pytest.raises(ValueError, match="experts disagree"):
        attrs.evolve(weights, w13_input_scales=distinct, policy=ExpertScalePolicy.REQUIRE_EQUAL)
    route = choose(NVFP4_PER_EXPERT, DeviceSpec.parse("cpu"), LayerSpec(config, NVFP4_PER_EXPERT)).chosen
    second_half = attrs.evolve(config, num_local_experts=2, local_expert_offset=2)
    unshifted = attrs.evolve(
        weights, w13=Nvfp4GateUpWeights(gate=last_two(weights.w13.gate), up=last_two(weights.w13.up)), w2=last_two(weights.w2)
    )
    with pytest.raises(ValueError, match=r"local_expert_offset: 0, but this rank's experts start at 2"):
        route.bind(second_half, unshifted)
    assert route.bind(second_half, attrs.evolve(unshifted, local_expert_offset=2))(dispatch).isfinite().all()
    with pytest.raises(ValueError, match=r"w13_input_scales: one per expert of a layer of 4, but the layer has 8"):
        route.bind(attrs.evolve(config, num_experts=8), weights)


def test_shards_of_one_expert_collapse_under_the_policy() -> None:
    """w1's and w3's input scales quantize one GEMM input: one value per expert, named where they must agree."""
    quantize = torch.tensor([[700.0, 700.0], [640.0, 900.0], [1e4, 1e4]])
    conservative = ExpertInputScales.from_checkpoint_shards(quantize, policy=ExpertScalePolicy.CONSERVATIVE)
    assert conservative.value.tolist() == [700.0, 640.0, 1e4]
    with pytest.raises(ValueError, match=re.escape("the shards of expert 1 disagree ([640.0, 900.0])")):
        ExpertInputScales.from_checkpoint_shards(quantize, policy=ExpertScalePolicy.REQUIRE_EQUAL)
    dequantize = 1 / quantize
    larger = ExpertInputScales.from_dequantize_checkpoint_shards(dequantize, policy=ExpertScalePolicy.CONSERVATIVE)
    assert torch.equal(larger.value, torch.reciprocal(dequantize.amax(dim=1)))
    with pytest.raises(ValueError, match="expected quantize-side"):
        ExpertInputScales.from_checkpoint_shards(dequantize, policy=ExpertScalePolicy.CONSERVATIVE)


def test_input_scales_are_no_weights_global_scales(gen: torch.Generator) -> None:
    """Input scales collapsed from w1's and w3's shards, given as both halves' weight global scales, ran 2.64 off
    (an adversarial pass): the types differ (a rejected type case), and a caller past mypy is named at run time."""
    weights = Nvfp4ExpertWeights.quantize(torch.randn(2, 32, 64, generator=gen))
    inputs = ExpertInputScales.from_checkpoint_shards(torch.tensor([[700.0, 900.0], [640.0, 800.0]]),
                                                      policy=ExpertScalePolicy.CONSERVATIVE)
    smuggled: object = inputs
    with pytest.raises(TypeError, match="global_scales: expected ExpertQuantizeGlobalScales, got ExpertInputScales"):
        Nvfp4ExpertWeights(weights.packed, weights.block_scales, smuggled)  # type: ignore[arg-type]  # the runtime check under test
