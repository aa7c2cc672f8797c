"""Every malformed argument gets an error that names it; checkpoint entry points name their policy.

One test per hole the issue "The typed guarantee must hold where users are"
listed, each with the error it now gets.
"""

from __future__ import annotations

import copy

import attrs
import pytest
import torch

from moe_core import (
    NVFP4,
    DenseMoeWeights,
    DequantizeGlobalScale,
    DeviceSpec,
    Fp8TensorScale,
    ExpertQuantizeGlobalScales,
    ExpertScalePolicy,
    LayerSpec,
    LinearBlockScales,
    MoeRunnerConfig,
    Nvfp4ExpertWeights,
    Nvfp4GateUpWeights,
    Nvfp4MoeWeights,
    Nvfp4Tensor,
    QuantizeGlobalScale,
    StandardDispatchOutput,
    TopKOutput,
    choose,
    create_runner,
    select_experts,
)
import moe_core._checks
from moe_core._checks import FINITE_CHUNK, require_finite
from moe_core.backends.reference import REFERENCE_DENSE, REFERENCE_NVFP4
from moe_core.expert_params import ExpertParams, ParamLayout, ParamSpec
from moe_core.synthetic import random_dense_layer, random_nvfp4_layer

CONFIG = MoeRunnerConfig(num_experts=4, hidden_size=32, intermediate_size_per_partition=16, top_k=2)
META = torch.device("meta")


def seed_from(gen: torch.Generator) -> int:
    return int(torch.randint(1 << 30, (1,), generator=gen))


def test_expert_0s_scale_is_refused_as_the_scalar_for_all(gen: torch.Generator) -> None:
    per_expert = (torch.rand(8, generator=gen) + 0.5) * 1e4  # quantize side, as compressed-tensors stores them
    with pytest.raises(ValueError, match=r"one-element view into a larger tensor \(like per_expert\[:1\]"):
        QuantizeGlobalScale.from_checkpoint(per_expert[:1], num_experts=1, policy=ExpertScalePolicy.CONSERVATIVE)
    amax = 2688 / per_expert
    for view in (amax[:1], amax[0], amax[3:4]):
        with pytest.raises(ValueError, match=r"amax: got a one-element view into a larger tensor"):
            QuantizeGlobalScale.from_amax(view)
    assert QuantizeGlobalScale.from_amax(amax.max()).item() == pytest.approx(float(per_expert.min()), rel=1e-6)
    with pytest.raises(ValueError, match=r"got a broadcast tensor of shape \(8,\) \(like per_expert\[:1\].expand\(E\)"):
        QuantizeGlobalScale.from_checkpoint(per_expert[:1].expand(8), num_experts=8, policy=ExpertScalePolicy.CONSERVATIVE)
    for copied in (per_expert[:1].clone(), per_expert[:1].float(), per_expert.max().reshape(1), per_expert[:4].clone()):
        with pytest.raises(ValueError, match=r"one row of values per expert of the layer \(dim 0 of size num_experts=8\)"):
            QuantizeGlobalScale.from_checkpoint(copied, num_experts=8, policy=ExpertScalePolicy.CONSERVATIVE)
    fused = per_expert.reshape(4, 2)  # gate/up weight global scales side by side: [:, 0] is the gate's alone
    with pytest.raises(ValueError, match=r"strided view \(like a fused \[E, 2\] gate/up scale's \[:, 0\]"):
        ExpertQuantizeGlobalScales.from_checkpoint(fused[:, 0])
    with pytest.raises(ValueError, match="experts disagree"):
        QuantizeGlobalScale.from_checkpoint(per_expert, num_experts=8, policy=ExpertScalePolicy.REQUIRE_EQUAL)
    scalar = QuantizeGlobalScale.from_checkpoint(per_expert, num_experts=8, policy=ExpertScalePolicy.CONSERVATIVE)
    assert scalar.value.shape == (1,) and scalar.item() == float(per_expert.min())
    paired = QuantizeGlobalScale.from_checkpoint(per_expert.reshape(4, 2), num_experts=4, policy=ExpertScalePolicy.CONSERVATIVE)
    assert paired.item() == float(per_expert.min()), "[E, 2] gate/up scales collapse like [E]"


