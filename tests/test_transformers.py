"""moe-core's routing and experts against transformers' own MoE blocks and models (tiny random configs, CPU, float32).

Each family's block is built from a tiny config, its parameters drawn at
random (biases and DeepSeek's correction bias included, so every term
counts), then swapped: the swapped block must match the original within
1e-5 relative error; so must other readings of a family's config
(VARIANTS), and readings moe-core does not compute must be refused
(REFUSED). Four whole models must keep their logits within 1e-5 and their
32 greedy tokens. docs/transformers-families.md reports the errors measured.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.nn.utils import prune

transformers = pytest.importorskip("transformers")

from moe_core import StandardDispatchOutput  # noqa: E402
from moe_core.config import HIDDEN_ACTS  # noqa: E402
from moe_core.checkpoint import MoeCheckpoint  # noqa: E402
from moe_core.integrations.transformers import FAMILIES, MoeCoreBlock, swap_moe_blocks  # noqa: E402
from moe_core.layer import MoeLayer  # noqa: E402
from moe_core.registry import BackendSelectionError  # noqa: E402
from moe_core.routing import Router, route  # noqa: E402
from tests.devices import DEVICES  # noqa: E402

pytestmark = pytest.mark.transformers

TOLERANCE = 1e-5
ATTENTION = {"num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 64, "max_position_embeddings": 128}
MHA = {**ATTENTION, "num_key_value_heads": 4}


def _deepseek_sizes() -> dict[str, object]:
    return {
        "hidden_size": 32, "intermediate_size": 48, "moe_intermediate_size": 16, "num_attention_heads": 4,
        "num_key_value_heads": 4, "vocab_size": 64, "max_position_embeddings": 128, "n_shared_experts": 1,
        "n_routed_experts": 8, "n_group": 4, "topk_group": 2, "num_experts_per_tok": 3, "first_k_dense_replace": 0,
        "routed_scaling_factor": 2.5, "kv_lora_rank": 16, "q_lora_rank": 16, "qk_rope_head_dim": 8,
        "qk_nope_head_dim": 8, "v_head_dim": 8, "norm_topk_prob": True,
    }


CONFIGS: dict[str, Callable[..., object]] = {
    "mixtral": lambda **more: transformers.MixtralConfig(
        hidden_size=32, intermediate_size=16, num_local_experts=4, num_experts_per_tok=2, **ATTENTION, **more
    ),
    "qwen2_moe": lambda **more: transformers.Qwen2MoeConfig(
        hidden_size=32, intermediate_size=48, moe_intermediate_size=16, shared_expert_intermediate_size=24,
        num_experts=8, num_experts_per_tok=3, norm_topk_prob=False, **ATTENTION, **more
    ),
    "qwen3_moe": lambda **more: transformers.Qwen3MoeConfig(
        hidden_size=32, intermediate_size=48, moe_intermediate_size=16, num_experts=8, num_experts_per_tok=2,
        norm_topk_prob=True, head_dim=8, **ATTENTION, **more
    ),
    "olmoe": lambda **more: transformers.OlmoeConfig(
        hidden_size=32, intermediate_size=16, num_experts=8, num_experts_per_tok=2, **ATTENTION, **more
    ),
    "granitemoe": lambda **more: transformers.GraniteMoeConfig(
        hidden_size=32, intermediate_size=16, num_local_experts=4, num_experts_per_tok=2, **ATTENTION, **more
    ),
    "granitemoeshared": lambda **more: transformers.GraniteMoeSharedConfig(
        hidden_size=32, intermediate_size=16, shared_intermediate_size=24, num_local_experts=4,
        num_experts_per_tok=2, **ATTENTION, **more
    ),
    "dbrx": lambda **more: transformers.DbrxConfig(
        d_model=32, n_heads=4, vocab_size=64, max_seq_len=128,
        ffn_config={"ffn_hidden_size": 16, "moe_num_experts": 4, "moe_top_k": 2},
        attn_config={"kv_n_heads": 2}, **more,
    ),
    "deepseek_v3": lambda **more: transformers.DeepseekV3Config(**_deepseek_sizes(), **more),
    "glm4_moe": lambda **more: transformers.Glm4MoeConfig(
        hidden_size=32, intermediate_size=48, moe_intermediate_size=16, n_shared_experts=1, n_routed_experts=8,
        n_group=2, topk_group=1, num_experts_per_tok=2, first_k_dense_replace=0, routed_scaling_factor=1.5,
        head_dim=8, **ATTENTION, **more
    ),
    "gpt_oss": lambda **more: transformers.GptOssConfig(
        hidden_size=32, intermediate_size=16, num_local_experts=4, num_experts_per_tok=2, head_dim=8, **ATTENTION, **more
    ),
    "phimoe": lambda **more: transformers.PhimoeConfig(
        hidden_size=32, intermediate_size=16, num_local_experts=4, num_experts_per_tok=2, **ATTENTION, **more
    ),
    "llama4": lambda **more: transformers.Llama4TextConfig(
        hidden_size=32, intermediate_size=16, intermediate_size_mlp=48, num_local_experts=4, num_experts_per_tok=1,
        head_dim=8, **ATTENTION, **more
    ),
    "granitemoehybrid": lambda **more: transformers.GraniteMoeHybridConfig(
        hidden_size=32, intermediate_size=16, num_local_experts=4, num_experts_per_tok=2, mamba_n_heads=8,
        mamba_d_head=8, **ATTENTION, **more
    ),
    "granitemoe_swa": lambda **more: transformers.GraniteMoeSWAConfig(
        hidden_size=32, intermediate_size=16, num_local_experts=4, num_experts_per_tok=2, **ATTENTION, **more
    ),
    "deepseek_v2": lambda **more: transformers.DeepseekV2Config(
        **{**_deepseek_sizes(), "n_group": None, "topk_group": None, "routed_scaling_factor": 1.5}, **more
    ),
    "minimax": lambda **more: transformers.MiniMaxConfig(
        hidden_size=32, intermediate_size=16, num_local_experts=4, num_experts_per_tok=2, head_dim=8, **ATTENTION, **more
    ),
    "qwen3_next": lambda **more: transformers.Qwen3NextConfig(
        hidden_size=32, intermediate_size=48, moe_intermediate_size=16, shared_expert_intermediate_size=24,
        num_experts=8, num_experts_per_tok=2, norm_topk_prob=True, head_dim=8, **ATTENTION, **more
    ),
    "qwen3_5_moe": lambda **more: transformers.Qwen3_5MoeTextConfig(
        hidden_size=32, moe_intermediate_size=16, shared_expert_intermediate_size=24, num_experts=8,
        num_experts_per_tok=2, head_dim=8, **ATTENTION, **more
    ),
    "qwen3_vl_moe": lambda **more: transformers.Qwen3VLMoeTextConfig(
        hidden_size=32, intermediate_size=48, moe_intermediate_size=16, num_experts=8, num_experts_per_tok=2,
        head_dim=8, **ATTENTION, **more
    ),
    "flex_olmo": lambda **more: transformers.FlexOlmoConfig(
        hidden_size=32, intermediate_size=16, num_experts=8, num_experts_per_tok=2, norm_topk_prob=False,
        **ATTENTION, **more
    ),
    "jamba": lambda **more: transformers.JambaConfig(
        hidden_size=32, intermediate_size=16, num_experts=4, num_experts_per_tok=2, **ATTENTION, **more
    ),
    "glm4v_moe": lambda **more: transformers.Glm4vMoeTextConfig(
        hidden_size=32, intermediate_size=48, moe_intermediate_size=16, n_shared_experts=1, n_routed_experts=8,
        n_group=2, topk_group=1, num_experts_per_tok=2, routed_scaling_factor=1.5, head_dim=8, **ATTENTION, **more
    ),
    "dots1": lambda **more: transformers.Dots1Config(
        hidden_size=32, intermediate_size=48, moe_intermediate_size=16, n_shared_experts=2, n_routed_experts=8,
        n_group=4, topk_group=2, num_experts_per_tok=3, routed_scaling_factor=2.0, head_dim=8, **ATTENTION, **more
    ),
    "nemotron_h": lambda **more: transformers.NemotronHConfig(
        hidden_size=32, moe_intermediate_size=16, moe_shared_expert_intermediate_size=24, n_routed_experts=8,
        num_experts_per_tok=2, n_group=2, topk_group=1, routed_scaling_factor=1.5, head_dim=8, **ATTENTION, **more
    ),
    # Copies of a covered family's block under another name.
    "qwen4_exp": lambda **more: transformers.Qwen4ExpTextConfig(
        hidden_size=32, moe_intermediate_size=16, shared_expert_intermediate_size=24, num_experts=8,
        num_experts_per_tok=3, norm_topk_prob=False, head_dim=8, **ATTENTION, **more
    ),
    "mellum": lambda **more: transformers.MellumConfig(
        hidden_size=32, intermediate_size=48, moe_intermediate_size=16, num_local_experts=8, num_experts_per_tok=2,
        head_dim=8, **ATTENTION, **more
    ),
    "qwen3_omni_moe": lambda **more: transformers.Qwen3OmniMoeTextConfig(
        hidden_size=32, intermediate_size=48, moe_intermediate_size=16, num_experts=8, num_experts_per_tok=3,
        norm_topk_prob=False, head_dim=8, **ATTENTION, **more
    ),
    "qwen3_omni_moe_talker": lambda **more: transformers.Qwen3OmniMoeTalkerTextConfig(
        hidden_size=32, intermediate_size=48, moe_intermediate_size=16, shared_expert_intermediate_size=24,
        num_experts=8, num_experts_per_tok=3, norm_topk_prob=True, head_dim=8, **ATTENTION, **more
    ),
    "lara_mini": lambda **more: transformers.LaraMiniConfig(
        hidden_size=32, moe_intermediate_size=16, shared_expert_intermediate_size=24, num_experts=8,
        num_experts_per_tok=3, norm_topk_prob=True, head_dim=8, **ATTENTION, **more
    ),
    "bailing_hybrid": lambda **more: transformers.BailingHybridConfig(
        hidden_size=32, intermediate_size=48, moe_intermediate_size=16, num_shared_experts=1, num_experts=8,
        num_expert_group=4, topk_group=2, num_experts_per_token=3, routed_scaling_factor=2.5, head_dim=8,
        **ATTENTION, **more
    ),
    "deepseek_v32": lambda **more: transformers.DeepseekV32Config(**_deepseek_sizes(), **more),
    "dots3_note": lambda **more: transformers.Dots3NoteTextConfig(
        hidden_size=32, intermediate_size=48, moe_intermediate_size=16, shared_experts_intermediate_size=24,
        n_shared_experts=1, n_routed_experts=8, n_group=4, topk_group=2, num_experts_per_tok=3,
        routed_scaling_factor=2.0, head_dim=8, **MHA, **more
    ),
    "exaone_moe": lambda **more: transformers.ExaoneMoeConfig(
        hidden_size=32, intermediate_size=48, moe_intermediate_size=16, num_experts=8, num_experts_per_tok=3,
        num_shared_experts=1, n_group=4, topk_group=2, routed_scaling_factor=2.5, head_dim=8, **ATTENTION, **more
    ),
    "glm4_moe_lite": lambda **more: transformers.Glm4MoeLiteConfig(**_deepseek_sizes(), **more),
    "glm_moe_dsa": lambda **more: transformers.GlmMoeDsaConfig(**_deepseek_sizes(), **more),
    "kimi_linear": lambda **more: transformers.KimiLinearConfig(
        hidden_size=32, intermediate_size=48, moe_intermediate_size=16, num_shared_experts=1, num_experts=8,
        num_expert_group=4, topk_group=2, num_experts_per_token=3, routed_scaling_factor=2.5, head_dim=8,
        **ATTENTION, **more
    ),
    "mimo_v2_flash": lambda **more: transformers.MiMoV2FlashConfig(
        hidden_size=32, intermediate_size=48, moe_intermediate_size=16, n_routed_experts=8, n_group=4, topk_group=2,
        num_experts_per_tok=3, routed_scaling_factor=1.5, head_dim=8, **ATTENTION, **more
    ),
    "solar_open": lambda **more: transformers.SolarOpenConfig(
        hidden_size=32, moe_intermediate_size=16, n_shared_experts=1, n_routed_experts=8, n_group=4, topk_group=2,
        num_experts_per_tok=3, routed_scaling_factor=1.5, head_dim=8, **ATTENTION, **more
    ),
    "deepseek_ocr2": lambda **more: transformers.DeepseekOcr2TextConfig(
        hidden_size=32, intermediate_size=48, moe_intermediate_size=16, n_routed_experts=8, n_shared_experts=1,
        num_experts_per_tok=3, routed_scaling_factor=1.5, head_dim=8, **ATTENTION, **more
    ),
    "unlimited_ocr": lambda **more: transformers.UnlimitedOcrTextConfig(
        hidden_size=32, intermediate_size=48, moe_intermediate_size=16, n_routed_experts=8, n_shared_experts=2,
        num_experts_per_tok=3, routed_scaling_factor=1.5, head_dim=8, **ATTENTION, **more
    ),
    # Routing and experts moe-core computes, read from their own block layouts.
    "axk1": lambda **more: transformers.AXK1Config(**_deepseek_sizes(), **more),
    "axk2": lambda **more: transformers.AXK2Config(
        **{**_deepseek_sizes(), "n_group": None, "topk_group": None}, **more
    ),
    "afmoe": lambda **more: transformers.AfmoeConfig(
        hidden_size=32, intermediate_size=48, moe_intermediate_size=16, num_experts=8, num_experts_per_tok=3,
        num_shared_experts=1, route_scale=2.0, head_dim=8, **ATTENTION, **more
    ),
    "aria": lambda **more: transformers.AriaTextConfig(
        hidden_size=32, intermediate_size=16, moe_num_experts=4, moe_topk=2, moe_num_shared_experts=2,
        hidden_act="gelu_pytorch_tanh", head_dim=8, **ATTENTION, **more
    ),
    "beam": lambda **more: transformers.BeamConfig(
        hidden_size=32, intermediate_size=48, moe_intermediate_size=16, num_experts=8, num_experts_per_tok=3,
        n_group=4, topk_group=2, routed_scaling_factor=2.5, head_dim=8, **ATTENTION, **more
    ),
    "cohere2_moe": lambda **more: transformers.Cohere2MoeConfig(
        hidden_size=32, intermediate_size=16, num_experts=8, num_experts_per_tok=3, num_shared_experts=1,
        shared_expert_combination_strategy="average", expert_selection_fn="sigmoid", norm_topk_prob=True,
        head_dim=8, **ATTENTION, **more
    ),
    "ernie4_5_moe": lambda **more: transformers.Ernie4_5_MoeConfig(
        hidden_size=32, intermediate_size=48, moe_intermediate_size=16, moe_num_experts=8, moe_k=3,
        moe_num_shared_experts=2, moe_layer_start_index=0, head_dim=8, **ATTENTION, **more
    ),
    "flint": lambda **more: transformers.FlintConfig(
        hidden_size=32, moe_intermediate_size=16, shared_expert_intermediate_size=24, num_experts=8,
        num_experts_per_tok=3, norm_topk_prob=True, head_dim=8, **ATTENTION, **more
    ),
    "hunyuan_v1_moe": lambda **more: transformers.HunYuanMoEV1Config(
        hidden_size=32, intermediate_size=16, num_experts=4, moe_topk=2, head_dim=8, **ATTENTION, **more
    ),
    "hy_v3": lambda **more: transformers.HYV3Config(
        hidden_size=32, intermediate_size=48, moe_intermediate_size=16, num_experts=8, num_experts_per_tok=3,
        num_shared_experts=1, router_scaling_factor=2.5, head_dim=8, **ATTENTION, **more
    ),
    "jetmoe": lambda **more: transformers.JetMoeConfig(
        hidden_size=32, intermediate_size=16, num_local_experts=4, num_experts_per_tok=2, kv_channels=8,
        num_key_value_heads=4, vocab_size=64, **more
    ),
    "laguna": lambda **more: transformers.LagunaConfig(
        hidden_size=32, intermediate_size=48, moe_intermediate_size=16, shared_expert_intermediate_size=24,
        num_experts=8, num_experts_per_tok=3, moe_routed_scaling_factor=2.0, head_dim=8, **ATTENTION, **more
    ),
    "lfm2_moe": lambda **more: transformers.Lfm2MoeConfig(
        hidden_size=32, intermediate_size=48, moe_intermediate_size=16, num_experts=8, num_experts_per_tok=3,
        use_expert_bias=True, routed_scaling_factor=1.5, norm_topk_prob=True, **ATTENTION, **more
    ),
    "minimax_m2": lambda **more: transformers.MiniMaxM2Config(
        hidden_size=32, intermediate_size=16, num_local_experts=8, num_experts_per_tok=3, head_dim=8,
        **ATTENTION, **more
    ),
    "minimax_m3_vl": lambda **more: transformers.MiniMaxM3VLTextConfig(
        hidden_size=32, intermediate_size=16, dense_intermediate_size=48, shared_intermediate_size=24,
        num_local_experts=8, num_experts_per_tok=3, routed_scaling_factor=2.0, head_dim=8, **ATTENTION, **more
    ),
    "mistral4": lambda **more: transformers.Mistral4Config(
        **{**_deepseek_sizes(), "n_group": 2, "topk_group": 2, "norm_topk_prob": False}, **more
    ),
    "mistral_large4": lambda **more: transformers.MistralLarge4TextConfig(
        **{**_deepseek_sizes(), "n_group": 1, "topk_group": 1, "routed_scaling_factor": 1.5}, **more
    ),
    "openai_privacy_filter": lambda **more: transformers.OpenAIPrivacyFilterConfig(
        hidden_size=32, intermediate_size=16, num_local_experts=4, num_experts_per_tok=2, head_dim=8,
        **ATTENTION, **more
    ),
    "step3p7": lambda **more: transformers.Step3p7TextConfig(
        hidden_size=32, intermediate_size=48, moe_intermediate_size=16, share_expert_dim=24, n_routed_experts=8,
        num_experts_per_tok=3, moe_router_scaling_factor=2.0, head_dim=8, **ATTENTION, **more
    ),
    "glm5_next": lambda **more: transformers.Glm5NextTextConfig(
        **{**_deepseek_sizes(), "num_local_experts": 8, "swiglu_limit": 0.5, "qk_rope_head_dim": 0}, **more
    ),
    "hy_v4": lambda **more: transformers.HYV4Config(
        **{**_deepseek_sizes(), "num_local_experts": 8, "swiglu_limit": 0.5}, **more
    ),
    "hy_v4_vl": lambda **more: transformers.HYV4VLTextConfig(
        **{**_deepseek_sizes(), "num_local_experts": 8, "swiglu_limit": 0.5,
           "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 1, 1]}}, **more
    ),
}
"""A tiny config per covered family."""

MODULES = {"qwen3_omni_moe_talker": "qwen3_omni_moe"}
"""The model type whose modeling module holds a family's block, where the family is named otherwise."""

