"""The 128x4 swizzled scale layout against the offset formula of the CUDA kernels."""

from __future__ import annotations

import pytest
import torch

from moe_core import LinearBlockScales, SwizzledBlockScales
from tests.devices import DEVICES


def random_scales(gen: torch.Generator, *shape: int) -> torch.Tensor:
    """Positive, distinct-ish E4M3 scales."""
    return (torch.rand(*shape, generator=gen) * 400 + 0.01).to(torch.float8_e4m3fn)


def offset_128x4(m: int, k: int, padded_blocks: int) -> int:
    """Byte offset of scale (m, k) in one matrix: TRT-LLM's get_sf_out_offset_128x4."""
    k_tiles = padded_blocks // 4
    return (m // 128) * k_tiles * 512 + (k // 4) * 512 + (m % 32) * 16 + ((m % 128) // 32) * 4 + (k % 4)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(("rows", "blocks"), [(128, 4), (130, 6), (7, 1), (256, 16)])
def test_swizzle_places_every_scale_at_the_kernel_offset(
    gen: torch.Generator, rows: int, blocks: int, device: torch.device
) -> None:
    linear = LinearBlockScales.from_checkpoint(random_scales(gen, rows, blocks))

    swizzled = linear.to(device).swizzle()
    assert swizzled.device.type == device.type
    swizzled = swizzled.to("cpu")

    padded_rows, padded_blocks = swizzled.shape
    assert (padded_rows % 128, padded_blocks % 4) == (0, 0)
    assert (swizzled.rows, swizzled.blocks) == (rows, blocks)
    flat = swizzled._tiles.view(torch.uint8).flatten()
    expected = torch.zeros(padded_rows * padded_blocks, dtype=torch.uint8)
    source = linear.data.view(torch.uint8)
    for m in range(rows):
        for k in range(blocks):
            expected[offset_128x4(m, k, padded_blocks)] = source[m, k]
    assert torch.equal(flat, expected), "scales misplaced, or padding not zero"


def test_swizzle_round_trips_with_batch_dims(gen: torch.Generator) -> None:
    data = random_scales(gen, 3, 200, 10)
    linear = LinearBlockScales.from_checkpoint(data)

    swizzled = linear.swizzle()

    assert swizzled.shape == (3, 256, 12)
    for expert in range(3):
        alone = LinearBlockScales.from_checkpoint(data[expert]).swizzle()
        assert torch.equal(swizzled._tiles[expert].view(torch.uint8), alone._tiles.view(torch.uint8))
    assert torch.equal(swizzled.unswizzle().data.view(torch.uint8), data.view(torch.uint8))


def test_block_scale_constructors_reject_bad_input(gen: torch.Generator) -> None:
    with pytest.raises(TypeError, match=r"LinearBlockScales.data: expected dtype torch.float8_e4m3fn"):
        LinearBlockScales.from_checkpoint(torch.ones(4, 2))
    with pytest.raises(ValueError, match="rows, blocks"):
        LinearBlockScales.from_checkpoint(torch.ones(4).to(torch.float8_e4m3fn))
    with pytest.raises(ValueError, match="NaN"):
        LinearBlockScales.from_checkpoint(torch.full((2, 2), float("nan")).to(torch.float8_e4m3fn))
    with pytest.raises(ValueError, match=">= 0"):
        LinearBlockScales.from_checkpoint(torch.full((2, 2), -1.0).to(torch.float8_e4m3fn))
    swizzled = LinearBlockScales.from_checkpoint(random_scales(gen, 130, 6)).swizzle()
    with pytest.raises(ValueError, match=r"expected last dims \(128, 8\) for rows=100"):
        SwizzledBlockScales._of(swizzled._tiles, rows=100, blocks=6)