def test_a_scale_owns_its_tensor(gen: torch.Generator) -> None:
    tensor = (torch.rand(1, generator=gen) + 0.5) * 1e4
    scale = QuantizeGlobalScale.from_checkpoint(tensor, num_experts=1, policy=ExpertScalePolicy.REQUIRE_EQUAL)
    per_expert = (torch.rand(4, generator=gen) + 0.5) * 1e4
    experts = ExpertQuantizeGlobalScales.from_checkpoint(per_expert)
    before, experts_before = scale.item(), experts.value.clone()
    tensor.fill_(-1.0)
    per_expert.fill_(-1.0)
    assert scale.item() == before and torch.equal(experts.value, experts_before)


@pytest.mark.parametrize(
    ("amax", "error", "message"),
    [
        (torch.ones(4), ValueError, r"amax: expected one value .* got shape \(4,\); per-expert amax values go through"),
        (torch.ones(1, 1), ValueError, r"amax: expected one value .* got shape \(1, 1\)"),
        ("4.0", TypeError, "amax: expected a float or a floating-point tensor, got str"),
        (True, TypeError, "amax: expected a float or a floating-point tensor, got bool"),
        (torch.tensor([3]), TypeError, "amax: expected a floating-point tensor, got dtype torch.int64"),
        (float("nan"), ValueError, "amax: expected finite values"),
        (-1.0, ValueError, "amax: expected values > 0"),
    ],
)
def test_from_amax_takes_one_positive_float(amax: object, error: type[Exception], message: str) -> None:
    with pytest.raises(error, match=message):
        QuantizeGlobalScale.from_amax(amax)  # type: ignore[arg-type]  # the run-time check under test


def test_quantize_takes_one_scale_per_expert_and_some_rows(gen: torch.Generator) -> None:
    three = ExpertQuantizeGlobalScales.from_amax(torch.rand(3, generator=gen) + 0.5)
    with pytest.raises(ValueError, match="global_scales: expected 1 scales, one per expert of w, got 3"):
        Nvfp4ExpertWeights.quantize(torch.randn(1, 8, 32, generator=gen), three)
    with pytest.raises(ValueError, match=r"w: expected no empty dim in .*, got shape \(2, 0, 32\)"):
        Nvfp4ExpertWeights.quantize(torch.randn(2, 0, 32, generator=gen))
    with pytest.raises(ValueError, match=r"x: expected no empty dim in .*, got shape \(0, 32\)"):
        Nvfp4Tensor.quantize(torch.randn(0, 32, generator=gen), QuantizeGlobalScale.from_amax(1.0))


def test_dequantize_expert_takes_an_index_in_range(gen: torch.Generator) -> None:
    weights = Nvfp4GateUpWeights.quantize(torch.randn(2, 8, 32, generator=gen))
    with pytest.raises(ValueError, match="expert: expected an int >= 0, got -1"):
        weights.dequantize_expert(-1)
    with pytest.raises(ValueError, match="expert: expected an index below num_experts=2, got 2"):
        weights.gate.dequantize_expert(2)