BLOCK_ARGS: dict[str, tuple[int, ...]] = {"step3p7": (0,)}
"""Arguments a family's block takes after its config (a layer index)."""

CLAMPED = {"gpt_oss", "minimax_m3_vl", "openai_privacy_filter"}
"""Families whose clamped SwiGLU needs inputs large enough to reach the clamp."""

MODELS = {
    "mixtral": "MixtralForCausalLM",
    "qwen3_moe": "Qwen3MoeForCausalLM",
    "deepseek_v3": "DeepseekV3ForCausalLM",
    "gpt_oss": "GptOssForCausalLM",
}
"""The families checked as whole models."""

BLOCKS = {family.name: name for name, family in FAMILIES.items()}


def _randomize(module: nn.Module, gen: torch.Generator, std: float) -> None:
    """Every parameter and buffer (router biases, DeepSeek's correction bias) drawn at random."""
    with torch.no_grad():
        for tensor in [*module.parameters(), *module.buffers()]:
            if tensor.is_floating_point():
                tensor.copy_(torch.randn(tensor.shape, generator=gen) * std)


def _config(family: str, **overrides: object) -> object:
    """The family's tiny config, with ``overrides`` set on it."""
    config = CONFIGS[family]()
    for name, value in overrides.items():
        setattr(config, name, value)
    return config


