"""How a kernel with one FC1 global scale per expert (FlashInfer's CUTLASS NVFP4 MoE) takes w1/w3 whose scales differ.

Policies, measured on llmcompressor's split-scale fixture (``tests/fixtures/mixtral_nvfp4_split``: up/gate
quantize-side ratios 0.41 to 2.7) against the float64 W4A4 MoE on the checkpoint's own weights (compressed-tensors'
decompression, bit for bit: ``tests/test_schemes.py``), relative l2 error of the layer, both layers, 37 and 64 tokens
routed by the fixture's router, float32 reference arithmetic (no kernel rounding points, so only the policy differs):

- each half at its own scale (what a kernel with separate gate/up scalars computes): 1.6e-3 to 1.7e-3;
- ``RESCALE_BLOCK_SCALES`` (the up half's E4M3 block scales times the ratio, rounded again): 8.2e-2 to 9.3e-2;
- re-quantizing the rescaled half (dequantize, quantize again at the shared scale): the same, 8.2e-2 to 9.3e-2
  (a block's new scale is the rescaled one and its codes round back to the old ones);
- folding (:meth:`CutlassNvfp4Weights.from_nvfp4_folded`: codes and block scales untouched, FC1 at the gate's scale,
  each expert's ``up / gate`` into FC2's per-expert input scale): 1.6e-3 to 1.7e-3.

The bound is the bf16 tier, :func:`moe_core.check.oracle_tolerance` of bf16 (one bf16 epsilon, 7.8e-3): folding is
within it for any ratio, so the CUTLASS backend folds and refuses no layer for its scales. Through the kernel model
(with its bf16 rounding points) rescaling measured 8.5e-2 to 9.1e-2 against the same model's arithmetic on the exact
halves; folding 2.4e-2 to 4.1e-2, the size of the rounding points' own noise (bf16 values at another scale tip other
FP4 codes: the exact halves against float64 measure 2.6e-2 to 3.8e-2), and exact where the ratios are powers of two.
"""

from __future__ import annotations

import attrs
import pytest
import torch

pytest.importorskip("flashinfer", reason="the flashinfer extra is not installed")

