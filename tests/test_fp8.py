"""The FP8 scale types and expert weights: layouts, round trips and refusals, against direct float computations."""

from __future__ import annotations

import pytest
import torch

from moe_core.backends.reference import REFERENCE_FP8_BLOCK, REFERENCE_FP8_CHANNEL
from moe_core import (
    ExpertFp8Scales,
    Fp8BlockExpertWeights,
    Fp8BlockMoeWeights,
    Fp8BlockScales,
    Fp8ChannelExpertWeights,
    Fp8ChannelScales,
    Fp8TensorScale,
    MoeRunnerConfig,
)
from moe_core.check import oracle_tolerance, relative_error
from moe_core.float64_moe import float64_moe, fp8_per_group_round_trips, fp8_per_token_round_trips
from moe_core.fp8 import (
    MIN_DYNAMIC_SCALE,
    dynamic_fp8_scales,
    fake_quantize_fp8_per_group,
    fake_quantize_fp8_per_token,
    group_fp8_scales,
    quantize_fp8,
)
from moe_core.synthetic import quantize_fp8_block_layer, quantize_fp8_channel_layer, random_dense_layer
from tests.devices import DEVICES

E4M3_STEP = 2.0**-3
"""E4M3's relative spacing of normal values (3 mantissa bits): a round trip is within half of it."""


def test_channel_weights_keep_each_rows_own_scale(gen: torch.Generator) -> None:
    w = torch.randn(3, 10, 24, generator=gen) * torch.logspace(-2, 2, 10)[None, :, None]
    q = Fp8ChannelExpertWeights.quantize(w)
    assert torch.allclose(q.scales.value, w.abs().amax(dim=2) / 448)
    assert bool(((q.dequantize() - w).abs() <= w.abs().amax(dim=2, keepdim=True) * E4M3_STEP / 2).all())
    torch.testing.assert_close(q.dequantize_expert(1), q.dequantize()[1], rtol=0, atol=0)


def test_channel_scales_from_a_checkpoint_and_from_per_tensor_scales(gen: torch.Generator) -> None:
    stored = (torch.rand(4, 6, 1, generator=gen) + 0.1) / 100  # compressed-tensors keeps [rows, 1] per matrix
    assert tuple(Fp8ChannelScales.from_checkpoint(stored).value.shape) == (4, 6)
    per_tensor = ExpertFp8Scales.from_checkpoint((torch.rand(4, generator=gen) + 0.1) / 100)
    channel = Fp8ChannelScales.from_expert(per_tensor, 6)
    assert torch.equal(channel.value, per_tensor.value[:, None].expand(4, 6))
    with pytest.raises(ValueError, match="Fp8ChannelScales.value: expected a 2-d tensor"):
        Fp8ChannelScales.from_checkpoint(torch.ones(4))
    with pytest.raises(ValueError, match="expected values > 0"):
        Fp8ChannelScales.from_checkpoint(-torch.ones(2, 3))


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
        Fp8BlockExpertWeights(q.codes, Fp8BlockScales.from_checkpoint(torch.ones(2, 2, 2)))


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


@pytest.mark.parametrize("device", DEVICES)
def test_scales_from_amax_are_amax_over_448_rounded_once_on_every_device(gen: torch.Generator, device: torch.device) -> None:
    """Every ``amax / 448`` is the float64 quotient rounded to float32 (CUDA's ``tensor / 448.0`` is one ulp off in 6 of 10)."""
    amax = torch.rand(64, 256, generator=gen) * torch.logspace(-3, 3, 256)[None, :] + 1e-3
    exact = (amax.double() / 448).float()
    on = amax.to(device)
    assert torch.equal(dynamic_fp8_scales(on).cpu(), exact.amax(dim=1, keepdim=True))  # amax is its own row's max
    assert torch.equal(group_fp8_scales(on).cpu(), exact.reshape(64, 2, 128).amax(dim=2))
    assert torch.equal(Fp8ChannelScales.from_amax(on).value.cpu(), exact)
    assert torch.equal(ExpertFp8Scales.from_amax(on[0]).value.cpu(), exact[0])
    assert torch.equal(Fp8TensorScale.from_amax(on[0, 7].clone()).value.cpu(), exact[0, 7:8])
    blocks = Fp8BlockExpertWeights.quantize(on.reshape(2, 32, 256).repeat_interleave(4, dim=1)).scales.value
    assert torch.equal(blocks.cpu(), exact.reshape(2, 32, 2, 128).amax(dim=(1, 3))[:, None, :])


@pytest.mark.parametrize("device", DEVICES)
def test_bf16_values_on_e4m3_rounding_ties_round_to_even_on_every_device(device: torch.device) -> None:
    """A bf16 token with amax 3.0625 puts these values exactly halfway between two E4M3 codes: each takes the even one.

    Token 19 of the CLI's layer; with a scale one ulp large (CUDA's ``amax / 448.0``) they all round down instead.
    """
    token = torch.tensor([3.0625, 0.2119140625, -0.423828125, 1.0390625, 1.6953125, 0.1572265625, -0.73828125])
    halfway = token.double() * 448 / 3.0625
    assert halfway.tolist() == [448.0, 31.0, -62.0, 152.0, 248.0, 23.0, -108.0]
    even = [448.0, 32.0, -64.0, 160.0, 256.0, 24.0, -112.0]
    x = token.to(torch.bfloat16).to(device)[None]
    assert quantize_fp8(x, dynamic_fp8_scales(x)).float().cpu()[0].tolist() == even
    grouped = torch.cat((x, torch.zeros(1, 121, dtype=torch.bfloat16, device=device)), dim=1)
    assert quantize_fp8(grouped, group_fp8_scales(grouped)).float().cpu()[0, :7].tolist() == even


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("fmt", ["per-token", "per-group"])
def test_dynamic_references_match_float64_on_the_cli_layer(device: torch.device, fmt: str) -> None:
    """``moe-core check``'s default layer (seed 0, bf16): its tokens 19 and 22 hold exact E4M3 ties."""
    config = MoeRunnerConfig(num_experts=8, hidden_size=256, intermediate_size_per_partition=512, top_k=2)
    dense, dispatch = random_dense_layer(config, 64, torch.bfloat16, device, seed=0)
    if fmt == "per-token":
        channel = quantize_fp8_channel_layer(config, dense, dispatch)
        out = REFERENCE_FP8_CHANNEL.bind(config, channel)(dispatch)
        w13, w2, trips = channel.w13.dequantize(), channel.w2.dequantize(), fp8_per_token_round_trips()
    else:
        block = quantize_fp8_block_layer(config, dense, dispatch)
        out = REFERENCE_FP8_BLOCK.bind(config, block)(dispatch)
        w13, w2, trips = block.w13.dequantize(), block.w2.dequantize(), fp8_per_group_round_trips()
    assert relative_error(out, float64_moe(config, dispatch, w13, w2, trips)) <= oracle_tolerance(torch.bfloat16)