def _block(family: str, gen: torch.Generator, **overrides: object) -> nn.Module:
    """The family's block class, found in its modeling module, on the tiny config, random and in eval mode."""
    config = _config(family, **overrides)
    module = MODULES.get(family, family)
    modeling = __import__(f"transformers.models.{module}.modeling_{module}", fromlist=["_"])
    block: nn.Module = getattr(modeling, BLOCKS[family])(config, *BLOCK_ARGS.get(family, ()))
    _randomize(block, gen, 0.2)
    return block.eval()


def _relative_error(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got - want).abs().max() / want.abs().max())


class _Holder(nn.Module):
    """A model around one block, for swap_moe_blocks."""

    def __init__(self, block: nn.Module, config: object) -> None:
        super().__init__()
        self.config = config
        self.mlp = block


VARIANTS: dict[str, tuple[str, dict[str, object]]] = {
    "cohere2_moe/softmax,sum": (
        "cohere2_moe", {"expert_selection_fn": "softmax", "shared_expert_combination_strategy": "sum"}
    ),
    "lfm2_moe/no expert bias": ("lfm2_moe", {"use_expert_bias": False, "norm_topk_prob": False}),
    "mistral4/dropped groups": ("mistral4", {"n_group": 4, "topk_group": 2}),
    "mistral_large4/dropped groups": ("mistral_large4", {"n_group": 4, "topk_group": 2}),
    "deepseek_v2/group-limited greedy": (
        "deepseek_v2", {"topk_method": "group_limited_greedy", "n_group": 4, "topk_group": 2}
    ),
    "ernie4_5_moe/no shared expert": ("ernie4_5_moe", {"moe_num_shared_experts": 0}),
    "step3p7/swiglu limits": ("step3p7", {"swiglu_limits": [0.5] * 2, "swiglu_limits_shared": [0.7] * 2}),
    "step3p7/shared expert limited only": ("step3p7", {"swiglu_limits_shared": [0.7] * 2}),
    "glm5_next/one group": ("glm5_next", {"n_group": 1, "topk_group": 1}),
    "phimoe/one expert per token in its config": ("phimoe", {"num_experts_per_tok": 1}),  # its sparsemixer picks two
}
"""Another reading of a family's config, checked like its tiny config: ``name -> (family, config overrides)``."""

