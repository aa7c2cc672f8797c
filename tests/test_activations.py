"""Each activation against a direct formula; gpt-oss's interleaved layout and biases; shared experts; and the
backends' refusals of what they do not compute (their own ``supports``, and the capability listing)."""

from __future__ import annotations

import math

import attrs
import pytest
import torch

from moe_core.backends.reference import REFERENCE_DENSE
from moe_core.backends._flashinfer import swiglu_only
from moe_core.backends.triton import dense_supports, fp8_supports
from moe_core.capability import DeviceSpec, LayerSpec
from moe_core.capability_listing import capability_table
from moe_core.config import HIDDEN_ACTS, Activation, ClampedSwiglu, GateClamp, LimitedSwiglu, Llama4Sigmoid, MoeRunnerConfig, RoutingMethod
from moe_core.dispatch import StandardDispatchOutput
from moe_core.formats import FP8
from moe_core.formats.dense import DENSE, DenseMoeWeights, DenseRecipe, ExpertBiases, GateUpLayout
from moe_core.formats.reference import ReferenceRunner
from moe_core.layer import SharedExpert, dense_layer
from moe_core.routing import Router, select_experts

E, H, I, K = 4, 16, 8, 2


def _near(got: torch.Tensor, want: torch.Tensor, scale: torch.Tensor | None = None) -> bool:
    """Equal up to float32 rounding, relative to the largest magnitude of ``scale`` (default ``want``)."""
    return float((got - want).abs().max()) <= 1e-5 * float((want if scale is None else scale).abs().max())


def _gelu_tanh(g: torch.Tensor) -> torch.Tensor:
    return 0.5 * g * (1 + torch.tanh(math.sqrt(2 / math.pi) * (g + 0.044715 * g**3)))


FORMULAS = {
    Activation.SILU_GATED: lambda g, u: g / (1 + torch.exp(-g)) * u,
    Activation.GELU_GATED: lambda g, u: 0.5 * g * (1 + torch.erf(g / math.sqrt(2))) * u,
    Activation.GELU_TANH_GATED: lambda g, u: _gelu_tanh(g) * u,
}


