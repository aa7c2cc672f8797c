"""moe-core's routing and experts against transformers' own MoE blocks and models (tiny random configs, CPU, float32).

Each family's block is built from a tiny config, its parameters drawn at
random (biases and DeepSeek's correction bias included, so every term
counts), then swapped: the swapped block must match the original within
1e-5 relative error. Four whole models must keep their logits within 1e-5
and their 32 greedy tokens.
"""

from __future__ import annotations

import copy
from collections.abc import Callable

import pytest
import torch
from torch import nn

transformers = pytest.importorskip("transformers")

from moe_core.integrations.transformers import FAMILIES, MoeCoreBlock, swap_moe_blocks  # noqa: E402
from moe_core.registry import BackendSelectionError  # noqa: E402

pytestmark = pytest.mark.transformers

TOLERANCE = 1e-5
ATTENTION = {"num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 64, "max_position_embeddings": 128}


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
}
"""A tiny config per covered family."""

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


def _block(family: str, gen: torch.Generator) -> nn.Module:
    """The family's block class, found in its modeling module, on the tiny config, random and in eval mode."""
    config = CONFIGS[family]()
    modeling = __import__(f"transformers.models.{family}.modeling_{family}", fromlist=["_"])
    block: nn.Module = getattr(modeling, BLOCKS[family])(config)
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


@pytest.mark.parametrize("family", sorted(CONFIGS))
def test_block_matches_transformers(family: str, gen: torch.Generator) -> None:
    block = _block(family, gen)
    x = torch.randn(3, 7, 32, generator=gen) * (4.0 if family == "gpt_oss" else 1.0)
    with torch.no_grad():
        want = block(x)
        holder = _Holder(block, CONFIGS[family]())
        (swapped,) = swap_moe_blocks(holder)
        assert isinstance(holder.mlp, MoeCoreBlock) and swapped.family == family
        got = holder.mlp(x)
    if isinstance(want, tuple):
        assert isinstance(got, tuple)
        want, got = want[0], got[0]
    assert isinstance(got, torch.Tensor)
    error = _relative_error(got.view(want.shape), want)
    print(f"{family}: max relative error {error:.2e}, {swapped.backend}")
    assert error <= TOLERANCE


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


def test_training_mode_is_refused(gen: torch.Generator) -> None:
    holder = _Holder(_block("mixtral", gen), CONFIGS["mixtral"]())
    swap_moe_blocks(holder)
    holder.train()
    with pytest.raises(RuntimeError, match="inference only"):
        holder.mlp(torch.randn(1, 2, 32))


def test_model_without_covered_block_is_refused() -> None:
    holder = _Holder(nn.Linear(2, 2), CONFIGS["mixtral"]())
    with pytest.raises(ValueError, match="no sparse MoE block of a covered family"):
        swap_moe_blocks(holder)


def test_a_backend_that_refuses_leaves_the_model_as_it_was(gen: torch.Generator) -> None:
    holder = _Holder(_block("gpt_oss", gen), CONFIGS["gpt_oss"]())
    with pytest.raises(BackendSelectionError, match="clamped_swiglu.*per-expert biases"):
        swap_moe_blocks(holder, backend="triton-dense")
    assert not isinstance(holder.mlp, MoeCoreBlock)