WITH_TOPK_WEIGHTS = {"gpt_oss", "openai_privacy_filter"}
"""Families whose block returns its top-k weights beside the output, checked too."""


def _check_block(family: str, gen: torch.Generator, name: str, **overrides: object) -> None:
    block = _block(family, gen, **overrides)
    x = torch.randn(3, 7, 32, generator=gen) * (4.0 if family in CLAMPED else 1.0)
    with torch.no_grad():
        want = block(x)
        holder = _Holder(block, _config(family, **overrides))
        (swapped,) = swap_moe_blocks(holder)
        assert isinstance(holder.mlp, MoeCoreBlock) and swapped.family == family
        got = holder.mlp(x)
    if isinstance(want, tuple):
        assert isinstance(got, tuple)
        if family in WITH_TOPK_WEIGHTS:  # the same k weights per token, in either order
            got_weights, want_weights = (w.reshape(-1, w.shape[-1]).sort(dim=-1).values for w in (got[1], want[1]))
            assert _relative_error(got_weights, want_weights) <= TOLERANCE
        want, got = want[0], got[0]
    assert isinstance(got, torch.Tensor)
    error = _relative_error(got.view(want.shape), want)
    print(f"{name}: max relative error {error:.2e}, {swapped.backend}")
    assert error <= TOLERANCE


@pytest.mark.parametrize("family", sorted(CONFIGS))
def test_block_matches_transformers(family: str, gen: torch.Generator) -> None:
    _check_block(family, gen, family)


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_block_variant_matches_transformers(name: str, gen: torch.Generator) -> None:
    family, overrides = VARIANTS[name]
    _check_block(family, gen, name, **overrides)


