"""Loading as engines do it, and what a malformed checkpoint gets: an error that names what is wrong."""

from __future__ import annotations

import copy
import json
import pickle
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import attrs
import pytest
import torch
from safetensors.torch import load_file, save_file

from moe_core import (
    NVFP4,
    Activation,
    RoutingMethod,
    BackendSelectionError,
    DeviceSpec,
    LayerSpec,
    Priority,
    Support,
    Tier,
    ExpertScalePolicy,
    Fp8BlockMoeWeights,
    Fp8ChannelMoeWeights,
    Fp8MoeWeights,
    GateUpScalePolicy,
    MoeRunnerConfig,
    StandardDispatchOutput,
    create_runner,
    register_backend,
    route,
    select_experts,
)
from moe_core.backends.reference import REFERENCE_DENSE, REFERENCE_NVFP4
from moe_core.checkpoint import CorruptCheckpoint, MoeCheckpoint
from moe_core.registry import BoundRunner
from moe_core.expert_params import ExpertShard
from moe_core.scheme import ExpertScheme, UnsupportedCheckpoint
from moe_core.schemes.compressed_tensors_w4a4_nvfp4 import CompressedTensorsW4A4Nvfp4MoE
from tests.checkpoint_oracles import (
    FIXTURES,
    CT_NVFP4,
    CT_SPLIT,
    FIXTURES,
    MODELOPT,
    copy_checkpoint,
    edit_config,
    read_tensors,
    rewrite_tensor,
)

EXPERT_3_UP = "model.layers.0.mlp.experts.3.up_proj"


@pytest.fixture
def checkpoint_copy(tmp_path: Path) -> Path:
    return copy_checkpoint(CT_NVFP4, tmp_path / "checkpoint")


@pytest.mark.parametrize("extra", ["experts.gate_up_proj", "experts.down_proj_weight_packed", "experts.3.gate_up_proj.weight"])
def test_expert_tensors_the_loader_does_not_read_are_refused(checkpoint_copy: Path, extra: str) -> None:
    """Silent (adversarial pass 18, c09): a stacked ``experts.gate_up_proj`` beside the per-expert tensors, with other
    values, was never read: the layer loaded from the per-expert ones, 1.41 off the stack's. Every tensor under a
    layer's experts is one the loader reads, or the layer is refused naming it."""
    prefix = EXPERT_3_UP.split(".experts.")[0]
    rewrite_tensor(checkpoint_copy, f"{prefix}.{extra}", torch.ones(4, 4), beside=f"{EXPERT_3_UP}.weight_scale")
    with pytest.raises(ValueError, match=re.escape(f"{prefix}.{extra}: under layer 0's experts, where the qwen3_moe loader reads")):
        MoeCheckpoint(checkpoint_copy).load_layer(0)