from moe_core import (
    ExpertQuantizeGlobalScales,
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
from moe_core.backends.flashinfer_cutlass.quant_info import CutlassActivationScales, CutlassNvfp4Weights
from moe_core.backends.flashinfer_cutlass.runner import CutlassRunner
from moe_core.backends.reference import REFERENCE_NVFP4
from moe_core.check import oracle_tolerance, relative_error
from moe_core.checkpoint import MoeCheckpoint
from moe_core.float64_moe import float64_moe, nvfp4_round_trips
from moe_core.formats import Nvfp4Recipe
from moe_core.formats.reference import run_experts
from moe_core.global_scales import NVFP4_RANGE
from moe_core.nvfp4 import quantize_activation
from tests.checkpoint_oracles import CT_SPLIT
from tests.one_scale_layers import nvfp4_shared_scale
from tests.test_kernel_models import MISTAKE, TOLERANCE, cutlass_model_kernels, cutlass_nvfp4_reference, layer

TIER = oracle_tolerance(torch.bfloat16)
"""The bf16 tier: one bf16 epsilon of relative l2 error, what an oracle may have against the float64 MoE."""

RESCALING_ERROR = 5e-2
"""Rescaling the block scales must stay visibly wrong on the split fixture (measured 8.2e-2 to 9.3e-2)."""


def folded_reference(config: MoeRunnerConfig, weights: Nvfp4MoeWeights, dispatch: StandardDispatchOutput) -> torch.Tensor:
    """What a kernel computes under the fold, in float32 with moe_core's numerics: the up half at the gate's global
    scale, the activation quantized at the w2 input scale times ``gate / up``, FC2 dequantized at the true scale."""
    recipe = Nvfp4Recipe()
    gate_scales, up_scales = weights.w13.gate.global_scales.value, weights.w13.up.global_scales.value
    activation_scale = weights.w2_input_scale.value.reshape(())

    def mlp(expert: int, x: torch.Tensor) -> torch.Tensor:
        ratio = up_scales[expert] / gate_scales[expert]
        up_at_gate_scale = weights.w13.up.dequantize_expert(expert) * ratio
        fc1 = torch.cat((weights.w13.gate.dequantize_expert(expert), up_at_gate_scale))
        h = config.activation.apply(recipe.quantize_input(weights, expert, x) @ fc1.T)
        folded = QuantizeGlobalScale.from_amax(NVFP4_RANGE / (activation_scale / ratio))
        q = quantize_activation(h, folded)
        return (q.dequantize() * (q.global_scale.value.reshape(()) / activation_scale)) @ recipe.down(weights, expert).T

    return run_experts(config, dispatch, weights, mlp)


def split_fixture_layer(index: int, tokens: int, gen: torch.Generator) -> tuple[MoeRunnerConfig, Nvfp4MoeWeights, StandardDispatchOutput]:
    """A layer of the split fixture as its scheme loads it, and fresh N(0, 1) hidden states routed by its router."""
    checkpoint = MoeCheckpoint(CT_SPLIT)
    scheme = checkpoint.load_layer(index, keep_canonical=True)
    assert isinstance(scheme.weights, Nvfp4MoeWeights)
    x = torch.randn(tokens, checkpoint.hidden_size, generator=gen).to(torch.bfloat16)
    logits = x.float() @ checkpoint.router_weight(index).float().T
    return scheme.config, scheme.weights, StandardDispatchOutput(x, select_experts(logits, scheme.config))


@pytest.mark.parametrize("tokens", [37, 64])
@pytest.mark.parametrize("layer_index", [0, 1])
def test_policies_on_the_split_fixture(layer_index: int, tokens: int, gen: torch.Generator) -> None:
    config, weights, dispatch = split_fixture_layer(layer_index, tokens, gen)
    assert not torch.equal(weights.w13.gate.global_scales.value, weights.w13.up.global_scales.value)
    oracle = float64_moe(config, dispatch, weights.w13.dequantize(), weights.w2.dequantize(), nvfp4_round_trips(weights))
    reference = create_runner(REFERENCE_NVFP4, config)
    assert relative_error(reference.run(dispatch, weights), oracle) < TIER
    assert relative_error(folded_reference(config, weights, dispatch), oracle) < TIER
    assert relative_error(reference.run(dispatch, nvfp4_shared_scale(weights)), oracle) > RESCALING_ERROR


def with_up_scales(weights: Nvfp4MoeWeights, up_scales: torch.Tensor) -> Nvfp4MoeWeights:
    up = weights.w13.up
    return attrs.evolve(weights, w13=Nvfp4GateUpWeights(
        gate=weights.w13.gate,
        up=Nvfp4ExpertWeights(up.packed, up.block_scales, ExpertQuantizeGlobalScales.from_checkpoint(up_scales)),
    ))


def test_folding_through_the_kernel_model_is_exact_for_power_of_two_ratios(gen: torch.Generator) -> None:
    """With ``up / gate`` a power of two, the kernel's bf16 values at the gate's scale are the true ones times it, so
    the kernel model under the fold computes what it computes on the exact halves; FC2's input scale left unfolded is
    caught."""
    config, _, weights, dispatch = layer((37, 8, 2, 256, 128, 8, 0), gen)
    exponents = torch.randint(-3, 4, (8,), generator=gen).float()
    exponents[0], exponents[1] = -2.0, 3.0
    weights = with_up_scales(weights, weights.w13.gate.global_scales.value * 2.0**exponents)
    runner = CutlassRunner[CutlassNvfp4Weights](config, kernels=cutlass_model_kernels())
    folded = CutlassNvfp4Weights.from_nvfp4_folded(weights)
    expected = cutlass_nvfp4_reference(config, weights, dispatch)
    assert relative_error(runner.run(dispatch, folded), expected) < TOLERANCE
    unfolded = attrs.evolve(folded, scales=attrs.evolve(
        folded.scales, fc2_input_scales=CutlassActivationScales.uniform(weights.w2_input_scale, num_experts=8)
    ))
    assert relative_error(runner.run(dispatch, unfolded), expected) > MISTAKE


def test_folding_keeps_codes_and_block_scales_and_takes_the_gates_scale(gen: torch.Generator) -> None:
    _, _, weights, _ = layer((4, 8, 2, 256, 128, 8, 0), gen)
    folded = CutlassNvfp4Weights.from_nvfp4_folded(weights)
    equal = CutlassNvfp4Weights.from_nvfp4(with_up_scales(weights, weights.w13.gate.global_scales.value), gate_up=GateUpScalePolicy.REQUIRE_EQUAL)
    assert torch.equal(folded.fc1, equal.fc1)
    assert torch.equal(folded.scales.fc1_weight_scales._tiles.view(torch.uint8), equal.scales.fc1_weight_scales._tiles.view(torch.uint8))
    assert torch.equal(folded.scales.fc1_alphas.value, equal.scales.fc1_alphas.value)
    ratio = weights.w13.gate.global_scales.value / weights.w13.up.global_scales.value
    torch.testing.assert_close(folded.scales.fc2_input_scales.value, weights.w2_input_scale.value * ratio, rtol=2**-23, atol=0)
    assert torch.equal(folded.scales.fc2_alphas.value, equal.scales.fc2_alphas.value)
