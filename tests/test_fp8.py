"""The FP8 scale types and expert weights: layouts, round trips and refusals, against direct float computations."""

from __future__ import annotations

import pytest
import torch

from moe_core import (
    ExpertFp8Scales,
    Fp8BlockExpertWeights,
    Fp8BlockMoeWeights,
    Fp8BlockScales,
    Fp8ChannelExpertWeights,
    Fp8ChannelScales,
)
from moe_core.fp8 import (
    MIN_DYNAMIC_SCALE,
    dynamic_fp8_scales,
    fake_quantize_fp8_per_group,
    fake_quantize_fp8_per_token,
    group_fp8_scales,
)

E4M3_STEP = 2.0**-3
"""E4M3's relative spacing of normal values (3 mantissa bits): a round trip is within half of it."""


def test_channel_weights_keep_each_rows_own_scale(gen: torch.Generator) -> None:
    w = torch.randn(3, 10, 24, generator=gen) * torch.logspace(-2, 2, 10)[None, :, None]
    q = Fp8ChannelExpertWeights.quantize(w)
    assert torch.allclose(q.scales.value, w.abs().amax(dim=2) / 448)
    assert bool(((q.dequantize() - w).abs() <= w.abs().amax(dim=2, keepdim=True) * E4M3_STEP / 2).all())
    torch.testing.assert_close(q.dequantize_expert(1), q.dequantize()[1], rtol=0, atol=0)


def test_channel_scales_from_a_checkpoint_and_from_per_tensor_scales(gen: torch.Generator) -> None:
    stored = torch.rand(4, 6, 1, generator=gen) + 0.1  # compressed-tensors keeps [rows, 1] per matrix
    assert tuple(Fp8ChannelScales.from_checkpoint(stored).value.shape) == (4, 6)
    per_tensor = ExpertFp8Scales.from_checkpoint(torch.rand(4, generator=gen) + 0.1)
    channel = Fp8ChannelScales.from_expert(per_tensor, 6)
    assert torch.equal(channel.value, per_tensor.value[:, None].expand(4, 6))
    with pytest.raises(ValueError, match="Fp8ChannelScales.value: expected a 2-d tensor"):
        Fp8ChannelScales(_value=torch.ones(4))
    with pytest.raises(ValueError, match="expected values > 0"):
        Fp8ChannelScales(_value=-torch.ones(2, 3))


def test_block_weights_scale_each_128_block_and_pad_partial_ones(gen: torch.Generator) -> None:
    w = torch.randn(2, 200, 300, generator=gen)
    w[:, 128:, 256:] *= 50.0  # one block much larger than the rest
    q = Fp8BlockExpertWeights.quantize(w)
    assert tuple(q.scales.value.shape) == (2, 2, 3)
    assert torch.allclose(q.scales.value[:, 1, 2], w[:, 128:, 256:].abs().amax(dim=(1, 2)) / 448)
    assert torch.allclose(q.scales.value[:, 0, 0], w[:, :128, :128].abs().amax(dim=(1, 2)) / 448)
    block_amax = torch.zeros_like(w)
    for r in range(2):
        for c in range(3):
            rows, cols = slice(128 * r, 128 * (r + 1)), slice(128 * c, 128 * (c + 1))
            block_amax[:, rows, cols] = w[:, rows, cols].abs().amax(dim=(1, 2), keepdim=True)
    assert bool(((q.dequantize() - w).abs() <= block_amax * E4M3_STEP / 2).all())
    torch.testing.assert_close(q.dequantize_expert(1), q.dequantize()[1], rtol=0, atol=0)
    with pytest.raises(ValueError, match=r"expected shape \(2, 2, 3\) \(one per 128x128 block\), got \(2, 2, 2\)"):
        Fp8BlockExpertWeights(q.codes, Fp8BlockScales(_value=torch.ones(2, 2, 2)))


def test_block_layers_need_sizes_on_the_128_grid(gen: torch.Generator) -> None:
    w13 = Fp8BlockExpertWeights.quantize(torch.randn(2, 192, 128, generator=gen))
    w2 = Fp8BlockExpertWeights.quantize(torch.randn(2, 128, 96, generator=gen))
    with pytest.raises(ValueError, match="expected hidden and intermediate sizes that are multiples of 128, got 128 and 96"):
        Fp8BlockMoeWeights(w13=w13, w2=w2)


def test_per_token_and_per_group_round_trips(gen: torch.Generator) -> None:
    x = torch.randn(5, 256, generator=gen) * torch.logspace(-3, 3, 5)[:, None]
    x[1, 128:] *= 1e6  # row 1's second group alone is large: its first group falls to E4M3 subnormals per token
    x[3] = 0.0
    token = dynamic_fp8_scales(x)
    assert token.shape == (5, 1) and float(token[3]) == pytest.approx(MIN_DYNAMIC_SCALE)
    assert torch.equal(fake_quantize_fp8_per_token(x)[3], x[3])
    groups = group_fp8_scales(x)
    assert groups.shape == (5, 2) and float(groups[1, 1] / groups[1, 0]) > 1e5
    trip = fake_quantize_fp8_per_group(x)
    amax = x.reshape(5, 2, 128).abs().amax(dim=-1, keepdim=True).expand(5, 2, 128).reshape(5, 256)
    assert bool(((trip - x).abs() <= amax * E4M3_STEP / 2).all())
    per_token = fake_quantize_fp8_per_token(x)
    assert 10 * float((trip - x)[1, :128].abs().max()) < float((per_token - x)[1, :128].abs().max())
    with pytest.raises(ValueError, match="expected a multiple of 128 columns for 1x128 groups, got 200"):
        group_fp8_scales(x[:, :200])