BF16_TIER = 1.6e-2
"""The bf16 kernels' tier (two bf16 epsilons, as tests/test_triton.py), against float32 on the same bf16-rounded
weights and inputs."""


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("family", sorted(CONFIGS))
def test_block_in_bf16_through_the_chosen_kernel(family: str, device: torch.device, gen: torch.Generator) -> None:
    """The swapped block in bf16 through the backend selection chooses on ``device`` (on a GPU, Triton where it
    computes the family), 2048 tokens, against float32 on the same bf16 weights and inputs: every token within the
    bf16 tier, but those whose bf16 forward in transformers itself is off float32 by more than the tier.

    Those are the tokens whose experts bf16 router arithmetic may change: both compute the logits in the dtype the
    family's router uses (bf16 for most, float32 for DeepSeek-V3's and others); transformers' bf16 block also takes
    some softmaxes (Mistral 4, DBRX) and sigmoid scores (LFM2) in bf16, which moe-core takes in float32. A router
    computed in another dtype than transformers' flips tokens that transformers' bf16 block keeps (mistral_large4,
    0.15 off on the H200 with a bf16 router). A kernel computing something else is off on every token.
    """
    block = copy.deepcopy(_block(family, gen)).to(device, torch.bfloat16)
    x = (torch.randn(8, 256, 32, generator=gen) * (4.0 if family in CLAMPED else 1.0)).to(torch.bfloat16)
    with torch.no_grad():
        truth = _output(copy.deepcopy(block).float().cpu()(x.float())).reshape(-1, 32)
        theirs = _output(block(x.to(device))).float().cpu().reshape(-1, 32)
        holder = _Holder(block, _config(family))
        (swapped,) = swap_moe_blocks(holder, device=device)
        assert isinstance(holder.mlp, MoeCoreBlock)
        ours = _output(holder.mlp(x.to(device)))
        flips = _bf16_router_flips(holder.mlp.layer, x.reshape(-1, 32).to(device))
    assert ours.dtype == torch.bfloat16 and ours.device.type == device.type
    scale = truth.abs().max()
    off = (ours.float().cpu().reshape(-1, 32) - truth).abs().amax(dim=1) / scale
    ambiguous = ((theirs - truth).abs().amax(dim=1) / scale > BF16_TIER) | flips
    where = torch.cuda.get_device_name() if device.type == "cuda" else "cpu"
    print(f"{family}: bf16 on {where} through {swapped.backend.split(';')[0]}: max relative error "
          f"{float(off[~ambiguous].max()):.2e} over {int((~ambiguous).sum())} tokens ({float(off.max()):.2e} over all "
          f"{off.numel()}; {int(ambiguous.sum())} left out: transformers' own bf16 block off by more than the tier, "
          f"or experts chosen otherwise by bf16 router logits)")
    assert float(off[~ambiguous].max()) <= BF16_TIER
    assert int(ambiguous.sum()) <= off.numel() // 10, "too few tokens to compare"


def _bf16_router_flips(layer: MoeLayer, hidden: torch.Tensor) -> torch.Tensor:
    """Per token, whether the layer's router, run in bf16, chooses other experts than the same router in float32, or
    weights one of them otherwise by more than the tier (never, for a float32 router): the tokens whose routing bf16
    logits legitimately change. The weights count where they jump: PhiMoE's sparsemixer takes its softmax over the
    logits within a threshold of the best, and a logit at the threshold joins or leaves it with bf16 rounding
    (MOE_CORE_SEED=1305142600: one token 3.0e-2 off, its experts the same)."""
    router = layer.router
    if router.weight.dtype == torch.float32:
        return torch.zeros(hidden.shape[0], dtype=torch.bool)
    exact = Router(
        weight=router.weight.float(), bias=None if router.bias is None else router.bias.float(),
        score_correction_bias=router.score_correction_bias,
    )
    routed = [route(hidden, r, layer.config) for r in (router, exact)]
    order = [topk.topk_ids.sort(dim=1) for topk in routed]
    ids = [o.values for o in order]
    weights = [topk.topk_weights.gather(1, o.indices) for topk, o in zip(routed, order)]
    return ((ids[0] != ids[1]).any(dim=1) | ((weights[0] - weights[1]).abs() > BF16_TIER).any(dim=1)).cpu()


@pytest.mark.parametrize("family", sorted(CONFIGS))
def test_routers_run_in_float32_where_transformers_runs_them_so(family: str, gen: torch.Generator) -> None:
    """A bf16 block whose router transformers computes in float32 (DeepSeek-V3's and its copies, Mistral Large 4,
    LaRA-mini, the OpenAI privacy filter: logits that are not bf16 values) gets a float32 moe-core router: a bf16
    one chooses other experts on some tokens (0.15 off on the H200, mistral_large4). The logits are the block's
    first ``[T, num_experts]`` output; a bf16 router's upcast to float32 (Granite, Laguna) stays bf16 values."""
    block = copy.deepcopy(_block(family, gen)).to(torch.bfloat16)
    x = torch.randn(4, 16, 32, generator=gen).to(torch.bfloat16)
    holder = _Holder(block, _config(family))
    swap_moe_blocks(holder)
    assert isinstance(holder.mlp, MoeCoreBlock)
    router = holder.mlp.layer.router
    outputs: list[torch.Tensor] = []

    def keep(module: nn.Module, args: object, out: object) -> None:
        first = out[0] if isinstance(out, tuple) else out
        if isinstance(first, torch.Tensor) and first.shape == (64, router.num_experts) and first.is_floating_point():
            outputs.append(first)

    handles = [module.register_forward_hook(keep) for name, module in block.named_modules() if name]
    try:
        with torch.no_grad():
            block(x)
    finally:
        for handle in handles:
            handle.remove()
    assert outputs, "transformers' block computed no router logits that the hooks saw"
    logits = outputs[0]
    computed_in_float32 = logits.dtype == torch.float32 and not torch.equal(logits.bfloat16().float(), logits)
    if computed_in_float32:
        assert router.weight.dtype == torch.float32


def _output(result: torch.Tensor | tuple[torch.Tensor, ...]) -> torch.Tensor:
    """A block's hidden states (gpt-oss-like blocks also return their top-k weights)."""
    return result[0] if isinstance(result, tuple) else result


REFUSED: dict[str, tuple[str, dict[str, object], str]] = {
    "axk2/grouped": ("axk2", {"n_group": 4, "topk_group": 2}, "masks dropped groups with 0.0"),
    "laguna/softcapped": ("laguna", {"moe_router_logit_softcapping": 30.0}, "soft-capped router logits"),
    "deepseek_v2/unknown topk_method": ("deepseek_v2", {"topk_method": "noaux_tc"}, "'greedy' or 'group_limited_greedy'"),
    "glm5_next/gelu shared expert": ("glm5_next", {"hidden_act": "gelu"}, "the limited experts are SiLU-gated"),
    "cohere2_moe/unknown strategy": (
        "cohere2_moe", {"shared_expert_combination_strategy": "max"}, "'sum' or 'average'"
    ),
    "nemotron_h/tanh-gelu experts": (  # adversarial pass 9, c09: a shared expert's shape error, not the activation
        "nemotron_h", {"mlp_hidden_act": "gelu_pytorch_tanh"}, "not gated, .* relu2 only, got 'gelu_pytorch_tanh'"
    ),
}
"""Readings of a covered family's config that moe-core does not compute: refused by name, nothing swapped."""


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_uncovered_variant_is_refused(name: str, gen: torch.Generator) -> None:
    family, overrides, match = REFUSED[name]
    holder = _Holder(_block(family, gen, **overrides), _config(family, **overrides))
    with pytest.raises(ValueError, match=match):
        swap_moe_blocks(holder)
    assert not isinstance(holder.mlp, MoeCoreBlock)


