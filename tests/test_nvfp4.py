"""NVFP4 numerics against compressed-tensors' own NVFP4 compressor.

compressed-tensors computes the global scale, the E4M3 block scales and the
packed codes of a checkpoint; matching it bit for bit means our format is
the one real checkpoints hold.
"""

from __future__ import annotations

import pytest
import torch
from compressed_tensors.compressors.nvfp4 import NVFP4PackedCompressor
from compressed_tensors.compressors.nvfp4.helpers import unpack_fp4_from_uint8
from compressed_tensors.quantization import QuantizationScheme, preset_name_to_scheme
from compressed_tensors.quantization.utils.helpers import calculate_qparams, generate_gparam

from moe_core import (
    ExpertQuantizeGlobalScales,
    Nvfp4Arithmetic,
    ExpertScalePolicy,
    LinearBlockScales,
    Nvfp4ExpertWeights,
    Nvfp4Tensor,
    QuantizeGlobalScale,
)
from moe_core.nvfp4 import E2M1_VALUES, decode_e2m1, encode_e2m1, pack_e2m1, unpack_e2m1
from tests.devices import DEVICES

SCHEME: QuantizationScheme = preset_name_to_scheme("NVFP4", ["Linear"])


def compressed_tensors_compress(w: torch.Tensor) -> dict[str, torch.Tensor]:
    """compressed-tensors' checkpoint tensors for one fp32 weight ``[rows, cols]``."""
    global_scale = generate_gparam(w.min(), w.max())
    groups = w.reshape(w.shape[0], -1, 16)
    scale, zero_point = calculate_qparams(groups.amin(-1), groups.amax(-1), SCHEME.weights, global_scale=global_scale)
    state = {"weight": w, "weight_scale": scale, "weight_global_scale": global_scale, "weight_zero_point": zero_point}
    result: dict[str, torch.Tensor] = NVFP4PackedCompressor.compress(state, SCHEME)
    return result


def random_weight(gen: torch.Generator, rows: int, cols: int) -> torch.Tensor:
    """Heavy-tailed values so blocks span many E4M3 binades and all E2M1 codes occur; rows scaled by at most e^5, so
    that a weight amax stays below 2688 (a global scale >= 1, as every real weight has)."""
    return torch.randn(rows, cols, generator=gen) * torch.exp(2 * torch.randn(rows, 1, generator=gen).clamp(-2.5, 2.5))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(("rows", "cols"), [(8, 64), (37, 160), (128, 256)])
def test_quantize_matches_compressed_tensors_bit_for_bit(
    gen: torch.Generator, rows: int, cols: int, device: torch.device
) -> None:
    w = random_weight(gen, rows, cols)
    ct = compressed_tensors_compress(w)

    ours = Nvfp4Tensor.quantize(w.to(device), QuantizeGlobalScale.from_amax(w.abs().amax())).to("cpu")

    assert torch.equal(ours.global_scale.value, ct["weight_global_scale"])
    assert ours.block_scales.data.dtype == ct["weight_scale"].dtype == torch.float8_e4m3fn
    assert torch.equal(ours.block_scales.data.view(torch.uint8), ct["weight_scale"].view(torch.uint8))
    assert ours.packed.dtype == ct["weight_packed"].dtype == torch.uint8
    assert torch.equal(ours.packed, ct["weight_packed"])
    codes = unpack_e2m1(ours.packed)
    assert len(torch.unique(codes & 7)) == 8, "the input should exercise every E2M1 magnitude"


@pytest.mark.parametrize("device", DEVICES)
def test_dequantize_matches_compressed_tensors(gen: torch.Generator, device: torch.device) -> None:
    w = random_weight(gen, 48, 128)
    ct = compressed_tensors_compress(w)
    restored = NVFP4PackedCompressor.decompress(ct, SCHEME)["weight"]

    ours = Nvfp4Tensor.quantize(w.to(device), QuantizeGlobalScale.from_amax(w.abs().amax()))

    assert torch.equal(ours.dequantize(torch.bfloat16).cpu(), restored)
    values = decode_e2m1(unpack_e2m1(ours.packed)).cpu()
    assert torch.equal(values, unpack_fp4_from_uint8(ct["weight_packed"], 48, 128, torch.float32))


