"""Independent readings of the fixture checkpoints, for comparing the schemes with.

Nothing here goes through moe-core's loader or schemes: tensors are read
straight from the safetensors files, and NVFP4 weights are decompressed by
compressed-tensors' own compressor (compressed-tensors checkpoints) or by
ModelOpt's documented formula ``e2m1 * weight_scale * weight_scale_2``
(ModelOpt checkpoints), with compressed-tensors' FP4 unpacker.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch
from compressed_tensors.compressors.nvfp4 import NVFP4PackedCompressor
from compressed_tensors.compressors.nvfp4.helpers import unpack_fp4_from_uint8
from compressed_tensors.quantization import QuantizationScheme, preset_name_to_scheme
from safetensors import safe_open
from safetensors.torch import save_file

FIXTURES = Path(__file__).resolve().parent / "fixtures"
CT_NVFP4 = FIXTURES / "qwen3_moe_nvfp4"
"""llmcompressor's stock NVFP4 (gate and up share one global scale per expert)."""
CT_SPLIT = FIXTURES / "mixtral_nvfp4_split"
"""Mixtral, gate/up global scales differ, expert 5 tiny."""
MODELOPT = FIXTURES / "qwen3_moe_nvfp4_modelopt"
BF16 = FIXTURES / "qwen3_moe_bf16"
"""The unquantized model ``CT_NVFP4`` and ``MODELOPT`` were quantized from."""

NVFP4_SCHEME: QuantizationScheme = preset_name_to_scheme("NVFP4", ["Linear"])


def read_tensors(directory: Path) -> dict[str, torch.Tensor]:
    """Every tensor of a checkpoint, by name, read file by file."""
    index = directory / "model.safetensors.index.json"
    files = sorted(set(json.loads(index.read_text())["weight_map"].values())) if index.exists() else ["model.safetensors"]
    tensors: dict[str, torch.Tensor] = {}
    for name in files:
        with safe_open(str(directory / name), "pt") as handle:
            tensors.update({key: handle.get_tensor(key) for key in handle.keys()})
    return tensors


def block_of(directory: Path, layer: int) -> str:
    """The MoE block's tensor prefix in ``directory``'s naming."""
    config = json.loads((directory / "config.json").read_text())
    return f"model.layers.{layer}.{'block_sparse_moe' if config['model_type'] == 'mixtral' else 'mlp'}"


def ct_decompressed(tensors: dict[str, torch.Tensor], prefix: str) -> torch.Tensor:
    """compressed-tensors' own decompression of one projection (its bf16 weight)."""
    state = {name: tensors[f"{prefix}.{name}"] for name in ("weight_packed", "weight_scale", "weight_global_scale")}
    weight: torch.Tensor = NVFP4PackedCompressor.decompress(state, NVFP4_SCHEME)["weight"]
    return weight


def modelopt_decompressed(tensors: dict[str, torch.Tensor], prefix: str) -> torch.Tensor:
    """ModelOpt's dequantization of one projection, ``e2m1 * weight_scale * weight_scale_2``, in float32."""
    packed = tensors[f"{prefix}.weight"]
    rows, half = packed.shape
    values: torch.Tensor = unpack_fp4_from_uint8(packed, rows, 2 * half, torch.float32)
    scales = tensors[f"{prefix}.weight_scale"].to(torch.float32).repeat_interleave(16, dim=1)
    return values * scales * tensors[f"{prefix}.weight_scale_2"].to(torch.float32)


def expert_weights(
    directory: Path, layer: int, decompress: str = "compressed-tensors"
) -> tuple[torch.Tensor, torch.Tensor]:
    """``w13 [E, 2I, H]`` (gate then up) and ``w2 [E, H, I]`` of a layer in float32, decompressed independently.

    ``decompress`` is ``compressed-tensors``, ``modelopt`` or ``none`` (an unquantized checkpoint).
    """
    tensors = read_tensors(directory)
    block = block_of(directory, layer)
    experts = sorted({int(key.split(".experts.")[1].split(".")[0]) for key in tensors if key.startswith(f"{block}.experts.")})

    def projection(expert: int, name: str) -> torch.Tensor:
        prefix = f"{block}.experts.{expert}.{name}"
        if decompress == "compressed-tensors":
            return ct_decompressed(tensors, prefix).float()
        if decompress == "modelopt":
            return modelopt_decompressed(tensors, prefix)
        return tensors[f"{prefix}.weight"].float()

    w13 = torch.stack([torch.cat((projection(e, "gate_proj"), projection(e, "up_proj"))) for e in experts])
    w2 = torch.stack([projection(e, "down_proj") for e in experts])
    return w13, w2


def copy_checkpoint(source: Path, target: Path) -> Path:
    """A writable copy of a fixture checkpoint."""
    shutil.copytree(source, target)
    return target


def rewrite_tensor(directory: Path, key: str, value: torch.Tensor | None, *, beside: str | None = None) -> None:
    """Replace, add (in the file of tensor ``beside``) or, with None, delete one tensor of a sharded checkpoint.

    The index stays consistent with the files.
    """
    index_path = directory / "model.safetensors.index.json"
    index = json.loads(index_path.read_text())
    file_name = index["weight_map"][beside or key]
    if key not in index["weight_map"]:
        index["weight_map"][key] = file_name
        index_path.write_text(json.dumps(index))
    with safe_open(str(directory / file_name), "pt") as handle:
        tensors = {name: handle.get_tensor(name) for name in handle.keys()}
    if value is None:
        del tensors[key], index["weight_map"][key]
        index_path.write_text(json.dumps(index))
    else:
        tensors[key] = value
    save_file(tensors, str(directory / file_name), metadata={"format": "pt"})


def edit_config(directory: Path, **changes: object) -> None:
    """Change top-level fields of ``config.json``."""
    path = directory / "config.json"
    config = json.loads(path.read_text())
    config.update(changes)
    path.write_text(json.dumps(config))