@pytest.mark.parametrize("family", sorted(MODELS))
def test_whole_model_logits_and_greedy_tokens(family: str, gen: torch.Generator) -> None:
    torch.manual_seed(int(torch.randint(0, 2**31, (1,), generator=gen)))
    config = CONFIGS[family](num_hidden_layers=2, initializer_range=0.2)
    model = getattr(transformers, MODELS[family])(config).eval()
    for module in model.modules():
        if hasattr(module, "e_score_correction_bias"):
            module.e_score_correction_bias.copy_(torch.randn(module.e_score_correction_bias.shape, generator=gen))
    original = copy.deepcopy(model)
    swapped = swap_moe_blocks(model)
    assert len(swapped) == 2
    ids = torch.randint(0, 64, (1, 6), generator=gen)
    with torch.no_grad():
        want, got = original(ids).logits, model(ids).logits
        error = _relative_error(got, want)
        print(f"{family}: logits max relative error {error:.2e}")
        assert error <= TOLERANCE
        greedy = {"max_new_tokens": 32, "min_new_tokens": 32, "do_sample": False, "pad_token_id": 0}
        want_tokens = original.generate(ids, **greedy)
        got_tokens = model.generate(ids, **greedy)
    assert torch.equal(got_tokens, want_tokens)


def test_router_logits_asked_per_call_of_a_swapped_model_are_refused(gen: torch.Generator) -> None:
    """``model(ids, output_router_logits=True)`` after the swap (the config's flag is refused at the swap) failed
    inside transformers' load-balancing loss with a raw ``IndexError`` (adversarial pass 4, c10)."""
    torch.manual_seed(int(torch.randint(0, 2**31, (1,), generator=gen)))
    model = transformers.MixtralForCausalLM(CONFIGS["mixtral"](num_hidden_layers=1)).eval()
    swap_moe_blocks(model)
    ids = torch.randint(0, 64, (1, 4), generator=gen)
    with torch.no_grad():
        with pytest.raises(ValueError, match=r"MixtralForCausalLM\(output_router_logits=True\): its MoE blocks were swapped"):
            model(ids, output_router_logits=True)
        assert bool(torch.isfinite(model(ids, output_router_logits=False).logits).all())
        model.config.output_router_logits = True  # after the swap (adversarial pass 20, d02b: the same IndexError)
        with pytest.raises(ValueError, match=r"config.output_router_logits=True \(set after the swap\): its MoE blocks"):
            model(ids)
        assert bool(torch.isfinite(model(ids, output_router_logits=False).logits).all())


def test_training_mode_is_refused(gen: torch.Generator) -> None:
    holder = _Holder(_block("mixtral", gen), CONFIGS["mixtral"]())
    swap_moe_blocks(holder)
    holder.train()
    with pytest.raises(RuntimeError, match="inference only"):
        holder.mlp(torch.randn(1, 2, 32))


def test_a_swapped_model_refuses_state_dicts_instead_of_dropping_its_experts(gen: torch.Generator) -> None:
    """A save after the swap would lack the experts and the router; a load would leave the converted experts stale."""
    holder = _Holder(_block("mixtral", gen), CONFIGS["mixtral"]())
    donor = copy.deepcopy(holder).state_dict()
    swap_moe_blocks(holder)
    with pytest.raises(RuntimeError, match="mlp: a swapped mixtral block holds its experts in its backend's layout"):
        holder.state_dict()
    with pytest.raises(RuntimeError, match=r"mlp: a swapped mixtral block cannot take 'mlp\.[\w.]+' \(and \d+ more\)"):
        holder.load_state_dict(donor, strict=False)


@pytest.mark.parametrize("family", ["qwen2_moe", "deepseek_v3"])
def test_the_original_block_reloaded_with_its_own_values_keeps_the_swapped_one_running(
    gen: torch.Generator, family: str
) -> None:
    """False refusal (adversarial pass 12, c04): a harness that kept the original block reloaded it with its own
    values; the router and the experts the swapped block holds as given were refused as written in place (their
    counters moved, their bytes did not). Whole tensors up to 16 MiB are fingerprinted now: the same bytes run, other
    bytes are still refused by name."""
    block = _block(family, gen)
    holder = _Holder(block, _config(family))
    x = torch.randn(2, 5, 32, generator=gen)
    with torch.no_grad():
        want = _output(block(x))
        swap_moe_blocks(holder)
        block.load_state_dict({name: value.clone() for name, value in block.state_dict().items()})
        assert _relative_error(_output(holder.mlp(x)), want) <= TOLERANCE
        router = next(p for name, p in block.named_parameters() if name.endswith("gate.weight"))
        router.mul_(1.5)
        with pytest.raises(RuntimeError, match=r"written in place"):
            holder.mlp(x)


def test_the_phimoe_swap_asks_its_router_without_drawing_from_the_callers_random_streams(gen: torch.Generator) -> None:
    """The swap asks PhiMoE's router how many experts it picks; in training mode that router samples and jitters, so
    the probe runs it in eval mode and gives its mode back."""
    block = _block("phimoe", gen).train()
    torch.manual_seed(0)
    want = torch.rand(4)
    torch.manual_seed(0)
    swap_moe_blocks(_Holder(block, _config("phimoe")))
    assert torch.equal(torch.rand(4), want)
    assert block.get_submodule("router").training


