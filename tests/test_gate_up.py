"""Gate (w1) and up (w3) keep their own global scales; one-scale kernels reconcile them by a named policy."""

from __future__ import annotations

import pytest
import torch

from moe_core import (
    GateUpScalePolicy,
    MoeRunnerConfig,
    Nvfp4ExpertWeights,
    Nvfp4GateUpWeights,
    Nvfp4MoeWeights,
    QuantizeGlobalScale,
    StandardDispatchOutput,
    create_runner,
    select_experts,
)
from moe_core.backends.reference import REFERENCE_NVFP4
from moe_core.float64_moe import float64_moe, nvfp4_round_trips

E, I, H = 4, 32, 64


def gate_up(gen: torch.Generator, up_factor: float) -> tuple[torch.Tensor, Nvfp4GateUpWeights]:
    """Random w13 whose up rows are ``up_factor`` times larger, quantized half by half."""
    w13 = torch.randn(E, 2 * I, H, generator=gen) / 8
    w13[:, I:] *= up_factor
    return w13, Nvfp4GateUpWeights.quantize(w13)


def test_each_half_is_dequantized_with_its_own_scales(gen: torch.Generator) -> None:
    w13, weights = gate_up(gen, up_factor=10.0)
    ratio = weights.up.global_scales.value / weights.gate.global_scales.value
    amax_ratio = w13[:, :I].abs().amax(dim=(1, 2)) / w13[:, I:].abs().amax(dim=(1, 2))  # quantize side: 1 / amax
    torch.testing.assert_close(ratio, amax_ratio, rtol=1e-6, atol=0)
    assert bool((ratio < 0.2).all()), ratio  # the up half's 10x larger values: about a tenth of gate's scale
    exact = torch.cat((weights.gate.dequantize(), weights.up.dequantize()), dim=1)
    assert torch.equal(weights.dequantize(), exact)
    for expert in range(E):
        assert torch.equal(weights.dequantize_expert(expert), exact[expert])
    # NVFP4 keeps ~1/8 relative error per element at worst; reading up with gate's scale would be 10x off
    assert float((exact - w13).norm() / w13.norm()) < 0.15


def test_reference_runs_each_half_exactly(gen: torch.Generator) -> None:
    _, w13 = gate_up(gen, up_factor=6.0)
    w2 = Nvfp4ExpertWeights.quantize(torch.randn(E, H, I, generator=gen) / 6)
    weights = Nvfp4MoeWeights(
        w13=w13, w2=w2, w13_input_scale=QuantizeGlobalScale.from_amax(5.0), w2_input_scale=QuantizeGlobalScale.from_amax(8.0)
    )
    config = MoeRunnerConfig(num_experts=E, hidden_size=H, intermediate_size_per_partition=I, top_k=2)
    dispatch = StandardDispatchOutput(torch.randn(8, H, generator=gen), select_experts(torch.randn(8, E, generator=gen), config))
    out = create_runner(REFERENCE_NVFP4, config).run(dispatch, weights)
    expected = float64_moe(config, dispatch, w13.dequantize(), w2.dequantize(), nvfp4_round_trips(weights))
    assert float((out.double() - expected).norm() / expected.norm()) < 1e-5, "float32 math against float64, same round trips"


def test_require_equal_fuses_agreeing_halves_exactly(gen: torch.Generator) -> None:
    w13 = torch.randn(E, 2 * I, H, generator=gen)
    gate, up = w13.chunk(2, dim=1)
    scales = Nvfp4ExpertWeights.quantize(gate).global_scales
    weights = Nvfp4GateUpWeights(gate=Nvfp4ExpertWeights.quantize(gate, scales), up=Nvfp4ExpertWeights.quantize(up, scales))
    fused = weights.with_shared_global_scales(GateUpScalePolicy.REQUIRE_EQUAL)
    assert fused.shape == (E, 2 * I, H)
    assert torch.equal(fused.dequantize(), weights.dequantize())


def test_require_equal_refuses_differing_halves(gen: torch.Generator) -> None:
    _, weights = gate_up(gen, up_factor=3.0)
    with pytest.raises(ValueError, match=r"w13: gate and up global scales differ for experts \[0, 1, 2, 3\]"):
        weights.with_shared_global_scales(GateUpScalePolicy.REQUIRE_EQUAL)


@pytest.mark.parametrize("up_factor", [0.2, 4.0])
def test_rescale_moves_block_scales_onto_the_shared_scale_and_keeps_the_codes(gen: torch.Generator, up_factor: float) -> None:
    _, weights = gate_up(gen, up_factor)
    fused = weights.with_shared_global_scales(GateUpScalePolicy.RESCALE_BLOCK_SCALES)
    shared = torch.minimum(weights.gate.global_scales.value, weights.up.global_scales.value)
    assert torch.equal(fused.global_scales.value, shared), "the larger amax's (smaller) quantize-side scale is shared"
    assert torch.equal(fused.packed, torch.cat((weights.gate.packed, weights.up.packed), dim=1)), "FP4 codes unchanged"
    exact, approx = weights.dequantize(), fused.dequantize()
    untouched = slice(I, 2 * I) if up_factor > 1 else slice(0, I)
    assert torch.equal(approx[:, untouched], exact[:, untouched]), "the half that owns the shared scale is exact"
    moved = slice(0, I) if up_factor > 1 else slice(I, 2 * I)
    nonzero = exact[:, moved] != 0
    relative = ((approx[:, moved] - exact[:, moved]).abs() / exact[:, moved].abs())[nonzero]
    assert float(relative.max()) <= 2**-4, "one E4M3 rounding of the block scale: at most 2^-4 relative"
    assert float(relative.max()) > 0, "the rescaled half did move (so the test sees the policy act)"


def test_halves_must_agree_in_shape(gen: torch.Generator) -> None:
    gate = Nvfp4ExpertWeights.quantize(torch.randn(E, I, H, generator=gen))
    with pytest.raises(ValueError, match=r"Nvfp4GateUpWeights.up: expected shape \(4, 32, 64\) like gate"):
        Nvfp4GateUpWeights(gate=gate, up=Nvfp4ExpertWeights.quantize(torch.randn(E, I, 2 * H, generator=gen)))
    with pytest.raises(TypeError, match="Nvfp4GateUpWeights.up: expected Nvfp4ExpertWeights, got Tensor"):
        Nvfp4GateUpWeights(gate=gate, up=gate.packed)  # type: ignore[arg-type]  # the run-time check under test
