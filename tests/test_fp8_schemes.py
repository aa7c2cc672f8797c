"""The FP8 checkpoint schemes against independent dequantizations of their fixtures.

compressed-tensors ``FP8`` and ``FP8_DYNAMIC`` (tests/fixtures/make_ct_fp8.py, quantized and compressed by
compressed-tensors itself) against compressed-tensors' own decompression (bf16, as it computes with the checkpoint's
bf16 scales: bit for bit); DeepSeek-V3 block FP8 (tests/fixtures/make_deepseek_fp8.py) against the published
formula ``e4m3 * weight_scale_inv`` per 128x128 block, written out here (float32, bit for bit).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from moe_core import Fp8BlockMoeWeights, Fp8ChannelMoeWeights, Fp8MoeWeights
from moe_core.checkpoint import MoeCheckpoint
from moe_core.config import GroupedTopK
from moe_core.schemes import compressed_tensors_fp8, deepseek_fp8
from tests.checkpoint_oracles import read_tensors

FIXTURES = Path(__file__).resolve().parent / "fixtures"
CT_FP8 = FIXTURES / "qwen3_moe_fp8"
CT_FP8_DYNAMIC = FIXTURES / "qwen3_moe_fp8_dynamic"
DEEPSEEK = FIXTURES / "deepseek_v3_fp8"


def _ct_decompressed(directory: Path, preset: str, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``w13 [E, 2I, H]`` and ``w2 [E, H, I]`` by compressed-tensors' FP8 decompressor (bf16)."""
    from compressed_tensors.compressors.naive_quantized.base import FloatQuantizationCompressor
    from compressed_tensors.quantization import preset_name_to_scheme

    scheme, tensors = preset_name_to_scheme(preset, ["Linear"]), read_tensors(directory)
    prefix = f"model.layers.{layer}.mlp.experts"

    def weight(name: str) -> torch.Tensor:
        state = {key: tensors[f"{prefix}.{name}.{key}"] for key in ("weight", "weight_scale")}
        decompressed: torch.Tensor = FloatQuantizationCompressor.decompress(state, scheme)["weight"]
        return decompressed

    experts = range(MoeCheckpoint(directory).num_experts)
    w13 = torch.stack([torch.cat((weight(f"{e}.gate_proj"), weight(f"{e}.up_proj"))) for e in experts])
    return w13, torch.stack([weight(f"{e}.down_proj") for e in experts])


@pytest.mark.parametrize("layer", [0, 1])
def test_compressed_tensors_fp8_static_is_bit_exact_with_its_decompression(layer: int) -> None:
    checkpoint = MoeCheckpoint(CT_FP8)
    assert checkpoint.scheme() is compressed_tensors_fp8.STATIC_SCHEME
    weights = checkpoint.load_layer(layer, keep_canonical=True).weights
    assert isinstance(weights, Fp8MoeWeights)
    w13, w2 = _ct_decompressed(CT_FP8, "FP8", layer)
    assert w13.dtype == torch.bfloat16
    assert torch.equal(weights.w13.dequantize(torch.bfloat16), w13)
    assert torch.equal(weights.w2.dequantize(torch.bfloat16), w2)
    tensors, prefix = read_tensors(CT_FP8), f"model.layers.{layer}.mlp.experts"
    experts = range(checkpoint.num_experts)
    gate_up = [tensors[f"{prefix}.{e}.{p}.input_scale"].float() for e in experts for p in ("gate_proj", "up_proj")]
    down = [tensors[f"{prefix}.{e}.down_proj.input_scale"].float() for e in experts]
    assert torch.equal(weights.w13_input_scale.value, torch.stack(gate_up).max().reshape(1))  # conservative: the largest
    assert torch.equal(weights.w2_input_scale.value, torch.stack(down).max().reshape(1))


@pytest.mark.parametrize("layer", [0, 1])
def test_compressed_tensors_fp8_dynamic_is_bit_exact_with_its_decompression(layer: int) -> None:
    checkpoint = MoeCheckpoint(CT_FP8_DYNAMIC)
    assert checkpoint.scheme() is compressed_tensors_fp8.DYNAMIC_SCHEME
    weights = checkpoint.load_layer(layer, keep_canonical=True).weights
    assert isinstance(weights, Fp8ChannelMoeWeights)
    w13, w2 = _ct_decompressed(CT_FP8_DYNAMIC, "FP8_DYNAMIC", layer)
    assert torch.equal(weights.w13.dequantize(torch.bfloat16), w13)
    assert torch.equal(weights.w2.dequantize(torch.bfloat16), w2)


def test_the_static_and_dynamic_schemes_refuse_each_other() -> None:
    static, dynamic = MoeCheckpoint(CT_FP8).quantization_config, MoeCheckpoint(CT_FP8_DYNAMIC).quantization_config
    assert compressed_tensors_fp8.static_unsupported_reason(dynamic) is not None
    assert compressed_tensors_fp8.dynamic_unsupported_reason(static) is not None
    assert deepseek_fp8.unsupported_reason(static) == "quant_method is 'compressed-tensors', not 'fp8'"


def _published_dequantization(codes: torch.Tensor, scale_inv: torch.Tensor) -> torch.Tensor:
    """DeepSeek's ``weight_dequant``: each 128x128 block of ``codes`` times its ``weight_scale_inv``, float32."""
    out, cols = codes.shape
    grid = scale_inv.repeat_interleave(128, 0)[:out].repeat_interleave(128, 1)[:, :cols]
    return codes.to(torch.float32) * grid


def test_deepseek_fp8_is_bit_exact_with_the_published_formula() -> None:
    checkpoint = MoeCheckpoint(DEEPSEEK)
    assert checkpoint.scheme() is deepseek_fp8.SCHEME
    assert checkpoint.moe_layers() == [1]  # layer 0 is dense (first_k_dense_replace)
    config = checkpoint.runner_config()
    assert config.routing_method == GroupedTopK(n_group=2, topk_group=1, renormalize=True)
    assert config.routed_scaling_factor == 2.5
    weights = checkpoint.load_layer(1, keep_canonical=True).weights
    assert isinstance(weights, Fp8BlockMoeWeights)
    tensors, prefix = read_tensors(DEEPSEEK), "model.layers.1.mlp.experts"

    def weight(name: str) -> torch.Tensor:
        return _published_dequantization(tensors[f"{prefix}.{name}.weight"], tensors[f"{prefix}.{name}.weight_scale_inv"])

    experts = range(checkpoint.num_experts)
    w13 = torch.stack([torch.cat((weight(f"{e}.gate_proj"), weight(f"{e}.up_proj"))) for e in experts])
    assert torch.equal(weights.w13.dequantize(), w13)
    assert torch.equal(weights.w2.dequantize(), torch.stack([weight(f"{e}.down_proj") for e in experts]))
    assert checkpoint.router_weight(1).shape == (4, 128)