@pytest.mark.parametrize("activation", list(FORMULAS), ids=lambda a: a.value)
def test_gated_activation_against_its_formula(gen: torch.Generator, activation: Activation) -> None:
    gate_up = torch.randn(10, 2 * I, generator=gen, dtype=torch.float64) * 3
    gate, up = gate_up[:, :I], gate_up[:, I:]
    assert torch.allclose(activation.apply(gate_up), FORMULAS[activation](gate, up), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("name", sorted(HIDDEN_ACTS))
def test_each_hidden_act_name_computes_what_transformers_does(gen: torch.Generator, name: str) -> None:
    """Each ``hidden_act`` read from a config is transformers' own function of that name (its ``ACT2FN``) within 1e-9
    (``gelu_fast`` writes sqrt(2/pi) to 10 digits): a name mapped to a near relative (``quick_gelu`` for GELU, 2e-2
    apart) would run silently off."""
    activations = pytest.importorskip("transformers.activations")
    gate_up = torch.randn(64, 2 * 32, generator=gen, dtype=torch.float64) * 4
    activation = HIDDEN_ACTS[name]
    theirs = activations.ACT2FN[name]
    gate, up = gate_up.chunk(2, dim=-1)
    want = theirs(gate) * up if activation.gated else theirs(gate_up)
    torch.testing.assert_close(activation.apply(gate_up), want, rtol=1e-9, atol=1e-9)


def test_relu2_is_not_gated(gen: torch.Generator) -> None:
    h = torch.randn(10, I, generator=gen, dtype=torch.float64)
    assert not Activation.RELU2.gated
    assert torch.equal(Activation.RELU2.apply(h), torch.where(h > 0, h * h, 0.0))


def test_clamped_swiglu_against_its_formula(gen: torch.Generator) -> None:
    activation = ClampedSwiglu()
    gate_up = torch.randn(10, 2 * I, generator=gen, dtype=torch.float64) * 8  # many values past the limit of 7
    gate, up = gate_up[:, :I].clamp(max=7.0), gate_up[:, I:].clamp(-7.0, 7.0)
    want = (up + 1) * gate / (1 + torch.exp(-1.702 * gate))
    assert (activation.alpha, activation.limit) == (1.702, 7.0)
    assert torch.allclose(activation.apply(gate_up), want, rtol=1e-12, atol=1e-12)
    assert bool((gate_up[:, :I] < -7).any()) and bool((gate_up[:, :I] > 7).any())  # only the top clamps the gate


@pytest.mark.parametrize("clamp", list(GateClamp), ids=lambda c: c.value)
def test_limited_swiglu_against_its_formula(gen: torch.Generator, clamp: GateClamp) -> None:
    """DeepSeek-V4 / GLM-5-Next / HY-V4 clamp the gate before its SiLU, Step 3.7 after; both clamp up to
    [-limit, limit], with no alpha and no + 1 (unlike gpt-oss's)."""
    activation = LimitedSwiglu(limit=2.0, gate_clamp=clamp)
    gate_up = torch.randn(10, 2 * I, generator=gen, dtype=torch.float64) * 4
    gate, up = gate_up[:, :I], gate_up[:, I:].clamp(-2.0, 2.0)
    def silu(g: torch.Tensor) -> torch.Tensor:
        return g / (1 + torch.exp(-g))

    want = silu(gate.clamp(max=2.0)) * up if clamp is GateClamp.BEFORE_SILU else silu(gate).clamp(max=2.0) * up
    assert torch.allclose(activation.apply(gate_up), want, rtol=1e-12, atol=1e-12)
    assert bool((silu(gate) > 2.0).any()), "the inputs pass the limit, where the placements differ"


def test_limited_swiglu_needs_its_gate_clamp_and_a_positive_limit() -> None:
    with pytest.raises(TypeError, match="LimitedSwiglu.gate_clamp: expected a GateClamp"):
        LimitedSwiglu(limit=7.0, gate_clamp="before_silu")  # type: ignore[arg-type]  # the misuse under test
    with pytest.raises(ValueError, match="LimitedSwiglu.limit: expected a finite value > 0"):
        LimitedSwiglu(limit=float("inf"), gate_clamp=GateClamp.AFTER_SILU)


def test_interleaved_gate_up_rows_are_reordered(gen: torch.Generator) -> None:
    gate, up = torch.randn(E, I, H, generator=gen), torch.randn(E, I, H, generator=gen)
    interleaved = torch.stack((gate, up), dim=2).reshape(E, 2 * I, H)
    bias_gate, bias_up = torch.randn(E, I, generator=gen), torch.randn(E, I, generator=gen)
    biases = ExpertBiases(w13=torch.stack((bias_gate, bias_up), dim=2).reshape(E, 2 * I), w2=torch.zeros(E, H))
    weights = DenseMoeWeights.from_checkpoint(
        w13=interleaved, w2=torch.randn(E, H, I, generator=gen), layout=GateUpLayout.INTERLEAVED, biases=biases
    )
    assert torch.equal(weights.w13, torch.cat((gate, up), dim=1))
    assert weights.biases is not None and torch.equal(weights.biases.w13, torch.cat((bias_gate, bias_up), dim=1))


def _dispatch(gen: torch.Generator, config: MoeRunnerConfig) -> StandardDispatchOutput:
    x = torch.randn(9, H, generator=gen)
    return StandardDispatchOutput(x, select_experts(torch.randn(9, E, generator=gen), config, score_correction_bias=None))


def test_reference_adds_both_biases(gen: torch.Generator) -> None:
    config = MoeRunnerConfig(E, H, I, K, activation=ClampedSwiglu(), expert_biases=True)
    biases = ExpertBiases(w13=torch.randn(E, 2 * I, generator=gen), w2=torch.randn(E, H, generator=gen))
    weights = DenseMoeWeights(
        w13=torch.randn(E, 2 * I, H, generator=gen), w2=torch.randn(E, H, I, generator=gen), biases=biases
    )
    dispatch = _dispatch(gen, config)
    got = ReferenceRunner(config, DenseRecipe()).run(dispatch, weights)
    ids, w = dispatch.topk.topk_ids, dispatch.topk.topk_weights
    for t in range(9):
        want = torch.zeros(H)
        for k in range(K):
            e = int(ids[t, k])
            h = ClampedSwiglu().apply(weights.w13[e] @ dispatch.hidden_states[t] + biases.w13[e])
            want += w[t, k] * (weights.w2[e] @ h + biases.w2[e])
        assert _near(got[t], want)
    with pytest.raises(ValueError, match="the config says expert_biases=False, the weights carry some"):
        ReferenceRunner(attrs.evolve(config, expert_biases=False), DenseRecipe()).run(dispatch, weights)


def test_relu2_experts_have_i_rows(gen: torch.Generator) -> None:
    config = MoeRunnerConfig(E, H, I, K, activation=Activation.RELU2)
    weights = DenseMoeWeights(w13=torch.randn(E, I, H, generator=gen), w2=torch.randn(E, H, I, generator=gen))
    assert not weights.gated and weights.intermediate_size == I
    dispatch = _dispatch(gen, config)
    got = ReferenceRunner(config, DenseRecipe()).run(dispatch, weights)
    for t in range(9):
        want = sum(
            w * (weights.w2[int(e)] @ torch.relu(weights.w13[int(e)] @ dispatch.hidden_states[t]) ** 2)
            for e, w in zip(dispatch.topk.topk_ids[t], dispatch.topk.topk_weights[t], strict=True)
        )
        assert _near(got[t], want)
    gated = attrs.evolve(config, activation=Activation.SILU_GATED)
    with pytest.raises(ValueError, match="expected w13 of 16 rows for silu, got 8"):
        ReferenceRunner(gated, DenseRecipe()).run(dispatch, weights)


def test_shared_expert_is_added_once_and_gated(gen: torch.Generator) -> None:
    config = MoeRunnerConfig(E, H, I, K)
    weights = DenseMoeWeights(w13=torch.randn(E, 2 * I, H, generator=gen), w2=torch.randn(E, H, I, generator=gen))
    router = Router(weight=torch.randn(E, H, generator=gen))
    shared = SharedExpert(
        w13=torch.randn(2 * 5, H, generator=gen), w2=torch.randn(H, 5, generator=gen), gate=torch.randn(1, H, generator=gen),
        activation=Activation.SILU_GATED,
    )
    x = torch.randn(7, H, generator=gen)
    with_shared = dense_layer(config, router, weights, dtype=torch.float32, shared_expert=shared)
    without = dense_layer(config, router, weights, dtype=torch.float32)
    gate, up = (x @ shared.w13.T).chunk(2, dim=-1)
    assert shared.gate is not None
    want = torch.sigmoid(x @ shared.gate.T) * ((torch.nn.functional.silu(gate) * up) @ shared.w2.T)
    full = with_shared(x)
    assert _near(full - without(x), want, scale=full)
    assert with_shared.backend.startswith("backend reference-dense")


def test_a_layer_refuses_experts_bound_for_another_config(gen: torch.Generator) -> None:
    """A layer's routing and scaling come from its config, its experts' from theirs: the two must be one layer."""
    config = MoeRunnerConfig(E, H, I, K)
    weights = DenseMoeWeights(w13=torch.randn(E, 2 * I, H, generator=gen), w2=torch.randn(E, H, I, generator=gen))
    layer = dense_layer(config, Router(weight=torch.randn(E, H, generator=gen)), weights, dtype=torch.float32)
    half = attrs.evolve(config, num_local_experts=E // 2)
    with pytest.raises(ValueError, match=r"MoeLayer.config: a layer routes and combines every token in one process"):
        dense_layer(half, Router(weight=torch.randn(E, H, generator=gen)), attrs.evolve(weights, w13=weights.w13[: E // 2], w2=weights.w2[: E // 2]), dtype=torch.float32)
    scaled = attrs.evolve(config, routed_scaling_factor=2.5)
    with pytest.raises(ValueError, match=r"MoeLayer.config: the experts were bound for another layer: routed_scaling_factor 2.5 \(experts': 1.0\)"):
        attrs.evolve(layer, config=scaled)
    bound_elsewhere = REFERENCE_DENSE.bind(scaled, weights)
    with pytest.raises(TypeError, match=r"MoeLayer.experts: expected the bound forward a route or backend key binds \(BoundRunner\), got function"):
        attrs.evolve(layer, experts=lambda dispatch: bound_elsewhere(dispatch))  # the wrapper hid the scaled config


def test_shared_expert_names_a_dtype_mismatch(gen: torch.Generator) -> None:
    """Weights of another dtype than the hidden states are named, not left to a matmul's error deep inside."""
    shared = SharedExpert(w13=torch.randn(2 * 5, H, generator=gen), w2=torch.randn(H, 5, generator=gen),
                          activation=Activation.SILU_GATED)
    with pytest.raises(TypeError, match=r"SharedExpert: hidden_states are torch.bfloat16, its weights torch.float32"):
        shared(torch.randn(3, H, generator=gen).to(torch.bfloat16))
    with pytest.raises(TypeError, match=r"SharedExpert.w2: expected dtype"):
        SharedExpert(w13=shared.w13, w2=shared.w2.to(torch.bfloat16), activation=Activation.SILU_GATED)


def test_dense_layer_refuses_biases_the_config_does_not_declare(gen: torch.Generator) -> None:
    biases = ExpertBiases(w13=torch.zeros(E, 2 * I), w2=torch.zeros(E, H))
    weights = DenseMoeWeights(w13=torch.zeros(E, 2 * I, H), w2=torch.zeros(E, H, I), biases=biases)
    with pytest.raises(ValueError, match="config.expert_biases: expected True"):
        dense_layer(MoeRunnerConfig(E, H, I, K), Router(weight=torch.zeros(E, H)), weights, dtype=torch.float32)


PLAIN = MoeRunnerConfig(64, 1024, 1024, 2)
REFUSED = [
    (attrs.evolve(PLAIN, activation=ClampedSwiglu()), "clamped_swiglu"),
    (attrs.evolve(PLAIN, activation=Activation.RELU2), "relu2"),
    (attrs.evolve(PLAIN, routing_method=Llama4Sigmoid()), "not its input"),
    (attrs.evolve(PLAIN, expert_biases=True), "biases"),
]


@pytest.mark.parametrize(("config", "reason"), REFUSED, ids=[r for _, r in REFUSED])
def test_kernels_refuse_what_they_do_not_compute(config: MoeRunnerConfig, reason: str) -> None:
    layer = LayerSpec(config, DENSE)
    triton = dense_supports(DeviceSpec.parse("sm90"), layer)
    if reason == "not its input":
        assert any(reason in r for r in triton.reasons)
    else:  # Triton's dense epilogue computes them; its FP8 weights are gated and hold no biases
        assert triton.ok, triton.reasons
        fp8 = fp8_supports(DeviceSpec.parse("sm90"), LayerSpec(config, FP8)).reasons
        assert any(reason in r for r in fp8) == (reason != "clamped_swiglu"), fp8
    assert any(reason in r for r in swiglu_only(layer))
    plain = LayerSpec(MoeRunnerConfig(64, 1024, 1024, 2, routing_method=RoutingMethod.SOFTMAX_TOPK), DENSE)
    assert dense_supports(DeviceSpec.parse("sm90"), plain).ok and not swiglu_only(plain)


def test_capability_table_lists_each_backends_values() -> None:
    rows = {row.backend: row for row in capability_table(DeviceSpec.parse("sm90"))}
    limited = ("swiglu_limit", "swiglu_limit_after_silu")
    assert rows["triton-dense"].supported_activations() == ("silu", "gelu", "gelu_tanh", "relu2", "clamped_swiglu", *limited)
    assert rows["triton-fp8"].supported_activations() == ("silu", "gelu", "gelu_tanh", "clamped_swiglu", *limited)
    assert "llama4_sigmoid" not in rows["triton-dense"].supported_routings()
    assert "grouped_topk" in rows["triton-dense"].supported_routings()
    assert rows["flashinfer-cutlass-bf16"].supported_activations() == ("silu",)
    assert len(rows["reference-dense"].supported_activations()) == 7
    assert len(rows["reference-dense"].supported_routings()) == 9  # grouped top-k by sigmoid, softmax, softmax group max
    assert {"grouped_topk_softmax", "grouped_topk_softmax_group_max"} <= set(rows["triton-dense"].supported_routings())
    assert "grouped_topk_softmax" not in rows["flashinfer-trtllm-fp4"].supported_routings()
