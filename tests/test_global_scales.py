"""Global scale types: validation, the two conventions, and per-expert collapse."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from moe_core import (
    DequantizeGlobalScale,
    ExpertDequantizeGlobalScales,
    ExpertQuantizeGlobalScales,
    ExpertScalePolicy,
    QuantizeGlobalScale,
)
from moe_core.checkpoint import MoeCheckpoint
from tests.checkpoint_oracles import CT_NVFP4, copy_checkpoint, rewrite_tensor

FLUSH_RATIO = 448 * 2**10
"""Spread of quantize-side scales at which the smallest zeroes another expert's calibrated amax (its E4M3 block
scale ``448 * gs_min / gs_e`` reaches 2**-10 and rounds to zero)."""
COMPRESSED_TENSORS_W2 = (9728.0, 15870.0, 8256.0, 11840.0, 6304.0, 6.778e9, 10500.0, 16770.0)
"""The split fixture's layer-0 ``down_proj.input_global_scale`` per expert, to 4 digits (expert 5 is tiny: amax 4e-7)."""
MODELOPT_W13 = 1.43e-3
"""The ModelOpt fixture's layer-0 gate/up ``input_scale`` (dequantize side, every expert)."""


def test_conventions_are_reciprocal(gen: torch.Generator) -> None:
    amax = float(torch.rand(1, generator=gen)) * 10 + 0.1
    quantize = QuantizeGlobalScale.from_amax(amax)
    dequantize = DequantizeGlobalScale.from_amax(amax)
    assert quantize.item() == pytest.approx(448 * 6 / amax, rel=1e-6)
    assert dequantize.item() == pytest.approx(amax / (448 * 6), rel=1e-6)
    assert DequantizeGlobalScale.from_quantize(quantize).item() == pytest.approx(dequantize.item(), rel=1e-6)
    assert QuantizeGlobalScale.from_dequantize(dequantize).item() == pytest.approx(quantize.item(), rel=1e-6)
    experts = ExpertQuantizeGlobalScales.from_amax(torch.tensor([1.0, 2.0]))
    assert torch.allclose(ExpertDequantizeGlobalScales.from_quantize(experts).value, torch.tensor([1.0, 2.0]) / 2688)
    assert torch.allclose(ExpertQuantizeGlobalScales.from_dequantize(ExpertDequantizeGlobalScales.from_quantize(experts)).value, experts.value)


@pytest.mark.parametrize(
    ("value", "error", "message"),
    [
        (torch.ones(2), ValueError, r"expected shape \(1,\)"),
        (torch.ones(1, 1), ValueError, r"expected shape \(1,\)"),
        (torch.ones(1, dtype=torch.float64), TypeError, "expected dtype torch.float32"),
        (torch.tensor([float("inf")]), ValueError, "expected finite values"),
        (torch.tensor([0.0]), ValueError, "expected values > 0"),
        (torch.tensor([-2.0]), ValueError, "expected values > 0"),
        ([1.0], TypeError, "expected a torch.Tensor"),
    ],
)
def test_scalar_scale_rejects_bad_values(value: torch.Tensor, error: type[Exception], message: str) -> None:
    with pytest.raises(error, match=f"QuantizeGlobalScale.value: {message}"):
        QuantizeGlobalScale._of(value)


def test_per_expert_scales_reject_bad_values() -> None:
    with pytest.raises(ValueError, match=r"ExpertQuantizeGlobalScales.value: expected a 1-d tensor \[num_experts\]"):
        ExpertQuantizeGlobalScales.from_checkpoint(torch.ones(1, 4))
    with pytest.raises(ValueError, match="at least one expert"):
        ExpertDequantizeGlobalScales.from_checkpoint(torch.ones(0))
    with pytest.raises(ValueError, match="amax: expected values > 0"):
        QuantizeGlobalScale.from_amax(0.0)


def test_require_equal_collapses_agreeing_experts(gen: torch.Generator) -> None:
    value = (float(torch.rand(1, generator=gen)) + 0.5) * 1e4
    scalar = QuantizeGlobalScale.from_experts(
        ExpertQuantizeGlobalScales.from_checkpoint(torch.full((8,), value)), policy=ExpertScalePolicy.REQUIRE_EQUAL
    )
    assert scalar.value.shape == (1,)
    assert scalar.item() == pytest.approx(value)


