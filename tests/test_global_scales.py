"""Global scale types: validation, the two conventions, and per-expert collapse."""

from __future__ import annotations

import pytest
import torch

from moe_core import (
    DequantizeGlobalScale,
    ExpertDequantizeGlobalScales,
    ExpertQuantizeGlobalScales,
    ExpertScalePolicy,
    QuantizeGlobalScale,
)


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
        QuantizeGlobalScale(_value=value)


def test_per_expert_scales_reject_bad_values() -> None:
    with pytest.raises(ValueError, match=r"ExpertQuantizeGlobalScales.value: expected a 1-d tensor \[num_experts\]"):
        ExpertQuantizeGlobalScales.from_checkpoint(torch.ones(1, 4))
    with pytest.raises(ValueError, match="at least one expert"):
        ExpertDequantizeGlobalScales.from_checkpoint(torch.ones(0))
    with pytest.raises(ValueError, match="amax: expected values > 0"):
        QuantizeGlobalScale.from_amax(0.0)


def test_require_equal_collapses_agreeing_experts(gen: torch.Generator) -> None:
    value = float(torch.rand(1, generator=gen)) + 0.5
    scalar = QuantizeGlobalScale.from_experts(
        ExpertQuantizeGlobalScales.from_checkpoint(torch.full((8,), value)), policy=ExpertScalePolicy.REQUIRE_EQUAL
    )
    assert scalar.value.shape == (1,)
    assert scalar.item() == pytest.approx(value)


def test_require_equal_rejects_disagreeing_experts(gen: torch.Generator) -> None:
    scales = ExpertQuantizeGlobalScales.from_checkpoint(torch.rand(8, generator=gen) + 0.5)
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