def test_non_finite_inputs_are_named(gen: torch.Generator) -> None:
    weights, dispatch = random_dense_layer(CONFIG, 6, torch.float32, torch.device("cpu"), seed_from(gen))
    runner = create_runner(REFERENCE_DENSE, CONFIG)
    for bad in (float("nan"), float("inf")):
        hidden = dispatch.hidden_states.clone()
        hidden[3, 5] = bad
        with pytest.raises(ValueError, match="hidden_states: expected finite values"):
            runner.run(StandardDispatchOutput(hidden, dispatch.topk), weights)
    topk_weights = dispatch.topk.topk_weights.clone()
    topk_weights[0, 1] = float("nan")
    unchecked = TopKOutput(dispatch.topk.topk_ids, topk_weights, num_experts=4, check_values=False)
    with pytest.raises(ValueError, match="topk_weights: expected finite values"):
        runner.run(StandardDispatchOutput(dispatch.hidden_states, unchecked), weights)
    with pytest.raises(ValueError, match="topk_weights: expected finite values"):
        TopKOutput(dispatch.topk.topk_ids, topk_weights, num_experts=4)
    w13 = weights.w13.clone()
    w13[1, 2, 3] = float("nan")
    with pytest.raises(ValueError, match="DenseMoeWeights.w13: expected finite values"):
        DenseMoeWeights(w13=w13, w2=weights.w2)
    nvfp4, nvfp4_dispatch = random_nvfp4_layer(CONFIG, 6, torch.float32, torch.device("cpu"), seed_from(gen))
    hidden = nvfp4_dispatch.hidden_states.clone()
    hidden[0, 0] = float("nan")
    with pytest.raises(ValueError, match="hidden_states: expected finite values"):
        create_runner(REFERENCE_NVFP4, CONFIG).run(StandardDispatchOutput(hidden, nvfp4_dispatch.topk), nvfp4)


def test_expert_ids_are_distinct_per_row_and_below_num_experts(gen: torch.Generator) -> None:
    weights = torch.rand(3, 2, generator=gen)
    with pytest.raises(ValueError, match=r"topk_ids: expected distinct experts in each row, row 1 is \[2, 2\]"):
        TopKOutput(torch.tensor([[0, 1], [2, 2], [3, 1]], dtype=torch.int32), weights, num_experts=4)
    with pytest.raises(ValueError, match=r"topk_ids: expected ids < 4 \(num_experts\), got 4"):
        TopKOutput(torch.tensor([[0, 1], [2, 4], [3, 1]], dtype=torch.int32), weights, num_experts=4)
    duplicated = TopKOutput(torch.tensor([[0, 1], [2, 2], [3, 1]], dtype=torch.int32), weights, num_experts=4, check_values=False)
    dense, _ = random_dense_layer(CONFIG, 3, torch.float32, torch.device("cpu"), seed_from(gen))
    with pytest.raises(ValueError, match="topk_ids: expected distinct experts in each row"):
        create_runner(REFERENCE_DENSE, CONFIG).run(StandardDispatchOutput(torch.randn(3, 32, generator=gen), duplicated), dense)