def test_require_equal_rejects_disagreeing_experts(gen: torch.Generator) -> None:
    scales = ExpertQuantizeGlobalScales.from_checkpoint((torch.rand(8, generator=gen) + 0.5) * 1e4)
    with pytest.raises(ValueError, match="experts disagree"):
        QuantizeGlobalScale.from_experts(scales, policy=ExpertScalePolicy.REQUIRE_EQUAL)


def test_conservative_takes_the_largest_amax(gen: torch.Generator) -> None:
    amax = torch.rand(8, generator=gen) * 5 + 0.1
    quantize = QuantizeGlobalScale.from_experts(
        ExpertQuantizeGlobalScales.from_amax(amax), policy=ExpertScalePolicy.CONSERVATIVE
    )
    dequantize = DequantizeGlobalScale.from_experts(
        ExpertDequantizeGlobalScales.from_amax(amax), policy=ExpertScalePolicy.CONSERVATIVE
    )
    assert quantize.item() == pytest.approx(2688 / float(amax.max()), rel=1e-6)
    assert dequantize.item() == pytest.approx(float(amax.max()) / 2688, rel=1e-6)


SCALE_CLASSES = [QuantizeGlobalScale, DequantizeGlobalScale]


@pytest.mark.parametrize("policy", list(ExpertScalePolicy))
@pytest.mark.parametrize("scale_class", SCALE_CLASSES)
@pytest.mark.parametrize("bad", [float("inf"), float("nan"), 0.0, -1.0])
def test_non_finite_or_non_positive_input_scale_is_refused_naming_the_expert_and_shard(
    bad: float, scale_class: type[QuantizeGlobalScale | DequantizeGlobalScale], policy: ExpertScalePolicy
) -> None:
    gate_up = torch.full((8, 2), 700.0 if scale_class is QuantizeGlobalScale else MODELOPT_W13)
    gate_up[3, 1] = bad
    expected = f"{scale_class.__name__}.from_checkpoint: expected finite values > 0, got {bad} at expert 3, shard 1 "
    with pytest.raises(ValueError, match=re.escape(f"{expected}of shape (8, 2)")):
        scale_class.from_checkpoint(gate_up, num_experts=8, policy=policy)
    down = gate_up[:, 0].clone()
    down[5] = down[6] = bad
    with pytest.raises(ValueError, match=re.escape(f"got {bad} at expert 5 (and 1 more) of shape (8,)")):
        scale_class.from_checkpoint(down, num_experts=8, policy=policy)


def test_per_expert_weight_scales_name_the_expert_too() -> None:
    expected = "ExpertQuantizeGlobalScales.value: expected finite values > 0, got inf at expert 2"
    with pytest.raises(ValueError, match=re.escape(expected)):
        ExpertQuantizeGlobalScales.from_checkpoint(torch.tensor([1.0, 2.0, float("inf")]))


def test_conservative_refuses_a_quantize_side_outlier_that_zeroes_every_other_expert() -> None:
    """One tiny quantize-side scale (a huge amax) becomes the scalar; every other expert's amax then underflows.

    The others are input scales 1024 times the fixture's (amax 1e-4 to 4e-4, still in real files' range), so that
    the outlier stays >= 1: below 1 it is refused first as a dequantize-side value."""
    values = torch.tensor(COMPRESSED_TENSORS_W2) * 1024
    smallest_other = float(values.min())
    values[2] = smallest_other / FLUSH_RATIO
    expected = "QuantizeGlobalScale: expected no expert's scale to zero every other expert's inputs, got "
    with pytest.raises(ValueError, match=re.escape(f"{expected}{float(values[2])} (quantize side, amax ")) as raised:
        QuantizeGlobalScale.from_checkpoint(values, num_experts=8, policy=ExpertScalePolicy.CONSERVATIVE)
    assert "at expert 2: as the conservative scalar" in str(raised.value)
    assert "(amax 0.0004164, expert 4) the E4M3 block scale 0.000977, which rounds to zero" in str(raised.value)
    # a hair larger and the other experts' largest blocks keep the smallest subnormal scale: degraded, not zero
    values[2] = smallest_other / FLUSH_RATIO * 1.001
    assert QuantizeGlobalScale.from_checkpoint(values, num_experts=8, policy=ExpertScalePolicy.CONSERVATIVE).value == values[2]
    # the same through per-expert scales
    values[2] = 2.0
    with pytest.raises(ValueError, match="ExpertQuantizeGlobalScales: expected no expert's scale .* at expert 2: "):
        QuantizeGlobalScale.from_experts(
            ExpertQuantizeGlobalScales.from_checkpoint(values), policy=ExpertScalePolicy.CONSERVATIVE
        )