@pytest.mark.parametrize("where", ["", ".gate", ".experts"])
def test_a_block_with_the_callers_hooks_is_refused(gen: torch.Generator, where: str) -> None:
    """Silent (adversarial pass 14, c08): a steering hook on the block, a pruning hook on its router or a pre-hook
    scaling its experts' input ran no more after the swap (1.27-1.44 and 3e-2 off the hooked model). They are refused
    by name, the model left as it was; transformers' own output-capturing hooks are not the caller's."""
    block = _block("mixtral", gen)
    holder = _Holder(block, CONFIGS["mixtral"]())

    def steer(module: nn.Module, args: tuple[object, ...], output: object) -> None:
        return None

    handle = block.get_submodule(where.lstrip(".")).register_forward_hook(steer)
    with pytest.raises(ValueError, match=rf"mlp{re.escape(where)}: has 1 forward hook\(s\) or pre-hook\(s\) \(.*steer\)"):
        swap_moe_blocks(holder)
    assert holder.mlp is block
    handle.remove()
    swap_moe_blocks(holder)
    assert isinstance(holder.mlp, MoeCoreBlock)


def test_quantization_aware_linears_are_refused(gen: torch.Generator) -> None:
    """Silent (adversarial pass 16, c04): quantization-aware shared-expert linears (their forward fake-quantizes the
    weights the swap read as they are: 1.1e-2 off) came from torch, which the swap let be. Only transformers' own
    hooks, standard modules' forwards, pruning, weight norm and spectral norm are let be now."""
    block = _block("qwen2_moe", gen)
    holder = _Holder(block, _config("qwen2_moe"))
    linear = block.get_submodule("shared_expert.down_proj")
    assert isinstance(linear, nn.Linear)
    linear.qconfig = torch.ao.quantization.get_default_qat_qconfig("x86")  # type: ignore[no-untyped-call]  # torch.ao is unannotated
    qat = torch.ao.nn.qat.Linear.from_float(linear)  # type: ignore[no-untyped-call]  # torch.ao is unannotated
    block.get_submodule("shared_expert").down_proj = qat
    with pytest.raises(ValueError, match=r"mlp\.shared_expert\.down_proj: (its forward was replaced|has \d+ forward hook)"):
        swap_moe_blocks(holder)
    assert holder.mlp is block


@pytest.mark.parametrize("forward_first", [True, False], ids=["after-a-forward", "before-any-forward"])
@pytest.mark.parametrize("utility", ["prune", "weight_norm", "spectral_norm"])
def test_pruning_weight_norm_and_spectral_norm_are_let_be(gen: torch.Generator, utility: str, forward_first: bool) -> None:
    """Their hooks recompute the weights the swap reads from their parts; the swap runs them first, so parts changed
    since the last forward (an optimizer step, a load) are read as the hooked model computes them (adversarial pass
    17, c08: the stale router weight was read, 1.7e-2 off under weight norm, 1.6e-4 under pruning), and so is a
    spectral norm that has not run yet (pass 16, c04: 5.9e-2 off; then refused, a false refusal after a forward).
    The oracle is a twin block given the same utility, steps and forwards, never swapped."""
    block = _block("mixtral", gen)
    twin = copy.deepcopy(block)
    holder = _Holder(block, _config("mixtral"))
    seed = int(torch.randint(0, 2**31, (1,), generator=gen))
    for each in (block, twin):
        gate = each.get_submodule("gate")
        torch.manual_seed(seed)  # spectral norm draws its power-iteration vectors from the global generator
        if utility == "prune":
            prune.l1_unstructured(gate, "weight", 0.25)  # type: ignore[no-untyped-call]  # prune is unannotated
        elif utility == "weight_norm":
            nn.utils.weight_norm(gate)
        else:
            nn.utils.spectral_norm(gate)
    x = torch.randn(2, 5, 32, generator=gen)
    gate, twin_gate = block.get_submodule("gate"), twin.get_submodule("gate")
    with torch.no_grad():
        if forward_first:
            block(x), twin(x)
        for part, twin_part in zip(gate.parameters(), twin_gate.parameters(), strict=True):  # a step, no forward after it
            step = torch.randn(part.shape, generator=gen) * 0.3
            part.add_(step), twin_part.add_(step)
        if utility == "prune":
            mask = (torch.rand(gate.get_buffer("weight_mask").shape, generator=gen) > 0.5).float()
            gate.get_buffer("weight_mask").copy_(mask), twin_gate.get_buffer("weight_mask").copy_(mask)
        want = _output(twin(x))  # the twin's forward recomputes; the block's own weight stays stale
        swap_moe_blocks(holder)
        assert _relative_error(_output(holder.mlp(x)), want) <= TOLERANCE


def test_a_hook_on_a_module_the_swapped_block_keeps_runs_on(gen: torch.Generator) -> None:
    """False refusal (adversarial pass 15, c13): A.X-K1's swapped block calls the original post-MLP norm itself, so a
    hook on it keeps running and is not refused."""
    block = _block("axk1", gen)
    holder = _Holder(block, _config("axk1"))

    def steer(module: nn.Module, args: tuple[object, ...], output: torch.Tensor) -> torch.Tensor:
        return output + 0.5

    block.get_submodule("post_mlp_layernorm").register_forward_hook(steer)
    x = torch.randn(2, 5, 32, generator=gen)
    with torch.no_grad():
        want = _output(block(x))
        swap_moe_blocks(holder)
        assert _relative_error(_output(holder.mlp(x)), want) <= TOLERANCE


def test_transformers_output_capturing_hooks_do_not_stop_the_swap() -> None:
    model = transformers.Qwen3MoeForCausalLM(CONFIGS["qwen3_moe"](num_hidden_layers=1)).eval()
    with torch.no_grad():
        model(torch.randint(0, 64, (1, 4)), output_router_logits=True)  # transformers hooks the router to record it
    assert model.get_submodule("model.layers.0.mlp.gate")._forward_hooks
    swap_moe_blocks(model)


def test_model_without_covered_block_is_refused() -> None:
    holder = _Holder(nn.Linear(2, 2), CONFIGS["mixtral"]())
    with pytest.raises(ValueError, match="no sparse MoE block of a covered family"):
        swap_moe_blocks(holder)


def test_a_backend_that_refuses_leaves_the_model_as_it_was(gen: torch.Generator) -> None:
    holder = _Holder(_block("gpt_oss", gen), CONFIGS["gpt_oss"]())
    with pytest.raises(BackendSelectionError, match="clamped_swiglu.*per-expert biases"):
        swap_moe_blocks(holder, backend="triton-dense")
    assert not isinstance(holder.mlp, MoeCoreBlock)