def test_a_router_bias_missing_where_the_architecture_adds_one_or_present_where_it_has_none_is_refused(
    tmp_path: Path,
) -> None:
    """Silent (adversarial pass 20, d10): a gpt-oss checkpoint without its ``router.bias`` loaded and routed without
    it, 0.17 off its model; a bias in a Qwen3-MoE checkpoint would be added where its model adds none."""
    gpt_oss = copy_checkpoint(FIXTURES / "gpt_oss_mxfp4", tmp_path / "gpt_oss")
    tensors = load_file(gpt_oss / "model.safetensors")
    key = next(name for name in tensors if name.endswith("mlp.router.bias"))
    del tensors[key]
    save_file(tensors, gpt_oss / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(ValueError, match=re.escape(f"{key}: not in {gpt_oss}, and the gpt_oss router adds it to its logits")):
        MoeCheckpoint(gpt_oss).router(int(key.split(".")[2]))
    qwen3 = copy_checkpoint(FIXTURES / "qwen3_moe_bf16", tmp_path / "qwen3")
    weight = "model.layers.0.mlp.gate.weight"
    rewrite_tensor(qwen3, "model.layers.0.mlp.gate.bias", torch.ones(MoeCheckpoint(qwen3).num_experts), beside=weight)
    with pytest.raises(ValueError, match=r"mlp\.gate\.bias: the qwen3_moe router has no bias, which its model would not add"):
        MoeCheckpoint(qwen3).router(0)


def test_missing_tensor_is_named(checkpoint_copy: Path) -> None:
    rewrite_tensor(checkpoint_copy, f"{EXPERT_3_UP}.weight_scale", None)
    with pytest.raises(ValueError, match=re.escape("1 checkpoint tensors were never loaded: experts.3.up_proj.weight_scale")):
        MoeCheckpoint(checkpoint_copy).load_layer(0)


def test_wrong_dtype_is_named(checkpoint_copy: Path) -> None:
    key = f"{EXPERT_3_UP}.weight_global_scale"
    rewrite_tensor(checkpoint_copy, key, read_tensors(CT_NVFP4)[key].to(torch.float16))
    with pytest.raises(TypeError, match=re.escape(f"{key}: expected dtype torch.float32, got torch.float16")):
        MoeCheckpoint(checkpoint_copy).load_layer(0)


def test_wrong_shape_is_named(checkpoint_copy: Path) -> None:
    key = f"{EXPERT_3_UP}.weight_packed"
    rewrite_tensor(checkpoint_copy, key, read_tensors(CT_NVFP4)[key][:, :32].contiguous())
    with pytest.raises(ValueError, match=re.escape(f"{key}: expected shape (64, 64) [out_features, in_features / 2]")):
        MoeCheckpoint(checkpoint_copy).load_layer(0)


def test_unknown_tensor_is_named(checkpoint_copy: Path) -> None:
    key = f"{EXPERT_3_UP}.weight_zero_point"
    rewrite_tensor(checkpoint_copy, key, torch.zeros(64, 8, dtype=torch.int8), beside=f"{EXPERT_3_UP}.weight_packed")
    with pytest.raises(ValueError, match=re.escape(f"{key}: the compressed-tensors-w4a4-nvfp4 scheme takes no tensor")):
        MoeCheckpoint(checkpoint_copy).load_layer(0)


def test_non_finite_scale_is_refused(checkpoint_copy: Path) -> None:
    rewrite_tensor(checkpoint_copy, f"{EXPERT_3_UP}.weight_global_scale", torch.tensor([float("inf")]))
    with pytest.raises(ValueError, match="expected finite values"):
        MoeCheckpoint(checkpoint_copy).load_layer(0)


def test_unknown_quantization_config_lists_every_schemes_reason(checkpoint_copy: Path) -> None:
    edit_config(checkpoint_copy, quantization_config={"quant_method": "awq", "bits": 4})
    with pytest.raises(UnsupportedCheckpoint) as raised:
        MoeCheckpoint(checkpoint_copy).load_layer(0)
    message = str(raised.value)
    assert "compressed-tensors-w4a4-nvfp4: quant_method is 'awq', not 'compressed-tensors'" in message
    assert "modelopt-nvfp4: quant_method is 'awq', not 'modelopt'" in message
    assert "unquantized: the checkpoint is quantized (quant_method 'awq')" in message


def test_nvfp4_weight_only_config_is_not_w4a4(checkpoint_copy: Path) -> None:
    config = MoeCheckpoint(checkpoint_copy).config["quantization_config"]
    assert isinstance(config, dict)
    config["config_groups"]["group_0"]["input_activations"] = None
    edit_config(checkpoint_copy, quantization_config=config)
    with pytest.raises(UnsupportedCheckpoint, match="input_activations: not quantized"):
        MoeCheckpoint(checkpoint_copy).scheme()


def test_unknown_architecture_and_missing_files(tmp_path: Path, checkpoint_copy: Path) -> None:
    with pytest.raises(FileNotFoundError, match="config.json: not found"):
        MoeCheckpoint(tmp_path)
    edit_config(checkpoint_copy, model_type="llama")
    with pytest.raises(UnsupportedCheckpoint, match="model_type 'llama' is not an MoE architecture the loader knows"):
        MoeCheckpoint(checkpoint_copy)
    edit_config(checkpoint_copy, model_type="qwen3_moe")
    (checkpoint_copy / "model.safetensors.index.json").unlink()
    with pytest.raises(FileNotFoundError, match="neither model.safetensors.index.json nor model.safetensors"):
        MoeCheckpoint(checkpoint_copy)


def tensor_spans(path: Path) -> dict[str, tuple[int, int]]:
    """Each tensor's byte range in the data section of safetensors file ``path``, from its JSON header."""
    data = path.read_bytes()
    header = json.loads(data[8 : 8 + int.from_bytes(data[:8], "little")])
    return {name: (entry["data_offsets"][0], entry["data_offsets"][1]) for name, entry in header.items() if name != "__metadata__"}


def test_truncated_shard_names_the_file_its_size_and_the_first_tensor_cut(checkpoint_copy: Path) -> None:
    """A download cut short: the header parses, and the tensors it places past the end are named."""
    shard = checkpoint_copy / "model-00001-of-00003.safetensors"
    spans, size = tensor_spans(shard), shard.stat().st_size
    header_end = size - max(end for _, end in spans.values())
    keep = header_end + sorted(end for _, end in spans.values())[len(spans) // 2]  # half the tensors whole
    shard.write_bytes(shard.read_bytes()[:keep])
    cut = sorted((start, name) for name, (start, end) in spans.items() if header_end + end > keep)
    checkpoint = MoeCheckpoint(checkpoint_copy)  # reads only the index
    message = (
        f"{shard}: truncated: {keep} bytes where its header describes {size}; "
        f"the tensors from {cut[0][1]!r} on ({len(cut)} of {len(spans)}) read past the end (safetensors: "
    )
    with pytest.raises(CorruptCheckpoint, match=re.escape(message)):
        checkpoint.load_layer(0)


def test_truncated_or_garbage_single_file_is_named_when_the_weight_map_is_read(tmp_path: Path) -> None:
    single = copy_checkpoint(MODELOPT, tmp_path / "modelopt") / "model.safetensors"
    intact = single.read_bytes()
    cases = [
        (intact[:-1], f"truncated: {len(intact) - 1} bytes where its header describes {len(intact)}; the tensors from "),
        (intact[:100], "not a safetensors file, or cut inside its header: 100 bytes, its first 8 announce a "),
        # what a failed download often saves in the file's place
        (b"<html><body>404: Not Found</body></html>\n" * 20, "not a safetensors file, or cut inside its header: 820 bytes"),
        ((8).to_bytes(8, "little") + b"not json", "not a safetensors file: its 8-byte header is not JSON tensor entries"),
        (b"safe", "not a safetensors file: 4 bytes, fewer than the 8 that give its header's length"),
        (intact + b"\0", f"{len(intact) + 1} bytes where its header describes {len(intact)}: bytes after its last tensor"),
    ]
    for content, damage in cases:
        single.write_bytes(content)
        with pytest.raises(CorruptCheckpoint, match=re.escape(f"{single}: {damage}")):
            MoeCheckpoint(single.parent)


def test_a_tensor_the_index_places_in_the_wrong_shard_is_named(checkpoint_copy: Path) -> None:
    index_path = checkpoint_copy / "model.safetensors.index.json"
    index = json.loads(index_path.read_text())
    key = f"{EXPERT_3_UP}.weight_packed"
    other = next(name for name in sorted(set(index["weight_map"].values())) if name != index["weight_map"][key])
    index["weight_map"][key] = other
    index_path.write_text(json.dumps(index))
    message = f"{checkpoint_copy / other}: holds no tensor {key!r}, which model.safetensors.index.json places there"
    with pytest.raises(CorruptCheckpoint, match=re.escape(message)):
        MoeCheckpoint(checkpoint_copy).load_layer(0)


def test_layer_without_experts_lists_the_moe_layers() -> None:
    with pytest.raises(ValueError, match=re.escape("has MoE experts in layers [0, 1], not in layer 2")):
        MoeCheckpoint(CT_NVFP4).load_layer(2)


def test_disagreeing_scales_under_require_equal_policies() -> None:
    """The split fixture: w1/w3 weight scales differ (kept apart, never an error), input scales differ per expert."""
    checkpoint = MoeCheckpoint(CT_SPLIT)
    strict = CompressedTensorsW4A4Nvfp4MoE(checkpoint.runner_config(), input_scale_policy=ExpertScalePolicy.REQUIRE_EQUAL)
    # every expert saw every calibration token, so w1/w3 input scales agree; w2's differ per expert
    with pytest.raises(ValueError, match=r"model.layers.0.block_sparse_moe of .*: QuantizeGlobalScale: experts disagree"):
        checkpoint.load_into(0, strict)
    weights = checkpoint.load_into(0, CompressedTensorsW4A4Nvfp4MoE(checkpoint.runner_config()), keep_canonical=True).weights
    assert weights is not None
    with pytest.raises(ValueError, match=re.escape("w13: gate and up global scales differ for experts [0, 1, 2, 3, 4, 5, 6, 7]")):
        weights.w13.with_shared_global_scales(GateUpScalePolicy.REQUIRE_EQUAL)


def test_engine_style_loading_one_expert_and_shard_at_a_time_with_expert_parallelism(gen: torch.Generator) -> None:
    """Two ranks of 4 local experts each hold the whole layer's experts, and their outputs add up to it.

    Each rank keeps every expert's input scales and collapses them over the
    whole layer, so both ranks quantize a token exactly as the single-rank
    layer does: the ranks' W4A4 outputs add up to the layer's (each partial
    rounded to bf16 once).
    """
    checkpoint = MoeCheckpoint(CT_SPLIT)
    tensors = read_tensors(CT_SPLIT)
    full = checkpoint.load_into(0, CompressedTensorsW4A4Nvfp4MoE(checkpoint.runner_config()), keep_canonical=True)
    assert full.weights is not None
    x = torch.randn(23, checkpoint.hidden_size, generator=gen).to(torch.bfloat16)
    dispatch = StandardDispatchOutput(x, select_experts(x.float() @ checkpoint.router_weight(0).float().T, full.config))
    partial = []
    for offset in (0, 4):
        config = checkpoint.runner_config(num_local_experts=4, local_expert_offset=offset)
        rank = CompressedTensorsW4A4Nvfp4MoE(config)
        loaded = 0
        for key, expert, shard, name in checkpoint.expert_keys(0):
            loaded += rank.load_expert_weight(name, tensors[key], expert_id=expert, shard=shard)
        # 4 local experts x 3 projections x 3 tensors, and the input scale of all 8 experts' 3 projections
        assert loaded == 4 * 3 * 3 + 8 * 3
        rank.process_weights_after_loading(keep_canonical=True)
        assert rank.weights is not None
        assert torch.equal(rank.weights.w13.up.packed, full.weights.w13.up.packed[offset : offset + 4])
        assert torch.equal(rank.weights.w2.global_scales.value, full.weights.w2.global_scales.value[offset : offset + 4])
        assert torch.equal(rank.weights.w13_input_scale.value, full.weights.w13_input_scale.value)
        assert torch.equal(rank.weights.w2_input_scale.value, full.weights.w2_input_scale.value)
        partial.append(create_runner(REFERENCE_NVFP4, config).run(dispatch, rank.weights).float())
    whole = create_runner(REFERENCE_NVFP4, full.config).run(dispatch, full.weights).float()
    torch.testing.assert_close(partial[0] + partial[1], whole, rtol=0, atol=2 * float(whole.abs().max()) * 2**-8)


def test_a_tensor_loaded_twice_is_refused() -> None:
    """Silent (adversarial pass 6, c20): a checkpoint holding a stale ``experts.0.w1.weight`` beside
    ``experts.0.gate_proj.weight`` loaded both into expert 0's gate, the later one winning, 1.58 off against the clean
    checkpoint. A slot loaded a second time is refused, naming it."""
    checkpoint = MoeCheckpoint(CT_NVFP4)
    scheme = CompressedTensorsW4A4Nvfp4MoE(checkpoint.runner_config())
    tensors = read_tensors(CT_NVFP4)
    key, expert, shard, name = checkpoint.expert_keys(0)[0]
    scheme.load_expert_weight(name, tensors[key], expert_id=expert, shard=shard)
    with pytest.raises(ValueError, match=rf"experts\.{expert}\.{shard.projection}\.{name}: loaded twice"):
        scheme.load_expert_weight(name, tensors[key], expert_id=expert, shard=shard)


def test_loader_refuses_ids_and_shards_that_do_not_exist() -> None:
    scheme = CompressedTensorsW4A4Nvfp4MoE(MoeCheckpoint(CT_NVFP4).runner_config())
    packed = torch.zeros(64, 64, dtype=torch.uint8)
    with pytest.raises(ValueError, match=re.escape("expert_id: expected an id < 8 (num_experts), got 8")):
        scheme.load_expert_weight("weight_packed", packed, expert_id=8, shard=ExpertShard.GATE)
    with pytest.raises(TypeError, match="shard: expected an ExpertShard"):
        scheme.load_expert_weight("weight_packed", packed, expert_id=0, shard="w1")  # type: ignore[arg-type]  # a str where the enum belongs
    with pytest.raises(RuntimeError, match="call process_weights_after_loading"):
        scheme.apply(StandardDispatchOutput(torch.randn(1, 128), select_experts(torch.randn(1, 8), scheme.config)))


def test_parameters_can_be_created_on_meta_and_the_reference_says_why_it_cannot_run_there() -> None:
    checkpoint = MoeCheckpoint(CT_NVFP4)
    with pytest.raises(BackendSelectionError, match="reference-nvfp4: meta tensors hold no values"):
        checkpoint.load_layer(0, device=torch.device("meta"))
    scheme = CompressedTensorsW4A4Nvfp4MoE(checkpoint.runner_config(), torch.device("meta"))
    assert scheme.params.gate_up("weight_packed").shape == (8, 2, 64, 64)
    assert scheme.params.gate_up("weight_packed").is_meta


def _nowhere(device: DeviceSpec, layer: LayerSpec) -> Support:
    return Support.no("needs a device this machine lacks")


@pytest.mark.usefixtures("isolated_registry")
def test_forced_backend_and_the_reasons_when_it_cannot_run() -> None:
    checkpoint = MoeCheckpoint(CT_NVFP4)
    route = REFERENCE_NVFP4.route(NVFP4)
    forced = CompressedTensorsW4A4Nvfp4MoE(checkpoint.runner_config(), backend=route)
    assert forced.backend_choices() == (route,)
    never = register_backend(
        "test-never-nvfp4",
        description="a plugin that runs nowhere",
        factory=REFERENCE_NVFP4.factory,
        supports=_nowhere,
        priority=Priority(Tier.KERNEL, order=5),
        conversions=REFERENCE_NVFP4.conversions,
    )
    refused = CompressedTensorsW4A4Nvfp4MoE(checkpoint.runner_config(), backend=never.route(NVFP4))
    tensors = read_tensors(CT_NVFP4)
    for key, expert, shard, name in checkpoint.expert_keys(0):
        refused.load_expert_weight(name, tensors[key], expert_id=expert, shard=shard)
    with pytest.raises(BackendSelectionError, match="backend 'test-never-nvfp4' cannot run nvfp4 on cpu: needs a device this machine lacks"):
        refused.process_weights_after_loading()
    # not forced: the plugin is one more candidate where its declared rank puts it, passed over with its reason
    default = checkpoint.load_into(0, CompressedTensorsW4A4Nvfp4MoE(checkpoint.runner_config()))
    names = [choice.name for choice in default.backend_choices()]
    assert names == [
        "flashinfer-trtllm-fp4", "flashinfer-cutlass-nvfp4", "test-never-nvfp4", "triton-nvfp4-w4a16", "reference-nvfp4",
        "reference-nvfp4-w4a16",
    ]
    summary = default.backend_summary()
    assert summary.startswith("compressed-tensors-w4a4-nvfp4: backend reference-nvfp4; passed over: flashinfer-trtllm-fp4 (")
    assert "test-never-nvfp4 (needs a device this machine lacks)" in summary
    assert summary.endswith("triton-nvfp4-w4a16 (by name only: Triton's CPU interpreter (TRITON_INTERPRET=1): exact but slow, for tests)")


def test_mixtral_w1_w3_w2_naming_in_one_file_loads_the_same_layer(tmp_path: Path, gen: torch.Generator) -> None:
    """transformers 5 saves Mixtral experts as gate_proj/up_proj/down_proj; Hub Mixtral checkpoints say w1/w3/w2."""
    renames = {".gate_proj.": ".w1.", ".up_proj.": ".w3.", ".down_proj.": ".w2."}
    renamed = {}
    for key, tensor in read_tensors(CT_SPLIT).items():
        for old, new in renames.items():
            key = key.replace(old, new) if ".experts." in key else key
        renamed[key] = tensor
    target = tmp_path / "mixtral_w1w3w2"
    target.mkdir()
    (target / "config.json").write_text((CT_SPLIT / "config.json").read_text())
    save_file(renamed, str(target / "model.safetensors"), metadata={"format": "pt"})
    assert any(".experts.0.w3.weight_global_scale" in key for key in MoeCheckpoint(target).weight_map)

    original, mixtral_named = MoeCheckpoint(CT_SPLIT), MoeCheckpoint(target)
    first = original.load_into(1, CompressedTensorsW4A4Nvfp4MoE(original.runner_config()), keep_canonical=True)
    second = mixtral_named.load_into(1, CompressedTensorsW4A4Nvfp4MoE(mixtral_named.runner_config()), keep_canonical=True)
    assert first.weights is not None and second.weights is not None
    assert torch.equal(first.weights.w13.up.packed, second.weights.w13.up.packed)
    assert torch.equal(first.weights.w13.up.global_scales.value, second.weights.w13.up.global_scales.value)
    x = torch.randn(9, original.hidden_size, generator=gen).to(torch.bfloat16)
    dispatch = StandardDispatchOutput(x, select_experts(x.float() @ original.router_weight(1).float().T, first.config))
    assert torch.equal(first.apply(dispatch), second.apply(dispatch))


@pytest.mark.parametrize(
    ("changes", "error", "match"),
    [
        ({"norm_topk_prob": "false"}, ValueError, r"expected true or false at 'norm_topk_prob', got 'false'"),
        ({"norm_topk_prob": 0}, ValueError, r"expected true or false at 'norm_topk_prob', got 0"),
        ({"hidden_act": "quick_gelu"}, UnsupportedCheckpoint, r"hidden_act 'quick_gelu' is not a gated activation computed here"),
        ({"hidden_act": "relu2"}, UnsupportedCheckpoint, r"hidden_act 'relu2' is not a gated activation"),
    ],
)
def test_config_values_that_would_be_misread_are_refused_by_name(
    checkpoint_copy: Path, changes: dict[str, object], error: type[Exception], match: str
) -> None:
    """A string where a JSON boolean belongs (``bool("false")`` is True) and an activation the experts would not
    compute fail when the checkpoint is opened, not as a differently routed or activated layer."""
    edit_config(checkpoint_copy, **changes)
    with pytest.raises(error, match=match):
        MoeCheckpoint(checkpoint_copy)


def test_config_hidden_act_reaches_the_layer(checkpoint_copy: Path) -> None:
    edit_config(checkpoint_copy, hidden_act="gelu", norm_topk_prob=False)
    config = MoeCheckpoint(checkpoint_copy).runner_config()
    assert config.activation is Activation.GELU_GATED
    assert config.routing_method is RoutingMethod.SOFTMAX_TOPK


@pytest.mark.parametrize(
    ("changes", "match"),
    [
        ({"scoring_func": "softmax"}, r"scoring_func 'softmax' is not computed here \(only 'sigmoid'\)"),
        ({"topk_method": "group_limited_greedy"}, r"topk_method 'group_limited_greedy' is not computed here"),
        ({"norm_topk_prob": "False"}, r"expected true or false at 'norm_topk_prob'"),
    ],
)
def test_deepseek_routing_the_loader_does_not_compute_is_refused(
    tmp_path: Path, changes: dict[str, object], match: str
) -> None:
    directory = copy_checkpoint(FIXTURES / "deepseek_v3_fp8", tmp_path / "deepseek")
    edit_config(directory, **changes)
    with pytest.raises((UnsupportedCheckpoint, ValueError), match=match):
        MoeCheckpoint(directory)


_BASE = MoeCheckpoint(CT_NVFP4).runner_config()


@pytest.mark.parametrize(
    ("config", "named"),
    [
        (attrs.evolve(_BASE, activation=Activation.GELU_GATED), "activation <Activation.GELU_GATED: 'gelu'> (the checkpoint's"),
        (attrs.evolve(_BASE, routed_scaling_factor=2.0), "routed_scaling_factor 2.0 (the checkpoint's: 1.0)"),
        (attrs.evolve(_BASE, routing_method=RoutingMethod.SOFTMAX_TOPK), "routing_method"),
    ],
    ids=["activation", "scaling", "routing"],
)
def test_a_config_that_describes_another_layer_is_refused(config: MoeRunnerConfig, named: str) -> None:
    """Only this rank's experts are the caller's to say; a config that computes another layer than the checkpoint's
    is named before a tensor is read (it ran with the caller's activation or scaling before)."""
    checkpoint = MoeCheckpoint(CT_NVFP4)
    with pytest.raises(ValueError, match=re.escape(named)):
        checkpoint.load_layer(0, config=config)
    ranked = checkpoint.runner_config(num_local_experts=4, local_expert_offset=4)
    assert checkpoint.load_layer(0, config=ranked).config == ranked


def test_a_deepseek_checkpoint_without_its_correction_bias_is_refused(tmp_path: Path) -> None:
    """DeepSeek-V3's noaux_tc routing chooses with e_score_correction_bias; a checkpoint saved without it routed
    without it, a quarter of the tokens to other experts (0.66 off, found by an adversarial pass)."""
    directory = copy_checkpoint(FIXTURES / "deepseek_v3_fp8", tmp_path / "deepseek")
    assert MoeCheckpoint(directory).router(1).score_correction_bias is not None
    path = directory / "model.safetensors"
    tensors = load_file(str(path))
    del tensors["model.layers.1.mlp.gate.e_score_correction_bias"]
    save_file(tensors, str(path), metadata={"format": "pt"})
    with pytest.raises(ValueError, match=r"model.layers.1.mlp.gate.e_score_correction_bias: not in .*noaux_tc chooses"):
        MoeCheckpoint(directory).router(1)


def test_a_checkpoints_config_is_read_only() -> None:
    """An override written into ``MoeCheckpoint.config`` after opening (``norm_topk_prob = False``) was silently
    ignored: the layer's routing had been taken as the checkpoint was opened (adversarial pass 4, c21; mypy rejects
    the write, a program without types ran it)."""
    checkpoint = MoeCheckpoint(FIXTURES / "qwen3_moe_bf16")
    with pytest.raises(TypeError, match="does not support item assignment"):
        checkpoint.config["norm_topk_prob"] = False  # type: ignore[index]  # the runtime check under test
    copied = pickle.loads(pickle.dumps(checkpoint.config))  # copies and pickles (a mappingproxy did neither)
    assert dict(copy.deepcopy(checkpoint.config)) == dict(copied) == dict(checkpoint.config)


def test_the_shared_expert_of_a_deepseek_layer_is_read_beside_its_routed_experts(gen: torch.Generator) -> None:
    """Silent at the documentation level (adversarial pass 13, c06): ``load_layer`` of a DeepSeek-V3 layer computes
    its routed experts only, and nothing read or named ``mlp.shared_experts`` (0.33-0.53 off transformers' block).
    ``shared_expert(layer)`` reads it, 128x128-block FP8 dequantized; layers of architectures without one give None."""
    directory = FIXTURES / "deepseek_v3_fp8"
    checkpoint = MoeCheckpoint(directory)
    layer = checkpoint.moe_layers()[0]
    shared = checkpoint.shared_expert(layer)
    assert shared is not None and shared.w13.dtype == checkpoint.dtype
    tensors = read_tensors(directory)
    prefix = f"model.layers.{layer}.mlp.shared_experts"

    def dequantized(projection: str) -> torch.Tensor:
        codes, scale = tensors[f"{prefix}.{projection}.weight"], tensors[f"{prefix}.{projection}.weight_scale_inv"]
        grid = scale.repeat_interleave(128, 0)[: codes.shape[0]].repeat_interleave(128, 1)[:, : codes.shape[1]]
        return codes.double() * grid.double()

    gate, up, down = (dequantized(p) for p in ("gate_proj", "up_proj", "down_proj"))
    assert torch.equal(shared.w13.double(), torch.cat((gate, up)).to(checkpoint.dtype).double())
    x = torch.randn(5, checkpoint.hidden_size, generator=gen, dtype=torch.float64)
    want = (torch.nn.functional.silu(x @ gate.T) * (x @ up.T)) @ down.T
    got = shared(x.to(checkpoint.dtype)).double()
    assert float((got - want).abs().max() / want.abs().max()) <= 2e-2  # bf16 weights and activations
    assert MoeCheckpoint(CT_NVFP4).shared_expert(0) is None


@pytest.mark.parametrize("per_channel", [True, False], ids=["per-channel", "per-tensor"])
def test_a_shared_expert_in_compressed_tensors_fp8_is_read_and_named_by_check(
    tmp_path: Path, gen: torch.Generator, per_channel: bool
) -> None:
    """False refusal (adversarial pass 14, c06): ``moe-core check --checkpoint`` read the shared expert only to say
    the layer has one, and a compressed-tensors FP8 shared expert (``weight_scale``, ``input_scale``) failed that read,
    throwing the routed experts' check away. The check looks at the names now, and such a shared expert is read."""
    source = FIXTURES / "deepseek_v3_fp8"
    tensors = load_file(str(source / "model.safetensors"))
    layer = MoeCheckpoint(source).moe_layers()[0]
    prefix = f"model.layers.{layer}.mlp.shared_experts"
    want = {}
    for projection in ("gate_proj", "up_proj", "down_proj"):
        rows, cols = tensors.pop(f"{prefix}.{projection}.weight").shape
        tensors.pop(f"{prefix}.{projection}.weight_scale_inv")
        values = torch.randn(rows, cols, generator=gen) / cols**0.5
        scale = (values.abs().amax(dim=1, keepdim=True) if per_channel else values.abs().amax().reshape(1)) / 448
        codes = (values / scale).to(torch.float8_e4m3fn)
        tensors[f"{prefix}.{projection}.weight"] = codes
        tensors[f"{prefix}.{projection}.weight_scale"] = scale
        tensors[f"{prefix}.{projection}.input_scale"] = torch.tensor([0.05])
        want[projection] = codes.double() * scale.double()
    target = tmp_path / "deepseek_ct_fp8_shared"
    target.mkdir()
    (target / "config.json").write_text((source / "config.json").read_text())
    save_file(tensors, str(target / "model.safetensors"), metadata={"format": "pt"})
    checkpoint = MoeCheckpoint(target)
    shared = checkpoint.shared_expert(layer)
    assert shared is not None
    wanted_w13 = torch.cat((want["gate_proj"], want["up_proj"])).to(checkpoint.dtype)
    assert torch.equal(shared.w13, wanted_w13) and torch.equal(shared.w2, want["down_proj"].to(checkpoint.dtype))
    result = subprocess.run(
        [sys.executable, "-m", "moe_core", "check", "--checkpoint", str(target), "--tokens", "8", "--iters", "1"],
        capture_output=True, text=True, timeout=600,
    )
    assert result.returncode == 0, result.stderr
    assert "also has a shared expert" in result.stdout


@pytest.mark.parametrize(
    ("fixture", "backend"),
    [
        ("qwen3_moe_fp8", "reference-fp8"), ("qwen3_moe_fp8", "triton-fp8"),
        ("qwen3_moe_fp8_dynamic", "reference-fp8-channel"), ("qwen3_moe_fp8_dynamic", "triton-fp8"),
        ("deepseek_v3_fp8", "reference-fp8-block"), ("deepseek_v3_fp8", "triton-fp8-block"),
    ],
)
def test_fp8_layers_travel_through_plain_pickle(fixture: str, backend: str, gen: torch.Generator) -> None:
    """Raw (adversarial pass 14, c04): ``pickle.loads`` of any FP8 layer failed inside torch ("UntypedStorage has no
    attribute 'dtype'": torch 2.13 unpickles no float8 storage), in the receiving process. FP8 codes travel as bytes
    and are built again through their constructors."""
    checkpoint = MoeCheckpoint(FIXTURES / fixture)
    layer = checkpoint.moe_layers()[0]
    scheme = checkpoint.load_layer(layer, backend=backend, keep_canonical=True)
    assert isinstance(scheme, ExpertScheme) and isinstance(scheme.forward, BoundRunner)
    x = torch.randn(3, checkpoint.hidden_size, generator=gen).to(torch.bfloat16)
    dispatch = StandardDispatchOutput(x, route(x, checkpoint.router(layer), scheme.config))
    forward, weights = pickle.loads(pickle.dumps((scheme.forward, scheme.weights)))
    assert torch.equal(forward(dispatch), scheme.forward(dispatch))
    fp8 = (Fp8MoeWeights, Fp8ChannelMoeWeights, Fp8BlockMoeWeights)
    assert isinstance(weights, fp8) and isinstance(scheme.weights, fp8) and type(weights) is type(scheme.weights)
    assert torch.equal(weights.w2.codes.view(torch.uint8), scheme.weights.w2.codes.view(torch.uint8))


@pytest.mark.parametrize(
    "fixture",
    ["qwen3_moe_bf16", "qwen3_moe_nvfp4", "qwen3_moe_fp8", "qwen3_moe_fp8_dynamic", "deepseek_v3_fp8", "gpt_oss_mxfp4"],
)
def test_every_loaded_scheme_travels_through_plain_pickle(fixture: str, gen: torch.Generator) -> None:
    """Raw (adversarial pass 15, c03): the FP8-dynamic and gpt-oss schemes held their parameter layouts as lambdas,
    so pickling a loaded layer failed with "Can't pickle <lambda>"; the copy computes what the original does."""
    checkpoint = MoeCheckpoint(FIXTURES / fixture)
    layer = checkpoint.moe_layers()[0]
    scheme = checkpoint.load_layer(layer)
    copied = pickle.loads(pickle.dumps(scheme))
    x = torch.randn(3, checkpoint.hidden_size, generator=gen).to(torch.bfloat16)
    dispatch = StandardDispatchOutput(x, route(x, checkpoint.router(layer), scheme.config))
    assert torch.equal(copied.apply(dispatch), scheme.apply(dispatch))


def _deepseek_shared_expert_edited(
    tmp_path: Path, name: str, edit: Callable[[torch.Tensor], torch.Tensor] | None
) -> tuple[Path, int]:
    """The DeepSeek-V3 FP8 fixture with its first MoE layer's shared-expert tensor ``name`` edited (None: deleted),
    and that layer."""
    source = FIXTURES / "deepseek_v3_fp8"
    tensors = load_file(str(source / "model.safetensors"))
    layer = MoeCheckpoint(source).moe_layers()[0]
    key = f"model.layers.{layer}.mlp.shared_experts.{name}"
    if edit is None:
        del tensors[key]
    else:
        tensors[key] = edit(tensors[key])
    target = tmp_path / "deepseek_edited"
    target.mkdir()
    (target / "config.json").write_text((source / "config.json").read_text())
    save_file(tensors, str(target / "model.safetensors"), metadata={"format": "pt"})
    return target, layer


def test_fp8_shared_expert_codes_without_their_scale_are_refused(tmp_path: Path) -> None:
    """Silent (adversarial pass 15, c06): FP8 shared-expert codes without a scale were read with scale 1 (896-1410
    off); a routed expert missing the same tensor is refused by name, and so is the shared expert now."""
    target, layer = _deepseek_shared_expert_edited(tmp_path, "up_proj.weight_scale_inv", None)
    with pytest.raises(ValueError, match=r"shared_experts\.up_proj\.weight: FP8 codes without their weight_scale"):
        MoeCheckpoint(target).shared_expert(layer)


def test_a_shared_expert_projection_of_another_fp8_dtype_is_named_by_its_tensor(tmp_path: Path) -> None:
    """Adversarial pass 16, c05 b: an e5m2 shared projection was refused by the FP8 type's own message, naming no
    checkpoint tensor (the README promises the name)."""
    target, layer = _deepseek_shared_expert_edited(tmp_path, "down_proj.weight", lambda codes: codes.float().to(torch.float8_e5m2))
    with pytest.raises(TypeError, match=rf"^model\.layers\.{layer}\.mlp\.shared_experts\.down_proj: .*float8_e4m3fn"):
        MoeCheckpoint(target).shared_expert(layer)


@pytest.mark.parametrize("dtype_name", ["float16", "float32"])
def test_a_layer_is_chosen_for_the_checkpoints_own_dtype(tmp_path: Path, dtype_name: str) -> None:
    """Adversarial pass 16, c02: an fp16 or fp32 checkpoint's layer was chosen for bf16 hidden states, so a bf16-only
    kernel won and its own hidden states were then refused. ``load_layer`` asks for the checkpoint's dtype, or the
    one named."""
    directory = copy_checkpoint(FIXTURES / "qwen3_moe_fp8", tmp_path / "checkpoint")
    edit_config(directory, dtype=dtype_name)
    checkpoint = MoeCheckpoint(directory)
    layer = checkpoint.load_layer(0)
    assert isinstance(layer, ExpertScheme) and layer.activation_dtype == checkpoint.dtype == getattr(torch, dtype_name)
    x = torch.randn(3, checkpoint.hidden_size).to(checkpoint.dtype)
    out = layer.apply(StandardDispatchOutput(x, route(x, checkpoint.router(0), layer.config)))
    assert out.dtype == checkpoint.dtype and bool(out.isfinite().all())
    bf16 = checkpoint.load_layer(0, activation_dtype=torch.bfloat16)
    assert isinstance(bf16, ExpertScheme) and bf16.activation_dtype == torch.bfloat16


def test_the_scheme_is_read_from_the_config_group_that_targets_the_experts(tmp_path: Path) -> None:
    """Adversarial pass 16, c10: a mixed-precision compressed-tensors config (dynamic FP8 for the experts, static
    per-tensor FP8 for attention) was read by its first group that any scheme takes, the attention's, and the experts'
    per-channel scales were then refused as per-tensor ones; experts left unquantized by ``ignore`` were refused by
    dtype. The experts' own group is read now, and ``ignore`` over experts is named."""
    directory = copy_checkpoint(FIXTURES / "qwen3_moe_fp8_dynamic", tmp_path / "mixed")
    config = json.loads((directory / "config.json").read_text())
    quantization = config["quantization_config"]
    experts = dict(quantization["config_groups"]["group_0"], targets=["re:.*mlp.experts.*"])
    attention = copy.deepcopy(json.loads((FIXTURES / "qwen3_moe_fp8" / "config.json").read_text())["quantization_config"]["config_groups"]["group_0"])
    attention["targets"] = ["re:.*self_attn.*"]
    edit_config(directory, quantization_config=dict(quantization, config_groups={"attention": attention, "experts": experts}))
    checkpoint = MoeCheckpoint(directory)
    assert checkpoint.scheme().name == "compressed-tensors-fp8-dynamic"
    layer = checkpoint.load_layer(0)
    x = torch.randn(3, checkpoint.hidden_size).to(checkpoint.dtype)
    assert layer.apply(StandardDispatchOutput(x, route(x, checkpoint.router(0), layer.config))).isfinite().all()

    static = copy_checkpoint(FIXTURES / "qwen3_moe_fp8", tmp_path / "ignored")
    quantization = json.loads((static / "config.json").read_text())["quantization_config"]
    edit_config(static, quantization_config=dict(quantization, ignore=["lm_head", "re:model\\.layers\\.0\\.mlp\\.experts\\..*"]))
    with pytest.raises(UnsupportedCheckpoint, match=r"quantization_config.ignore leaves \d+ of \d+ expert projections unquantized \(model\.layers\.0\.mlp\.experts\."):
        MoeCheckpoint(static).scheme()

    attention_only = copy_checkpoint(FIXTURES / "qwen3_moe_bf16", tmp_path / "attention_only")
    edit_config(attention_only, quantization_config=dict(quantization, ignore=["lm_head", "re:.*mlp\\.experts.*"]))
    checkpoint = MoeCheckpoint(attention_only)
    assert checkpoint.scheme().name == "unquantized"  # every expert ignored: the experts are unquantized (c20 v2)
    layer = checkpoint.load_layer(0)
    x = torch.randn(3, checkpoint.hidden_size).to(checkpoint.dtype)
    assert layer.apply(StandardDispatchOutput(x, route(x, checkpoint.router(0), layer.config))).isfinite().all()


def test_shared_experts_missing_where_the_config_counts_them_are_refused(tmp_path: Path) -> None:
    """Silent (adversarial pass 21, a02): a DeepSeek-V3 checkpoint whose config says ``n_shared_experts: 1`` without
    its ``shared_experts`` tensors gave no shared expert, 0.58 off its model. Refused by name."""
    copy = copy_checkpoint(FIXTURES / "deepseek_v3_fp8", tmp_path / "deepseek")
    checkpoint = MoeCheckpoint(copy)
    layer = checkpoint.moe_layers()[0]
    keys = checkpoint.shared_expert_keys(layer)
    assert keys and checkpoint.shared_expert(layer) is not None
    tensors = load_file(copy / "model.safetensors")
    save_file({key: value for key, value in tensors.items() if key not in keys}, copy / "model.safetensors")
    with pytest.raises(ValueError, match=r"shared_experts: not in .*n_shared_experts=1 adds it to every token"):
        MoeCheckpoint(copy).shared_expert(layer)