def test_conservative_names_the_outlier_expert_and_shard_of_gate_up_values() -> None:
    gate_up = torch.full((8, 2), 7e8)
    gate_up[6] = 1000.0  # both halves of expert 6: one expert, not two
    expected = "got 1000.0 (quantize side, amax 2.688) at expert 6, shard 0: "
    with pytest.raises(ValueError, match=re.escape(expected)):
        QuantizeGlobalScale.from_checkpoint(gate_up, num_experts=8, policy=ExpertScalePolicy.CONSERVATIVE)
    gate_up[6, 0] = 7e8
    with pytest.raises(ValueError, match="at expert 6, shard 1: "):
        QuantizeGlobalScale.from_checkpoint(gate_up, num_experts=8, policy=ExpertScalePolicy.CONSERVATIVE)


def test_conservative_refuses_a_dequantize_side_outlier_that_zeroes_every_other_expert() -> None:
    """On the dequantize side the outlier is huge (ModelOpt's input_scale is amax / 2688).

    The others are small (amax 5e-3) so that the outlier stays <= 1: above 1 it is refused first as a quantize-side
    value."""
    small = 2e-6
    values = torch.full((8,), small)
    values[7] = small * FLUSH_RATIO
    expected = (
        "DequantizeGlobalScale: expected no expert's scale to zero every other expert's inputs, got "
        f"{float(values[7])} (dequantize side, amax {2688 * float(values[7]):.4g}) at expert 7: "
    )
    with pytest.raises(ValueError, match=re.escape(expected)):
        DequantizeGlobalScale.from_checkpoint(values, num_experts=8, policy=ExpertScalePolicy.CONSERVATIVE)
    with pytest.raises(ValueError, match="ExpertDequantizeGlobalScales: .* at expert 7: "):
        DequantizeGlobalScale.from_experts(
            ExpertDequantizeGlobalScales.from_checkpoint(values), policy=ExpertScalePolicy.CONSERVATIVE
        )
    values[7] = small * FLUSH_RATIO / 1.001
    assert DequantizeGlobalScale.from_checkpoint(values, num_experts=8, policy=ExpertScalePolicy.CONSERVATIVE).value == values[7]
    values[7] = 1e-30  # tiny on the dequantize side is a tiny expert: not the conservative choice
    scalar = DequantizeGlobalScale.from_checkpoint(values, num_experts=8, policy=ExpertScalePolicy.CONSERVATIVE)
    assert scalar.item() == pytest.approx(small)


def test_conservative_keeps_a_tiny_expert_and_an_uncalibrated_one() -> None:
    """What real checkpoints hold passes: one expert far below the others (zeroed itself, the policy's known cost),
    and compressed-tensors' 1.0 for an expert calibration never reached (the others' scales coarsen, none vanish)."""
    values = torch.tensor(COMPRESSED_TENSORS_W2)
    assert QuantizeGlobalScale.from_checkpoint(values, num_experts=8, policy=ExpertScalePolicy.CONSERVATIVE).item() == 6304.0
    values[0] = 1.0
    assert QuantizeGlobalScale.from_checkpoint(values, num_experts=8, policy=ExpertScalePolicy.CONSERVATIVE).item() == 1.0


def test_loading_a_checkpoint_with_an_outlier_input_scale_names_the_expert(tmp_path: Path) -> None:
    """The layer is refused when it loads, not run to a zero output that ``moe-core check`` reports as nan."""
    directory = copy_checkpoint(CT_NVFP4, tmp_path / "checkpoint")
    rewrite_tensor(directory, "model.layers.0.mlp.experts.4.down_proj.input_global_scale", torch.tensor([1e-3]))
    with pytest.raises(ValueError, match=r"model.layers.0.mlp of .*: QuantizeGlobalScale.from_checkpoint: .* at expert 4, "):
        MoeCheckpoint(directory).load_layer(0)
    rewrite_tensor(directory, "model.layers.0.mlp.experts.4.down_proj.input_global_scale", torch.tensor([7000.0]))
    rewrite_tensor(directory, "model.layers.0.mlp.experts.2.up_proj.input_global_scale", torch.tensor([0.0]))
    with pytest.raises(ValueError, match=re.escape("got 0.0 at expert 2, shard 1 of shape (8, 2)")):
        MoeCheckpoint(directory).load_layer(0)