@pytest.mark.parametrize("device", DEVICES)
def test_expert_weights_match_per_expert_compression(gen: torch.Generator, device: torch.device) -> None:
    w = torch.stack([random_weight(gen, 32, 64) for _ in range(3)])

    ours = Nvfp4ExpertWeights.quantize(w.to(device)).to("cpu")

    for expert in range(3):
        ct = compressed_tensors_compress(w[expert])
        assert torch.equal(ours.global_scales.value[expert : expert + 1], ct["weight_global_scale"])
        assert torch.equal(ours.packed[expert], ct["weight_packed"])
        assert torch.equal(ours.block_scales.data[expert].view(torch.uint8), ct["weight_scale"].view(torch.uint8))
        scale = QuantizeGlobalScale.from_checkpoint(
            ours.global_scales.value[expert].clone(), num_experts=1, policy=ExpertScalePolicy.REQUIRE_EQUAL
        )
        single = Nvfp4Tensor.quantize(w[expert], scale)
        assert torch.equal(ours.dequantize_expert(expert), single.dequantize())
    assert torch.equal(ours.dequantize()[1], ours.dequantize_expert(1))


def test_all_zero_expert_gets_global_scale_one_like_compressed_tensors(gen: torch.Generator) -> None:
    w = torch.randn(2, 8, 32, generator=gen)
    w[1] = 0.0
    q = Nvfp4ExpertWeights.quantize(w)
    assert torch.equal(q.global_scales.value[1:], compressed_tensors_compress(w[1])["weight_global_scale"])
    assert q.global_scales.value[1].item() == 1.0
    assert bool((q.dequantize_expert(1) == 0).all())


def test_round_trip_error_is_bounded_by_the_code_step(gen: torch.Generator) -> None:
    w = torch.randn(64, 256, generator=gen, dtype=torch.float64).float()
    q = Nvfp4Tensor.quantize(w, QuantizeGlobalScale.from_amax(w.abs().amax()))
    blocks = (q.dequantize() - w).abs().reshape(64, -1, 16)
    block_scale = (q.block_scales.data.float() / q.global_scale.value).unsqueeze(-1)
    # The widest E2M1 step is 2 (4 -> 6), so no value moves more than one block scale,
    # plus the E4M3 rounding of the scale itself (relative 2^-4) at the top code.
    assert bool((blocks <= block_scale * (1 + 6 * 2**-4)).all())
    rel = float((q.dequantize() - w).norm() / w.norm())
    assert 0.03 < rel < 0.15, rel


def test_e2m1_rounds_half_to_even_and_saturates() -> None:
    grid = torch.tensor(E2M1_VALUES)
    assert torch.equal(decode_e2m1(encode_e2m1(grid)), grid)
    assert torch.equal(decode_e2m1(encode_e2m1(-grid[1:])), -grid[1:])
    midpoints = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0])
    assert decode_e2m1(encode_e2m1(midpoints)).tolist() == [0.0, 1.0, 1.0, 2.0, 2.0, 4.0, 4.0]
    assert decode_e2m1(encode_e2m1(torch.tensor([7.0, -100.0, 0.26, -0.1]))).tolist() == [6.0, -6.0, 0.5, -0.0]
    assert encode_e2m1(torch.tensor([-0.1, 0.1, -0.0])).tolist() == [8, 0, 0]


def test_pack_puts_first_element_in_low_nibble() -> None:
    codes = torch.tensor([[0x1, 0xF, 0x7, 0x8]], dtype=torch.uint8)
    packed = pack_e2m1(codes)
    assert packed.tolist() == [[0xF1, 0x87]]
    assert torch.equal(unpack_e2m1(packed), codes)


def test_underflowing_blocks_store_compressed_tensors_scale(gen: torch.Generator) -> None:
    w = torch.randn(4, 48, generator=gen)
    w[1, :16] = 0.0
    w[2, 16:32] *= 1e-7  # its E4M3 scale, 448 * amax_block / amax_tensor, rounds to zero
    q = Nvfp4Tensor.quantize(w, QuantizeGlobalScale.from_amax(w.abs().amax()))
    ct = compressed_tensors_compress(w)

    assert q.block_scales.data[1, 0].float().item() == q.block_scales.data[2, 1].float().item() == 0.125
    assert torch.equal(q.block_scales.data.view(torch.uint8), ct["weight_scale"].view(torch.uint8))
    assert torch.equal(q.packed, ct["weight_packed"])
    assert bool((q.dequantize()[1, :16] == 0).all()) and bool((q.dequantize()[2, 16:32] == 0).all())


@pytest.mark.parametrize(
    ("x", "error", "message"),
    [
        (torch.ones(4, 24), ValueError, "multiple of 16"),
        (torch.ones(2, 4, 32), ValueError, "2-d tensor"),
        (torch.ones(4, 32, dtype=torch.int32), TypeError, "expected dtype"),
        (torch.full((4, 32), float("nan")), ValueError, "finite"),
    ],
)
def test_quantize_rejects_bad_input(x: torch.Tensor, error: type[Exception], message: str) -> None:
    with pytest.raises(error, match=message):
        Nvfp4Tensor.quantize(x, QuantizeGlobalScale.from_amax(1.0))