@pytest.mark.parametrize("family", ["deepseek_v3", "deepseek_v2", "llama4", "phimoe", "glm4_moe"])
def test_a_config_edited_after_the_experts_were_built_is_refused(gen: torch.Generator, family: str) -> None:
    """Silent (adversarial pass 6, c17): ``config.update(hidden_act="gelu")`` after a DeepSeek-V3 model was built
    with SiLU experts; the swap read the config and ran GELU, 0.10 off the model's own forward (Mixtral's reader
    probed its experts' ``act_fn``, these did not). Every reader probes it now."""
    holder = _Holder(_block(family, gen), _config(family, hidden_act="gelu"))
    with pytest.raises(ValueError, match=r"experts\.act_fn: SiLUActivation does not compute the config's gelu"):
        swap_moe_blocks(holder)
    assert not isinstance(holder.mlp, MoeCoreBlock)


def test_jetmoe_and_dbrx_configs_edited_after_the_blocks_were_built_are_refused(gen: torch.Generator) -> None:
    """Silent (adversarial pass 7, c15, c10): JetMoE's ``activation_function`` and DBRX's ``ffn_act_fn`` edited to gelu
    after their SiLU blocks were built swapped and ran 0.16 and 1.6e-2 off (neither block has an ``experts.act_fn`` to
    probe); a DBRX block whose ``moe_normalize_expert_weights`` was set to None after building ran the config's
    normalization, 7.9e-2 off. JetMoE's ``activation`` and DBRX's ``experts.mlp.activation_fn`` are probed, and DBRX's
    normalization is read from the block, whose forward reads it."""
    jetmoe = _Holder(_block("jetmoe", gen), _config("jetmoe", activation_function="gelu"))
    with pytest.raises(ValueError, match=r"activation: SiLUActivation does not compute the config's gelu"):
        swap_moe_blocks(jetmoe)
    dbrx_config = _config("dbrx")
    dbrx = _Holder(_block("dbrx", gen), dbrx_config)
    ffn_config = getattr(dbrx_config, "ffn_config")
    ffn_config.ffn_act_fn = {"name": "gelu"}
    with pytest.raises(ValueError, match=r"experts\.mlp\.activation_fn: SiLUActivation does not compute the config's gelu"):
        swap_moe_blocks(dbrx)
    ffn_config.ffn_act_fn = {"name": "silu"}
    block = dbrx.mlp
    setattr(block, "moe_normalize_expert_weights", None)
    x = torch.randn(1, 5, 32, generator=gen)
    with torch.no_grad():
        own = block(x)
        swap_moe_blocks(dbrx)
        swapped = dbrx.mlp(x)
    expected = own[0] if isinstance(own, tuple) else own
    got = swapped[0] if isinstance(swapped, tuple) else swapped
    assert _relative_error(got, expected) < 1e-5


def test_experts_computing_another_activation_than_the_config_are_refused(gen: torch.Generator) -> None:
    """Qwen3-Omni's talker names its activation in its own config, not in the text config the swap reads."""
    holder = _Holder(_block("qwen3_omni_moe_talker", gen, hidden_act="gelu"), _config("qwen3_omni_moe_talker"))
    with pytest.raises(ValueError, match="does not compute the config's silu"):
        swap_moe_blocks(holder)
    assert not isinstance(holder.mlp, MoeCoreBlock)


def test_a_block_shared_by_two_layers_is_swapped_in_both(gen: torch.Generator) -> None:
    """Adversarial pass 16, c12: a block module shared by two layers (named_modules() lists it once) was swapped in
    the first layer only, and nothing said so. It is built once and replaced at every path."""
    torch.manual_seed(int(torch.randint(2**31, (1,), generator=gen)))
    model = transformers.MixtralForCausalLM(CONFIGS["mixtral"](num_hidden_layers=2)).eval()
    model.model.layers[1].mlp = model.model.layers[0].mlp
    ids = torch.randint(0, 64, (1, 6), generator=gen)
    with torch.no_grad():
        want = model(ids).logits
        swapped = swap_moe_blocks(model)
        assert [block.path for block in swapped] == ["model.layers.0.mlp", "model.layers.1.mlp"]
        assert isinstance(model.model.layers[1].mlp, MoeCoreBlock) and model.model.layers[1].mlp is model.model.layers[0].mlp
        assert _relative_error(model(ids).logits, want) <= TOLERANCE


@pytest.mark.parametrize("family", ["mixtral", "qwen3_moe", "gpt_oss", "deepseek_v3"])
def test_checkpoints_transformers_saves_load_as_its_blocks_compute(gen: torch.Generator, family: str, tmp_path: Path) -> None:
    """Each architecture the checkpoint loader knows, saved by transformers' ``save_pretrained`` (float32, random
    weights; hidden and intermediate sizes equal, so a transposed projection would fit its shape), loaded layer by
    layer and routed by the checkpoint's router, computes what transformers' own block computes. False refusal
    (adversarial pass 18, c02): an unquantized gpt-oss, whose experts transformers stacks input-first with biases."""
    config = CONFIGS[family](num_hidden_layers=1, **({"layer_types": ["full_attention"]} if family == "gpt_oss" else {}))
    for size in ("intermediate_size", "moe_intermediate_size"):
        if hasattr(config, size):
            setattr(config, size, 32)
    model = getattr(transformers, MODELS[family])(config).eval()
    _randomize(model, gen, 0.2)
    model.save_pretrained(tmp_path)
    checkpoint = MoeCheckpoint(tmp_path)
    layer = checkpoint.load_layer(0)
    x = torch.randn(9, 32, generator=gen) * (4.0 if family in CLAMPED else 1.0)
    with torch.no_grad():
        want = model.get_submodule("model.layers.0.mlp")(x[None])
        got = layer.apply(StandardDispatchOutput(x, route(x, checkpoint.router(0), layer.config)))
        shared = checkpoint.shared_expert(0)
        if shared is not None:
            got = got + shared(x)
    want = want[0] if isinstance(want, tuple) else want
    assert _relative_error(got, want.reshape(got.shape)) <= TOLERANCE


@pytest.mark.parametrize("hidden_act", sorted(name for name, activation in HIDDEN_ACTS.items() if activation.gated))
def test_every_gated_hidden_act_name_swaps(gen: torch.Generator, hidden_act: str) -> None:
    """False refusal (adversarial pass 20, d11): the swap's check of the block's own activation ran in float32, where
    transformers' erf-formula GELU (``gelu_python``) is 5e-7 off torch's; it runs in float64 now."""
    _check_block("mixtral", gen, f"mixtral/{hidden_act}", hidden_act=hidden_act)
