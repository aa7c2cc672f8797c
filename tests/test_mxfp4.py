"""The MXFP4 kit and the gpt-oss MXFP4 scheme.

Numerics against independent computations: dequantization against the OCP
formula ``e2m1 * 2 ** (e - 127)`` written out here; the fixture checkpoint
(tests/fixtures/make_gpt_oss_mxfp4.py) loaded through the scheme against
transformers' own MXFP4 dequantization of the same file (bit for bit); its
first MoE block and the whole tiny model's logits against transformers'
(1e-5 relative, both float32).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from moe_core import (
    MXFP4,
    DeviceSpec,
    E8M0Scales,
    LayerSpec,
    MoeRunnerConfig,
    Mxfp4ExpertWeights,
    Mxfp4MoeWeights,
    StandardDispatchOutput,
    choose,
)
from moe_core.formats.mxfp4 import MXFP4_TO_BF16
from moe_core.backends.reference import REFERENCE_DENSE, REFERENCE_MXFP4
from moe_core.checkpoint import MoeCheckpoint
from moe_core.config import ClampedSwiglu
from moe_core.expert_params import ExpertShard
from moe_core.formats.dense import DenseMoeWeights, ExpertBiases, GateUpLayout
from moe_core.layer import MoeLayer
from moe_core.registry import BackendSelectionError, create_runner
from moe_core.routing import Router, select_experts
from moe_core.schemes import SCHEMES
from moe_core.schemes.gpt_oss_mxfp4 import GptOssMxfp4MoE

FIXTURE = Path(__file__).resolve().parent / "fixtures" / "gpt_oss_mxfp4"
E2M1 = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0]
TOLERANCE = 1e-5


def _ocp_dequantize(packed: torch.Tensor, exponents: torch.Tensor) -> torch.Tensor:
    """``e2m1(code) * 2 ** (e - 127)`` in float64, codes low nibble first, 32 elements a scale."""
    table = torch.tensor(E2M1, dtype=torch.float64)
    codes = torch.stack((packed & 15, packed >> 4), dim=-1).flatten(-2).long()
    scales = torch.pow(2.0, exponents.double() - 127).repeat_interleave(32, dim=-1)
    return table[codes] * scales


def test_dequantize_is_the_ocp_formula_and_quantize_round_trips(gen: torch.Generator) -> None:
    w = torch.randn(3, 64, 96, generator=gen) * torch.exp2(torch.randint(-8, 8, (3, 64, 1), generator=gen).float())
    q = Mxfp4ExpertWeights.quantize(w)
    assert torch.equal(q.dequantize().double(), _ocp_dequantize(q.packed, q.scales.codes))
    assert torch.equal(q.dequantize_expert(2), q.dequantize()[2])
    # no clipping: each block's scale is at or above amax / 6, and below amax / 3
    blocks, scale = w.reshape(3, 64, 3, 32), q.scales.factors()
    amax = blocks.abs().amax(-1)
    assert bool((scale * 6 >= amax).all()) and bool((scale * 3 < amax).all())
    # an E2M1 step is at most 2 scales (between 4 and 6): the error is at most one scale
    assert float(((q.dequantize().reshape(blocks.shape) - blocks).abs().amax(-1) / scale).max()) <= 1.0
    assert torch.equal(Mxfp4ExpertWeights.quantize(q.dequantize()).dequantize(), q.dequantize())


def test_e8m0_scales_refuse_nan_and_raw_construction() -> None:
    with pytest.raises(ValueError, match="E8M0 255 is NaN"):
        E8M0Scales.from_checkpoint(torch.full((2, 2), 255, dtype=torch.uint8))
    with pytest.raises(TypeError, match="uint8"):
        E8M0Scales.from_checkpoint(torch.ones(2, 2))
    with pytest.raises(TypeError):
        E8M0Scales(torch.zeros(2, 2, dtype=torch.uint8))  # type: ignore[call-arg]  # the point: no raw constructor
    with pytest.raises(ValueError, match="one scale per 32"):
        Mxfp4ExpertWeights(torch.zeros(1, 4, 32, dtype=torch.uint8), E8M0Scales.from_checkpoint(torch.full((1, 4, 1), 127, dtype=torch.uint8)))


def test_e8m0_values_converted_to_integers_are_refused_and_their_bits_taken(gen: torch.Generator) -> None:
    """Scales another MX library hands over as ``torch.float8_e8m0fnu``: ``.to(torch.uint8)`` converts the values
    (2**-5 -> 0) and every weight decodes to about 2**-127 (the layer 1.00 off, silently: adversarial pass 3, c04);
    the e8m0 tensor itself is read by its bits."""
    weights = Mxfp4ExpertWeights.quantize(torch.randn(2, 64, 64, generator=gen) / 8)
    as_e8m0 = weights.scales.codes.clone().view(torch.float8_e8m0fnu)
    with pytest.raises(ValueError, match=r"found a median of [01] .*\.view\(torch\.uint8\)"):
        E8M0Scales.from_checkpoint(as_e8m0.to(torch.uint8))
    taken = E8M0Scales.from_checkpoint(as_e8m0)
    assert torch.equal(taken.codes, weights.scales.codes)


def _random_weights(gen: torch.Generator, experts: int = 4, hidden: int = 64, inter: int = 32) -> Mxfp4MoeWeights:
    biases = ExpertBiases(w13=torch.randn(experts, 2 * inter, generator=gen), w2=torch.randn(experts, hidden, generator=gen))
    return Mxfp4MoeWeights.from_checkpoint(
        w13=Mxfp4ExpertWeights.quantize(torch.randn(experts, 2 * inter, hidden, generator=gen)),
        w2=Mxfp4ExpertWeights.quantize(torch.randn(experts, hidden, inter, generator=gen) / 4),
        layout=GateUpLayout.INTERLEAVED,
        biases=biases,
    )


def test_interleaved_rows_are_reordered_like_the_dense_format(gen: torch.Generator) -> None:
    packed = Mxfp4ExpertWeights.quantize(torch.randn(2, 64, 32, generator=gen))
    biases = ExpertBiases(w13=torch.randn(2, 64, generator=gen), w2=torch.zeros(2, 32))
    w2 = Mxfp4ExpertWeights.quantize(torch.randn(2, 32, 32, generator=gen))
    weights = Mxfp4MoeWeights.from_checkpoint(w13=packed, w2=w2, layout=GateUpLayout.INTERLEAVED, biases=biases)
    dense = DenseMoeWeights.from_checkpoint(w13=packed.dequantize(), w2=w2.dequantize(), layout=GateUpLayout.INTERLEAVED, biases=biases)
    assert torch.equal(weights.w13.dequantize(), dense.w13)
    assert weights.biases is not None and dense.biases is not None and torch.equal(weights.biases.w13, dense.biases.w13)


def test_reference_matches_the_dense_reference_on_the_dequantized_weights(gen: torch.Generator) -> None:
    weights = _random_weights(gen)
    config = MoeRunnerConfig(
        num_experts=4, hidden_size=64, intermediate_size_per_partition=32, top_k=2,
        activation=ClampedSwiglu(), expert_biases=True,
    )
    x = torch.randn(16, 64, generator=gen)
    dispatch = StandardDispatchOutput(x, select_experts(torch.randn(16, 4, generator=gen), config))
    out = create_runner(REFERENCE_MXFP4, config).run(dispatch, weights)
    assert torch.equal(out, create_runner(REFERENCE_DENSE, config).run(dispatch, weights.dequantize()))
    assert MXFP4.weights_type is Mxfp4MoeWeights


def test_the_fixture_loads_through_the_gpt_oss_scheme_bit_exact_with_transformers() -> None:
    transformers = pytest.importorskip("transformers")
    model = transformers.AutoModelForCausalLM.from_pretrained(
        FIXTURE, quantization_config=transformers.Mxfp4Config(dequantize=True), dtype=torch.float32
    )
    checkpoint = MoeCheckpoint(FIXTURE)
    assert checkpoint.scheme().name == "gpt-oss-mxfp4" and checkpoint.scheme() in SCHEMES
    for index in checkpoint.moe_layers():
        layer = checkpoint.load_layer(index, keep_canonical=True)
        weights = layer.weights
        assert isinstance(weights, Mxfp4MoeWeights) and weights.biases is not None
        experts = model.model.layers[index].mlp.experts  # transformers: [E, H, 2I] interleaved, [E, I, H]
        interleaved = GateUpLayout.INTERLEAVED
        assert torch.equal(weights.w13.dequantize(), interleaved.to_concatenated(experts.gate_up_proj.transpose(1, 2), 1))
        assert torch.equal(weights.w2.dequantize(), experts.down_proj.transpose(1, 2))
        assert torch.equal(weights.biases.w13.float(), interleaved.to_concatenated(experts.gate_up_proj_bias, 1))
        assert torch.equal(weights.biases.w2.float(), experts.down_proj_bias)


def _layer(checkpoint: MoeCheckpoint, index: int) -> MoeLayer:
    scheme = checkpoint.load_into(index, GptOssMxfp4MoE(checkpoint.runner_config(), activation_dtype=torch.float32))
    assert scheme.forward is not None
    prefix = f"{checkpoint.block_prefix(index)}.router"
    tensors = dict(checkpoint._read([f"{prefix}.weight", f"{prefix}.bias"]))
    router = Router(weight=tensors[f"{prefix}.weight"].float(), bias=tensors[f"{prefix}.bias"].float())
    return MoeLayer(config=scheme.config, router=router, experts=scheme.forward, backend=scheme.backend_summary())


@pytest.mark.transformers
def test_the_block_and_the_model_match_transformers(gen: torch.Generator) -> None:
    transformers = pytest.importorskip("transformers")
    from moe_core.integrations.transformers import BlockReturn, MoeCoreBlock

    model = transformers.AutoModelForCausalLM.from_pretrained(
        FIXTURE, quantization_config=transformers.Mxfp4Config(dequantize=True), dtype=torch.float32
    ).eval()
    checkpoint = MoeCheckpoint(FIXTURE)
    x = torch.randn(2, 12, checkpoint.hidden_size, generator=gen)
    ids = torch.randint(0, 128, (2, 12), generator=gen)
    with torch.no_grad():
        expected_block = model.model.layers[0].mlp(x)[0]
        expected = model(ids).logits
        for index in checkpoint.moe_layers():
            model.model.layers[index].mlp = MoeCoreBlock(_layer(checkpoint, index), BlockReturn.WITH_TOPK_WEIGHTS, "gpt_oss", torch.float32).eval()
        block = model.model.layers[0].mlp(x)[0]
        logits = model(ids).logits
    assert float((block - expected_block).norm() / expected_block.norm()) < TOLERANCE
    assert float((logits - expected).norm() / expected.norm()) < TOLERANCE


def test_expert_parallel_ranks_hold_their_slice_of_the_layer() -> None:
    checkpoint = MoeCheckpoint(FIXTURE)
    full = checkpoint.load_layer(1, keep_canonical=True).weights
    assert isinstance(full, Mxfp4MoeWeights) and full.biases is not None
    for offset in (0, 2):
        config = checkpoint.runner_config(num_local_experts=2, local_expert_offset=offset)
        part = checkpoint.load_into(1, GptOssMxfp4MoE(config), keep_canonical=True).weights
        assert part is not None and part.biases is not None
        assert torch.equal(part.w13.packed, full.w13.packed[offset : offset + 2])
        assert torch.equal(part.w2.scales.codes, full.w2.scales.codes[offset : offset + 2])
        assert torch.equal(part.biases.w13, full.biases.w13[offset : offset + 2])


def test_the_scheme_names_a_wrong_or_missing_tensor() -> None:
    checkpoint = MoeCheckpoint(FIXTURE)
    scheme = GptOssMxfp4MoE(checkpoint.runner_config())
    with pytest.raises(ValueError, match=r"experts\.1\.up_proj\.scales: expected shape \(64, 2\) .*, got \(64, 4\)"):
        scheme.load_expert_weight("scales", torch.zeros(64, 4, dtype=torch.uint8), expert_id=1, shard=ExpertShard.UP)
    with pytest.raises(TypeError, match=r"experts\.0\.down_proj\.blocks: expected dtype torch.uint8"):
        scheme.load_expert_weight("blocks", torch.zeros(64, 2, 16), expert_id=0, shard=ExpertShard.DOWN)
    with pytest.raises(ValueError, match=r"36 checkpoint tensors were never loaded: experts\.0\.gate_proj\.blocks"):
        scheme.process_weights_after_loading()
    with pytest.raises(ValueError, match="expert_biases"):
        GptOssMxfp4MoE(MoeRunnerConfig(num_experts=4, hidden_size=64, intermediate_size_per_partition=64, top_k=2))


def test_mxfp4_runs_its_own_kernel_on_hopper_and_degrades_to_bf16_by_name() -> None:
    """On Hopper the MXFP4 layer runs triton-mxfp4-w4a16 (no degradation); triton-dense on its bf16 values stays the
    fallback (named, shown, refused by strict); on the CPU its own oracle."""
    layer = LayerSpec(MoeRunnerConfig(num_experts=8, hidden_size=2880, intermediate_size_per_partition=2880, top_k=4), MXFP4)
    hopper = choose(MXFP4, DeviceSpec.parse("sm90"), layer)
    assert hopper.chosen.name == "triton-mxfp4-w4a16" and hopper.degradation is None
    assert choose(MXFP4, DeviceSpec.parse("sm90"), layer, strict=True).chosen.name == "triton-mxfp4-w4a16"
    dense = choose(MXFP4, DeviceSpec.parse("sm90"), layer, name="triton-dense")
    assert dense.degradation is not None and dense.degradation.startswith("mxfp4 -> dense: weights dequantized once")
    with pytest.raises(BackendSelectionError, match="strict: no degradation"):
        choose(MXFP4, DeviceSpec.parse("sm90"), layer, name="triton-dense", strict=True)
    assert choose(MXFP4, DeviceSpec.parse("cpu"), layer).chosen.name == "reference-mxfp4"


def test_the_bf16_degradation_is_exact() -> None:
    gen = torch.Generator().manual_seed(7)
    weights = Mxfp4MoeWeights(
        w13=Mxfp4ExpertWeights.quantize(torch.randn(2, 128, 64, generator=gen) * 3),
        w2=Mxfp4ExpertWeights.quantize(torch.randn(2, 64, 64, generator=gen) / 50),
    )
    dense = MXFP4_TO_BF16.convert(weights)
    assert dense.w13.dtype == torch.bfloat16
    assert torch.equal(dense.w13.float(), weights.w13.dequantize()) and torch.equal(dense.w2.float(), weights.w2.dequantize())


def test_the_router_weight_alone_of_a_router_with_a_bias_is_refused() -> None:
    """Silent (adversarial pass 6, c28): ``Router(weight=checkpoint.router_weight(0))`` of gpt-oss dropped the router's
    logit bias and routed other experts (0.012-0.14 off). The weight alone is refused where the router has a bias,
    naming the whole router, which keeps it."""
    checkpoint = MoeCheckpoint(FIXTURE)
    with pytest.raises(ValueError, match=r"router_weight: layer 0's router also adds a logit bias .* router\(layer\)"):
        checkpoint.router_weight(0)
    router = checkpoint.router(0)
    assert router.bias is not None and router.weight.shape == (checkpoint.runner_config().num_experts, checkpoint.hidden_size)
