"""NVFP4 as FlashInfer's kernels read and write it, in plain PyTorch, written apart from moe_core's own code.

The kernel models use these instead of ``moe_core.nvfp4`` and
``moe_core.block_scales`` on purpose: a model that shared the code under test
could not catch its mistakes.

- E2M1: codes 0..7 are ``0, 0.5, 1, 1.5, 2, 3, 4, 6``, bit 3 the sign, two codes a
  byte, the first in the low nibble (FlashInfer ``tests/moe/test_trtllm_cutlass_fused_moe.py``
  ``break_fp4_bytes``); rounding is to nearest with ties to the even code, as
  the device converters do (``flashinfer/experimental/b12x/_lib/intrinsics.py``
  ``_fp4_quantize_values``: 0.25 -> 0, 0.75 -> 1, 1.25 -> 1, 1.75 -> 2, 2.5 -> 2,
  3.5 -> 4, 5 -> 4).
- 128x4 scale layout, by its offset formula (``csrc/nv_internal/tensorrt_llm/kernels/
  quantization_utils.cuh`` ``get_sf_out_offset_128x4``): scale ``(m, k)`` of a
  ``[rows, blocks]`` matrix, rows padded to 128 and blocks to 4, sits at
  ``(m // 128) * (blocks4 * 128) + (k // 4) * 512 + (m % 32) * 16 + ((m % 128) // 32) * 4 + k % 4``.
- Quantizing a block of 16 with quantize-side global scale ``g``
  (``quantization_utils.cuh`` ``cvt_warp_fp16_to_fp4``): ``sf = e4m3(g * (amax * (1 / 6)))``,
  codes ``round(x * (1 / (sf * (1 / g))))`` (0 where ``sf`` is 0), the kernel's
  operation order. Its reciprocals are approximate (``rcp.approx.ftz``); the
  model's are correctly rounded, so a value within an ulp of a midpoint may
  still round the other way on the device.
"""

from __future__ import annotations

import torch

E2M1 = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])
_ROUND_UP_AT = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0])
_TIE_GOES_UP = torch.tensor([False, True, False, True, False, True, False])


def decode_packed(packed: torch.Tensor) -> torch.Tensor:
    """uint8 ``[..., n / 2]`` -> float32 ``[..., n]``."""
    nibbles = torch.stack((packed & 0x0F, packed >> 4), dim=-1).flatten(-2).long()
    magnitude = E2M1.to(packed.device)[nibbles & 0x7]
    return torch.where(nibbles >= 8, -magnitude, magnitude)


def round_e2m1(values: torch.Tensor) -> torch.Tensor:
    """float32 values rounded to E2M1 (saturating at 6), as float32."""
    magnitude = values.abs()
    thresholds, ties = _ROUND_UP_AT.to(values.device), _TIE_GOES_UP.to(values.device)
    above = (magnitude.unsqueeze(-1) > thresholds) | ((magnitude.unsqueeze(-1) == thresholds) & ties)
    return torch.copysign(E2M1.to(values.device)[above.sum(-1)], values)


def encode_packed(values: torch.Tensor) -> torch.Tensor:
    """E2M1-representable float32 ``[..., n]`` -> packed uint8 ``[..., n / 2]``."""
    magnitude = (values.abs().unsqueeze(-1) == E2M1.to(values.device)).to(torch.uint8).argmax(-1).to(torch.uint8)
    codes = magnitude | ((values < 0).to(torch.uint8) << 3)
    pairs = codes.reshape(*codes.shape[:-1], -1, 2)
    return pairs[..., 0] | (pairs[..., 1] << 4)


def quantize_blocks(x: torch.Tensor, global_scale: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``x [..., n]`` -> (E2M1 values float32 ``[..., n]``, E4M3 scales ``[..., n / 16]``) with scalar ``global_scale``."""
    blocks = x.float().reshape(*x.shape[:-1], -1, 16)
    amax = blocks.abs().amax(-1)
    one = torch.ones((), dtype=torch.float32, device=x.device)
    scales = (global_scale * (amax * (one / 6.0))).clamp(max=448.0).to(torch.float8_e4m3fn)
    as_float = scales.float()
    inverse = torch.where(as_float == 0, 0.0, one / (as_float * (one / global_scale))).unsqueeze(-1)
    values = round_e2m1((blocks * inverse).clamp(-6.0, 6.0))
    return values.flatten(-2), scales


def dequantize(values: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """E2M1 values ``[..., n]`` times their E4M3 block scales ``[..., n / 16]``, float32."""
    blocks = values.reshape(*values.shape[:-1], -1, 16)
    return (blocks * scales.float().unsqueeze(-1)).flatten(-2)


def _round_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


def swizzled_offsets(rows: int, blocks: int) -> torch.Tensor:
    """int64 ``[rows, blocks]``: where scale ``(m, k)`` lies in the flat 128x4 buffer."""
    m = torch.arange(rows).unsqueeze(1)
    k = torch.arange(blocks).unsqueeze(0)
    k_tiles = _round_up(blocks, 4) // 4
    return (m // 128) * (k_tiles * 512) + (k // 4) * 512 + (m % 32) * 16 + ((m % 128) // 32) * 4 + k % 4


def unswizzle(buffer: torch.Tensor, rows: int, blocks: int) -> torch.Tensor:
    """E4M3 scales ``[E, rows, blocks]`` from per-expert 128x4 buffers of any shape ``[E, ...]``."""
    experts = buffer.shape[0]
    padded = _round_up(rows, 128) * _round_up(blocks, 4)
    flat = buffer.reshape(experts, -1).view(torch.uint8)
    if flat.shape[1] != padded:
        raise ValueError(f"swizzled scales: expected {padded} bytes per expert for {rows}x{blocks}, got {flat.shape[1]}")
    return flat[:, swizzled_offsets(rows, blocks).flatten()].reshape(experts, rows, blocks).view(torch.float8_e4m3fn)