def test_quant_info_builds_on_meta_with_shape_checks() -> None:
    """Engines create layers on meta first: the types build there, checking shapes; values are checked on load."""
    def nvfp4_half(rows: int, cols: int) -> Nvfp4ExpertWeights:
        return Nvfp4ExpertWeights(
            torch.empty(4, rows, cols // 2, dtype=torch.uint8, device=META),
            LinearBlockScales.from_checkpoint(torch.empty(4, rows, cols // 16, dtype=torch.float8_e4m3fn, device=META)),
            ExpertQuantizeGlobalScales.from_checkpoint(torch.empty(4, device=META)),
        )

    scale = QuantizeGlobalScale.from_checkpoint(torch.empty(4, device=META), num_experts=4, policy=ExpertScalePolicy.REQUIRE_EQUAL)
    weights = Nvfp4MoeWeights(
        w13=Nvfp4GateUpWeights(gate=nvfp4_half(16, 32), up=nvfp4_half(16, 32)),
        w2=nvfp4_half(32, 16),
        w13_input_scale=scale,
        w2_input_scale=QuantizeGlobalScale.from_amax(torch.empty(1, device=META)),
    )
    assert weights.device == META and (weights.num_experts, weights.hidden_size, weights.intermediate_size) == (4, 32, 16)
    assert Nvfp4GateUpWeights.quantize(torch.empty(4, 32, 32, device=META)).shape == (4, 32, 32)
    dense = DenseMoeWeights(w13=torch.empty(4, 32, 32, device=META), w2=torch.empty(4, 32, 16, device=META))
    assert dense.device == META
    topk = select_experts(torch.empty(6, 4, device=META), CONFIG)
    assert topk.topk_ids.device == META and topk.topk_ids.shape == (6, 2)
    with pytest.raises(ValueError, match=r"Nvfp4MoeWeights.w2: expected shape \(4, 32, 16\)"):
        Nvfp4MoeWeights(w13=weights.w13, w2=nvfp4_half(32, 32), w13_input_scale=scale, w2_input_scale=scale)
    with pytest.raises(ValueError, match=r"QuantizeGlobalScale.value: expected shape \(1,\)"):
        QuantizeGlobalScale._of(torch.empty(2, device=META))


def test_tensor_holding_classes_compare_by_identity(gen: torch.Generator) -> None:
    weights, dispatch = random_nvfp4_layer(CONFIG, 4, torch.float32, torch.device("cpu"), seed_from(gen))
    other, _ = random_nvfp4_layer(CONFIG, 4, torch.float32, torch.device("cpu"), seed_from(gen))
    for one, two in [
        (weights, other),
        (weights.w13, other.w13),
        (weights.w2, other.w2),
        (weights.w2.block_scales, other.w2.block_scales),
        (weights.w13_input_scale, other.w13_input_scale),
        (weights.w2.global_scales, other.w2.global_scales),
        (dispatch, StandardDispatchOutput(dispatch.hidden_states, dispatch.topk)),
        (dispatch.topk, select_experts(torch.randn(4, 4, generator=gen), CONFIG)),
    ]:
        assert one == one and one != two and hash(one) != hash(two), type(one).__name__


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32, torch.float8_e4m3fn])
@pytest.mark.parametrize("where", [(0, 0, 0), (3, 7, 5)])
@pytest.mark.parametrize("chunk", [FINITE_CHUNK, 100, 16], ids=["one-chunk", "two-experts-a-chunk", "one-expert-a-chunk"])
def test_finite_check_finds_a_bad_value_in_any_expert_slice(
    gen: torch.Generator, monkeypatch: pytest.MonkeyPatch, dtype: torch.dtype, where: tuple[int, int, int], chunk: int
) -> None:
    monkeypatch.setattr(moe_core._checks, "FINITE_CHUNK", chunk)
    stack = torch.randn(4, 8, 6, generator=gen).to(dtype)
    require_finite("stack", stack)
    for bad in (float("nan"), float("inf")) if dtype != torch.float8_e4m3fn else (float("nan"),):  # E4M3FN has no inf
        broken = stack.clone()
        broken[where] = bad
        with pytest.raises(ValueError, match="stack: expected finite values"):
            require_finite("stack", broken)
    with pytest.raises(ValueError, match="scale: expected finite values"):
        require_finite("scale", torch.tensor(float("nan")).to(dtype))


def test_topk_weights_must_be_weights_not_logits(gen: torch.Generator) -> None:
    """Raw router logits handed over as top-k weights (a forgotten softmax): negative values are refused by name."""
    logits = torch.randn(5, 8, generator=gen)
    values, ids = logits.topk(2)
    values[0, 0] = -abs(float(values[0, 0])) - 0.1
    with pytest.raises(ValueError, match=r"topk_weights: expected values >= 0, got minimum -"):
        TopKOutput(ids.to(torch.int32), values, num_experts=8)


def test_a_scalar_from_some_experts_is_refused_where_the_layer_is_bound(gen: torch.Generator) -> None:
    """A scalar input scale remembers how many experts' values it was collapsed from; binding it to a layer of
    another count is refused, however the slice was spelled (a false num_experts, from_experts of a slice), and the
    count survives conversions, device moves and copies."""
    config = MoeRunnerConfig(num_experts=4, hidden_size=32, intermediate_size_per_partition=16, top_k=2)
    weights, dispatch = random_nvfp4_layer(config, 6, torch.float32, torch.device("cpu"), int(torch.randint(2**31, (1,), generator=gen)))
    route = choose(NVFP4, DeviceSpec.parse("cpu"), LayerSpec(config, NVFP4)).chosen
    per_expert = weights.w13_input_scale.value.expand(4).clone() * (1 + torch.rand(4, generator=gen))
    one = QuantizeGlobalScale.from_checkpoint(per_expert[:1].clone(), num_experts=1, policy=ExpertScalePolicy.CONSERVATIVE)
    sliced = QuantizeGlobalScale.from_experts(
        ExpertQuantizeGlobalScales.from_checkpoint(per_expert).experts(0, 2), policy=ExpertScalePolicy.CONSERVATIVE
    )
    converted = QuantizeGlobalScale.from_dequantize(DequantizeGlobalScale.from_quantize(one)).to("cpu")
    for scale, count in ((one, 1), (sliced, 2), (converted, 1), (copy.deepcopy(one), 1)):
        assert scale.experts == count
        sliced_weights = attrs.evolve(weights, w13_input_scale=scale)
        with pytest.raises(ValueError, match=rf"w13_input_scale: collapsed from {count} expert\(s\)' values, but the layer has 4"):
            route.bind(config, sliced_weights)
        with pytest.raises(ValueError, match=rf"collapsed from {count} expert\(s\)' values"):  # a runner made by hand
            create_runner(REFERENCE_NVFP4, config).run(dispatch, sliced_weights)
    every = QuantizeGlobalScale.from_checkpoint(per_expert, num_experts=4, policy=ExpertScalePolicy.CONSERVATIVE)
    assert every.experts == 4 and route.bind(config, attrs.evolve(weights, w13_input_scale=every))(dispatch).isfinite().all()
    assert weights.w13_input_scale.experts is None, "from_amax: a value for the whole layer"


def test_a_checkpoints_one_layer_wide_value_enters_by_name(gen: torch.Generator) -> None:
    """A fused-expert checkpoint may store one input scale for the whole layer: from_layer_checkpoint takes it (no
    expert count to check, like from_amax) and refuses a slice of a per-expert tensor posing as it."""
    per_expert = (torch.rand(8, generator=gen) + 0.5) * 1e3
    layer_wide = per_expert.min().clone()
    assert QuantizeGlobalScale.from_layer_checkpoint(layer_wide).experts is None
    assert Fp8TensorScale.from_layer_checkpoint(torch.tensor([0.02])).item() == pytest.approx(0.02)
    assert DequantizeGlobalScale.from_layer_checkpoint(1 / layer_wide).experts is None
    with pytest.raises(ValueError, match=r"from_layer_checkpoint: got a one-element view into a larger tensor"):
        QuantizeGlobalScale.from_layer_checkpoint(per_expert[:1])
    with pytest.raises(ValueError, match=r"from_layer_checkpoint: expected the layer's one value \(shape \(\) or \(1,\)\), got shape \(8,\)"):
        Fp8TensorScale.from_layer_checkpoint(per_expert)
    with pytest.raises(ValueError, match=r"expected quantize-side"):
        QuantizeGlobalScale.from_layer_checkpoint(1 / layer_wide)


def test_gate_up_fused_of_one_value_per_projection_is_refused_by_name() -> None:
    """Raw error (adversarial pass 19, s01b): a scheme author's ``gate_up_fused`` on a global-scale spec
    (``ParamLayout.SCALAR``) failed with ``IndexError: tuple index out of range``."""
    config = MoeRunnerConfig(num_experts=2, hidden_size=32, intermediate_size_per_partition=16, top_k=1)
    specs = (ParamSpec("weight", torch.float32, ParamLayout.MATRIX), ParamSpec("scale", torch.float32, ParamLayout.SCALAR))
    params = ExpertParams("mine", specs, config, torch.device("cpu"))
    assert params.gate_up_fused("weight").shape == (2, 32, 32) and params.gate_up("scale").shape == (2, 2)
    with pytest.raises(ValueError, match=r"mine: gate_up_fused\('scale'\): a tensor of one value per projection"):
        params.gate_up_fused("scale")