def test_constructors_reject_inconsistent_parts(gen: torch.Generator) -> None:
    q = Nvfp4Tensor.quantize(torch.randn(4, 32, generator=gen), QuantizeGlobalScale.from_amax(3.0))
    with pytest.raises(ValueError, match=r"Nvfp4Tensor.block_scales: expected shape \(4, 2\)"):
        Nvfp4Tensor(q.packed, LinearBlockScales.from_checkpoint(q.block_scales.data[:, :1]), q.global_scale)
    with pytest.raises(TypeError, match="Nvfp4Tensor.packed: expected dtype torch.uint8"):
        Nvfp4Tensor(q.packed.to(torch.int8), q.block_scales, q.global_scale)
    with pytest.raises(TypeError, match="expected QuantizeGlobalScale"):
        Nvfp4Tensor(q.packed, q.block_scales, q.global_scale.value)  # type: ignore[arg-type]  # the runtime check under test
    w = Nvfp4ExpertWeights.quantize(torch.randn(2, 4, 32, generator=gen))
    with pytest.raises(ValueError, match="expected 2 experts like packed, got 3"):
        Nvfp4ExpertWeights(w.packed, w.block_scales, ExpertQuantizeGlobalScales.from_checkpoint(torch.ones(3)))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize(("rows", "cols"), [(8, 64), (37, 160), (128, 256)])
def test_input_dtype_arithmetic_matches_compressed_tensors_on_half_precision(
    gen: torch.Generator, rows: int, cols: int, dtype: torch.dtype
) -> None:
    w = (random_weight(gen, rows, cols) / 4).to(dtype)
    ct = compressed_tensors_compress(w)

    ours = Nvfp4ExpertWeights.quantize(w[None], arithmetic=Nvfp4Arithmetic.INPUT_DTYPE)

    assert torch.equal(ours.global_scales.value, ct["weight_global_scale"])
    assert torch.equal(ours.block_scales.data[0].view(torch.uint8), ct["weight_scale"].view(torch.uint8))
    assert torch.equal(ours.packed[0], ct["weight_packed"])


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_float32_arithmetic_differs_from_compressed_tensors_on_half_precision(
    gen: torch.Generator, dtype: torch.dtype
) -> None:
    """The choice matters: FLOAT32's global scale ``2688 / amax`` is rarely representable in the input's dtype.

    (Block scales differ far more rarely: only where the rounding of ``amax / 6`` crosses an E4M3 step.)
    """
    w = torch.stack([random_weight(gen, 16, 64) / 4 for _ in range(8)]).to(dtype)
    ours = Nvfp4ExpertWeights.quantize(w).global_scales.value
    theirs = torch.cat([compressed_tensors_compress(w[e])["weight_global_scale"] for e in range(8)])
    assert int((ours != theirs).sum()) >= 6


def test_fp16_global_scale_overflow_is_refused_where_compressed_tensors_falls_back_to_one(gen: torch.Generator) -> None:
    """compressed-tensors turns ``2688 / amax``'s fp16 overflow (amax below about 0.041) into a global scale of 1.0,
    under which every block scale underflows and the expert reads as zeros (adversarial pass 13, c13: the layer's
    output about 0, 0.88-1.04 off). ``INPUT_DTYPE`` refuses such experts by name instead; ``FLOAT32`` quantizes them,
    and an all-zero expert still takes 1.0."""
    w = torch.full((4, 32), 0.01, dtype=torch.float16)  # 2688 / 0.01 overflows fp16
    assert float(compressed_tensors_compress(w)["weight_global_scale"]) == 1.0
    experts = torch.stack([random_weight(gen, 4, 32).to(torch.float16), w, torch.zeros_like(w)])
    with pytest.raises(ValueError, match=r"experts \[1\] \(amax down to 0.01\) overflows torch.float16 under .*FLOAT32"):
        Nvfp4ExpertWeights.quantize(experts, arithmetic=Nvfp4Arithmetic.INPUT_DTYPE)
    ours = Nvfp4ExpertWeights.quantize(experts)
    assert float(ours.global_scales.value[1]) == pytest.approx(268800, rel=1e-3)
    assert float(ours.global_scales.value[2]) == 1.0
    error = (ours.dequantize_expert(1) - w.float()).abs().max()
    assert float(error) <= 0.01 / 6  # one E2M1 step at most
