"""The run-time (kernel-recipe) NVFP4 activation quantizer against compressed-tensors' weight recipe.

A weight quantized offline must match compressed-tensors bit for bit
(``x / (s / g)``, ``Nvfp4Tensor.quantize``, checked in ``tests/test_nvfp4.py``);
an activation quantized inside a kernel must match the kernel
(``x * (1 / (s * (1 / g)))``, ``quantize_activation``). The two may round
apart only where a value lies within a few float32 ulps of an E2M1
midpoint, or a block's ``g * amax / 6`` of an E4M3 one: checked exactly here,
in float64. Ties are made common on purpose: bf16 inputs and a power-of-two
global scale make ``x * g / s`` land on midpoints exactly, where the weight
recipe rounds half to even and the kernel's rounded reciprocals tip it.
"""

from __future__ import annotations

import torch

from moe_core import MoeRunnerConfig, Nvfp4Tensor, QuantizeGlobalScale
from moe_core.float64_moe import nvfp4_round_trips
from moe_core.formats.nvfp4.reference import fake_quantize_nvfp4
from moe_core.nvfp4 import BLOCK_SIZE, E2M1_VALUES, decode_e2m1, quantize_activation, unpack_e2m1
from moe_core.synthetic import random_nvfp4_layer

NEAR = 2.0**-21
"""How close (relative, in float64) to a rounding midpoint a value must be for the two recipes to round it apart:
each recipe rounds three or four times in float32 (2^-24 each)."""

E2M1_MIDPOINTS = torch.tensor([(a + b) / 2 for a, b in zip(E2M1_VALUES, E2M1_VALUES[1:])], dtype=torch.float64)


def _e4m3_midpoints() -> torch.Tensor:
    codes = torch.arange(0, 0x7F, dtype=torch.uint8).view(torch.float8_e4m3fn).double()
    return (codes[:-1] + codes[1:]) / 2


def _near(values: torch.Tensor, midpoints: torch.Tensor) -> torch.Tensor:
    distance = (values.abs().unsqueeze(-1) - midpoints).abs().amin(dim=-1)
    return distance <= NEAR * values.abs()


def _codes(q: Nvfp4Tensor) -> torch.Tensor:
    return decode_e2m1(unpack_e2m1(q.packed))


def test_the_recipes_differ_exactly_near_midpoints(gen: torch.Generator) -> None:
    rows, cols = 256, 256
    x = (torch.randn(rows, cols, generator=gen) * 3).to(torch.bfloat16).float()
    scale = QuantizeGlobalScale.from_amax(448.0 * 6.0 / 2.0 ** torch.randint(2, 8, (), generator=gen).item())
    weight_recipe, kernel_recipe = Nvfp4Tensor.quantize(x, scale), quantize_activation(x, scale)
    g = float(scale.value)
    ws, ks = weight_recipe.block_scales.data.double(), kernel_recipe.block_scales.data.double()
    amax = x.reshape(rows, -1, BLOCK_SIZE).abs().amax(dim=-1).double()
    scale_differs = ws != ks
    assert bool(_near(g * amax / 6, _e4m3_midpoints())[scale_differs].all()), "a block scale differs away from a midpoint"
    code_differs = (_codes(weight_recipe) != _codes(kernel_recipe)).reshape(rows, -1, BLOCK_SIZE)
    same_scale = code_differs & ~scale_differs.unsqueeze(-1)
    exact = x.double().reshape(rows, -1, BLOCK_SIZE) * g / ws.unsqueeze(-1)
    assert bool(_near(exact, E2M1_MIDPOINTS)[same_scale].all()), "a code differs away from an E2M1 midpoint"
    assert int(same_scale.sum()) > 0, "the two recipes must round some ties apart (about 0.3% of codes here)"


def test_a_tie_by_hand() -> None:
    """``x * g / s = 2.5`` exactly (g = 8, s = 1.875): the weight recipe divides exactly and rounds the tie to even,
    2; the kernel's ``1 / (s * (1 / g))`` rounds up, and so does ``x`` times it (2.5000002): 3."""
    scale = QuantizeGlobalScale.from_amax(448.0 * 6.0 / 8.0)
    assert float(scale.value) == 8.0
    x = torch.zeros(1, BLOCK_SIZE)
    x[0, 0] = 6 * 1.875 / 8  # the block's amax: its scale is 1.875
    x[0, 1] = 2.5 * 1.875 / 8
    weight, kernel = Nvfp4Tensor.quantize(x, scale), quantize_activation(x, scale)
    assert float(weight.block_scales.data.float()[0, 0]) == 1.875 == float(kernel.block_scales.data.float()[0, 0])
    assert float(_codes(weight)[0, 1]) == 2.0 and float(_codes(kernel)[0, 1]) == 3.0


def test_weight_path_is_unchanged(gen: torch.Generator) -> None:
    """The offline quantizer still divides (compressed-tensors' recipe): bit for bit what ``x / (s / g)`` gives."""
    x = torch.randn(64, 128, generator=gen)
    scale = QuantizeGlobalScale.from_amax(x.abs().amax())
    q = Nvfp4Tensor.quantize(x, scale)
    g = scale.value.reshape(())
    s = q.block_scales.data.float()
    by_division = (x.reshape(64, -1, BLOCK_SIZE) / (s / g).unsqueeze(-1)).clamp(-6, 6)
    codes = _codes(q).reshape(64, -1, BLOCK_SIZE)
    rounded = torch.tensor(E2M1_VALUES)[(by_division.abs().unsqueeze(-1) - torch.tensor(E2M1_VALUES)).abs().argmin(-1)]
    off_midpoint = ~_near(by_division.double(), E2M1_MIDPOINTS)
    assert torch.equal(codes.abs()[off_midpoint], rounded[off_midpoint])


def test_the_reference_and_the_float64_oracle_use_the_kernel_recipe(gen: torch.Generator) -> None:
    config = MoeRunnerConfig(num_experts=4, hidden_size=64, intermediate_size_per_partition=32, top_k=2)
    weights, dispatch = random_nvfp4_layer(config, 8, torch.bfloat16, torch.device("cpu"), int(torch.randint(0, 2**31, (), generator=gen)))
    x = dispatch.hidden_states.float()
    kernel = quantize_activation(x, weights.w13_input_scale).dequantize()
    assert torch.equal(fake_quantize_nvfp4(x, weights.w13_input_scale), kernel)
    first, _ = nvfp4_round_trips(weights)
    assert torch.equal(first(0, x[0].double()), kernel[0].double())
