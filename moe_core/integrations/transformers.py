"""Swap every sparse MoE block of a loaded transformers model for a moe-core layer, in one call.

:func:`swap_moe_blocks` walks the model, and for each block of a covered
family reads its router, experts and shared expert once (the weights are
converted for the chosen backend then, not per forward), builds a
:class:`~moe_core.layer.MoeLayer` with the family's routing method and
activation as typed values, and puts a :class:`MoeCoreBlock` in the block's
place. The families are keyed by the block's class name (:data:`FAMILIES`),
so nothing here imports transformers. Unquantized (fp32/bf16/fp16) expert
weights only; inference only (a block in training mode refuses to run:
routers jitter and sparsemixer samples there).

What a swapped model no longer does: record ``router_logits`` through
transformers' output hooks on its router classes (``output_router_logits``);
follow ``model.to(...)`` (the layers hold their weights as converted for the
chosen backend, not as parameters): place the model first, then swap.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from typing import TypeVar, final

import attrs
import torch
from torch import nn

from moe_core.capability import DeviceSpec
from moe_core.config import (
    Activation,
    ClampedSwiglu,
    ExpertActivation,
    GroupedTopK,
    Llama4Sigmoid,
    MoeRunnerConfig,
    Routing,
    RoutingMethod,
    SparseMixer,
)
from moe_core.formats.dense import DenseMoeWeights, ExpertBiases, GateUpLayout
from moe_core.layer import MoeLayer, SharedExpert, dense_layer
from moe_core.routing import Router

T = TypeVar("T")

HIDDEN_ACTS: dict[str, Activation] = {
    "silu": Activation.SILU_GATED,
    "swish": Activation.SILU_GATED,
    "gelu": Activation.GELU_GATED,
    "gelu_pytorch_tanh": Activation.GELU_TANH_GATED,
    "relu2": Activation.RELU2,
}
"""transformers' ``hidden_act`` names -> the activation that computes the same (``ACT2FN``)."""


class BlockReturn(enum.Enum):
    """What the replaced block returned, which its decoder layer unpacks."""

    HIDDEN = "hidden"
    """The output alone."""
    WITH_TOPK_WEIGHTS = "with_topk_weights"
    """``(output, top-k weights [T, K])`` (gpt-oss)."""
    WITH_ROUTER_LOGITS = "with_router_logits"
    """``(output, router logits [T, E])`` (Llama 4)."""


class MoeCoreBlock(nn.Module):
    """A moe-core layer where a transformers sparse MoE block stood: ``[..., H]`` in, ``[..., H]`` out."""

    def __init__(self, layer: MoeLayer, returns: BlockReturn, family: str) -> None:
        super().__init__()
        self.layer = layer
        self.returns = returns
        self.family = family

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """The layer's output, shaped like ``hidden_states``, with what the family's block returned beside it."""
        if self.training:
            raise RuntimeError(f"{self.family} block swapped for moe-core: inference only, call model.eval() first")
        out, topk = self.layer.forward(hidden_states.reshape(-1, hidden_states.shape[-1]))
        out = out.view(hidden_states.shape)
        if self.returns is BlockReturn.WITH_TOPK_WEIGHTS:
            return out, topk.topk_weights.to(hidden_states.dtype)
        if self.returns is BlockReturn.WITH_ROUTER_LOGITS and topk.router_logits is not None:  # route() keeps them
            return out, topk.router_logits
        return out

    def extra_repr(self) -> str:
        """The family, the layer's sizes and semantics, and the backend chosen."""
        config = self.layer.config
        return (
            f"family={self.family}, experts={config.num_experts}, top_k={config.top_k}, "
            f"activation={config.activation.value}, routing={config.routing_method.value}, {self.layer.backend}"
        )


@final
@attrs.frozen
class SwappedBlock:
    """One block :func:`swap_moe_blocks` replaced."""

    path: str
    """Its name in ``model.named_modules()``."""
    family: str
    backend: str
    """The selection's summary for its layer."""


@final
@attrs.frozen(eq=False, kw_only=True)
class BlockParts:
    """What a family's block holds, in moe-core's terms."""

    top_k: int
    activation: ExpertActivation
    routing: Routing
    router: Router
    weights: DenseMoeWeights
    routed_scaling_factor: float = 1.0
    shared_expert: SharedExpert | None = None

    def config(self) -> MoeRunnerConfig:
        """The layer's config, its sizes read from the weights."""
        return MoeRunnerConfig(
            num_experts=self.weights.num_experts,
            hidden_size=self.weights.hidden_size,
            intermediate_size_per_partition=self.weights.intermediate_size,
            top_k=self.top_k,
            activation=self.activation,
            routing_method=self.routing,
            routed_scaling_factor=self.routed_scaling_factor,
            expert_biases=self.weights.biases is not None,
        )


@final
@attrs.frozen
class Family:
    """A covered family: how to read its block, and what the block returns."""

    name: str
    read: Callable[[nn.Module, object], BlockParts]
    """``(block, the model's text config) -> parts``."""
    returns: BlockReturn = BlockReturn.HIDDEN


def _get(owner: object, path: str, kind: type[T]) -> T:
    """``owner.a.b`` for ``path="a.b"``, which must be a ``kind``; a ValueError naming the path otherwise."""
    value = owner
    for part in path.split("."):
        value = getattr(value, part, None)
    if not isinstance(value, kind):
        raise ValueError(f"{type(owner).__name__}.{path}: expected a {kind.__name__}, got {type(value).__name__}")
    return value


def _float(owner: object, path: str) -> float:
    """A number read as :func:`_get` does; configs write ``1`` for ``1.0``."""
    value = _get(owner, path, object)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{type(owner).__name__}.{path}: expected a float, got {type(value).__name__}")
    return float(value)


def _tensor(owner: object, path: str) -> torch.Tensor:
    return _get(owner, path, torch.Tensor).detach()


def _hidden_act(name: str) -> Activation:
    activation = HIDDEN_ACTS.get(name)
    if activation is None:
        raise ValueError(f"hidden_act: expected one of {', '.join(HIDDEN_ACTS)}, got {name!r}")
    return activation


def _mlp(owner: object, path: str, activation: ExpertActivation, gate: torch.Tensor | None = None) -> SharedExpert:
    """A transformers dense MLP (``gate_proj``, ``up_proj``, ``down_proj``) as a shared expert."""
    w13 = torch.cat((_tensor(owner, f"{path}.gate_proj.weight"), _tensor(owner, f"{path}.up_proj.weight")))
    return SharedExpert(w13=w13, w2=_tensor(owner, f"{path}.down_proj.weight"), activation=activation, gate=gate)


def _experts(block: nn.Module) -> DenseMoeWeights:
    """transformers' 3-d experts: ``gate_up_proj [E, 2I, H]`` (gate then up), ``down_proj [E, H, I]``."""
    return DenseMoeWeights(w13=_tensor(block, "experts.gate_up_proj"), w2=_tensor(block, "experts.down_proj"))


def _softmax_family(router: str = "gate", renormalize: bool | None = None) -> Callable[[nn.Module, object], BlockParts]:
    """The reader of a softmax top-k family (Mixtral, Qwen, OLMoE, Granite, ...): renormalized as fixed here, or
    as the router's ``norm_topk_prob`` says; a ``shared_expert`` scaled by ``sigmoid(shared_expert_gate)`` where the
    block has one (Qwen2-MoE, Qwen3-Next, Qwen3.5-MoE). Top-k of the logits then softmax (Granite) is
    renormalized softmax top-k, computed the same way."""

    def read(block: nn.Module, config: object) -> BlockParts:
        activation = _hidden_act(_get(config, "hidden_act", str))
        shared = None
        if hasattr(block, "shared_expert"):
            shared = _mlp(block, "shared_expert", activation, gate=_tensor(block, "shared_expert_gate.weight"))
        norm = _get(block, f"{router}.norm_topk_prob", bool) if renormalize is None else renormalize
        return BlockParts(
            top_k=_get(block, f"{router}.top_k", int),
            activation=activation,
            routing=RoutingMethod.TOPK_RENORMALIZE if norm else RoutingMethod.SOFTMAX_TOPK,
            router=Router(weight=_tensor(block, f"{router}.weight")),
            weights=_experts(block),
            shared_expert=shared,
        )

    return read


def _dbrx(block: nn.Module, config: object) -> BlockParts:
    """DBRX: ``w1``/``v1``/``w2`` stacked as ``[E * I, H]``; softmax top-k, then divided by the weights' p-norm."""
    ffn = _get(config, "ffn_config", object)
    norm = getattr(ffn, "moe_normalize_expert_weights", None)
    if norm not in (None, 1, 1.0):
        raise ValueError(f"ffn_config.moe_normalize_expert_weights: expected None or 1 (an L1 norm), got {norm!r}")
    act = _get(ffn, "ffn_act_fn", dict).get("name", "silu")
    experts, hidden = _get(block, "experts.num_experts", int), _get(block, "experts.hidden_size", int)
    stack = (experts, -1, hidden)
    w1, v1 = _tensor(block, "experts.mlp.w1").view(stack), _tensor(block, "experts.mlp.v1").view(stack)
    return BlockParts(
        top_k=_get(block, "top_k", int),
        activation=_hidden_act(act),
        routing=RoutingMethod.SOFTMAX_TOPK if norm is None else RoutingMethod.TOPK_RENORMALIZE,
        router=Router(weight=_tensor(block, "router.layer.weight")),
        weights=DenseMoeWeights(
            w13=torch.cat((w1, v1), dim=1), w2=_tensor(block, "experts.mlp.w2").view(stack).transpose(1, 2)
        ),
    )


def _grouped(block: nn.Module, activation: ExpertActivation, weights: DenseMoeWeights, shared: SharedExpert) -> BlockParts:
    """A DeepSeek-V3-style block: grouped top-k on sigmoid scores with a correction bias, a float32 router, a
    scaled output and an ungated shared expert."""
    return BlockParts(
        top_k=_get(block, "gate.top_k", int),
        activation=activation,
        routing=GroupedTopK(
            n_group=_get(block, "gate.num_group", int),
            topk_group=_get(block, "gate.topk_group", int),
            renormalize=_get(block, "gate.norm_topk_prob", bool),
        ),
        router=Router(
            weight=_tensor(block, "gate.weight").float(),
            score_correction_bias=_tensor(block, "gate.e_score_correction_bias").float(),
        ),
        weights=weights,
        routed_scaling_factor=_float(block, "gate.routed_scaling_factor"),
        shared_expert=shared,
    )


def _deepseek(block: nn.Module, config: object) -> BlockParts:
    """DeepSeek-V3, GLM4-MoE, GLM-4.5V's text model, dots.llm1."""
    activation = _hidden_act(_get(config, "hidden_act", str))
    return _grouped(block, activation, _experts(block), _mlp(block, "shared_experts", activation))


def _deepseek_v2(block: nn.Module, config: object) -> BlockParts:
    """DeepSeek-V2's greedy routing: softmax top-k of a float32 router, not renormalized, scaled output, an ungated
    shared expert. Its ``group_limited_greedy`` (groups scored by their best softmax) is not covered."""
    method = _get(block, "gate.topk_method", str)
    if method != "greedy":
        raise ValueError(f"topk_method: expected 'greedy' (group_limited_greedy is not covered), got {method!r}")
    activation = _hidden_act(_get(config, "hidden_act", str))
    return BlockParts(
        top_k=_get(block, "gate.top_k", int),
        activation=activation,
        routing=RoutingMethod.SOFTMAX_TOPK,
        router=Router(weight=_tensor(block, "gate.weight").float()),
        weights=_experts(block),
        routed_scaling_factor=_float(block, "gate.routed_scaling_factor"),
        shared_expert=_mlp(block, "shared_experts", activation),
    )


def _nemotron_h(block: nn.Module, config: object) -> BlockParts:
    """Nemotron-H: DeepSeek-V3's routing over non-gated experts (``up_proj [E, I, H]``, ReLU^2) and shared expert."""
    if not isinstance(getattr(block, "fc1_latent_proj", None), nn.Identity):
        raise ValueError("NemotronHMoE.fc1_latent_proj: latent expert projections (moe_latent_size) are not covered")
    if _get(config, "mlp_bias", bool):
        raise ValueError("mlp_bias: a shared expert with biases is not covered")
    activation = _hidden_act(_get(config, "mlp_hidden_act", str))
    weights = DenseMoeWeights(w13=_tensor(block, "experts.up_proj"), w2=_tensor(block, "experts.down_proj"))
    shared = SharedExpert(
        w13=_tensor(block, "shared_experts.up_proj.weight"),
        w2=_tensor(block, "shared_experts.down_proj.weight"),
        activation=activation,
    )
    return _grouped(block, activation, weights, shared)


def _gpt_oss(block: nn.Module, config: object) -> BlockParts:
    """gpt-oss: transposed experts with interleaved gate/up columns, biases, clamped SwiGLU, a biased router."""
    biases = ExpertBiases(w13=_tensor(block, "experts.gate_up_proj_bias"), w2=_tensor(block, "experts.down_proj_bias"))
    return BlockParts(
        top_k=_get(block, "router.top_k", int),
        activation=ClampedSwiglu(alpha=_float(block, "experts.alpha"), limit=_float(block, "experts.limit")),
        routing=RoutingMethod.TOPK_RENORMALIZE,
        router=Router(weight=_tensor(block, "router.weight"), bias=_tensor(block, "router.bias")),
        weights=DenseMoeWeights.from_checkpoint(
            w13=_tensor(block, "experts.gate_up_proj").transpose(1, 2),
            w2=_tensor(block, "experts.down_proj").transpose(1, 2),
            layout=GateUpLayout.INTERLEAVED,
            biases=biases,
        ),
    )


def _phimoe(block: nn.Module, config: object) -> BlockParts:
    return BlockParts(
        top_k=_get(block, "top_k", int),
        activation=_hidden_act(_get(config, "hidden_act", str)),
        routing=SparseMixer(jitter_eps=_float(block, "router.router_jitter_noise")),
        router=Router(weight=_tensor(block, "router.weight")),
        weights=_experts(block),
    )


def _llama4(block: nn.Module, config: object) -> BlockParts:
    """Llama 4: sigmoid of the top-k logits scaling each expert's input, transposed experts, a shared expert."""
    activation = _hidden_act(_get(config, "hidden_act", str))
    return BlockParts(
        top_k=_get(block, "top_k", int),
        activation=activation,
        routing=Llama4Sigmoid(),
        router=Router(weight=_tensor(block, "router.weight")),
        weights=DenseMoeWeights(
            w13=_tensor(block, "experts.gate_up_proj").transpose(1, 2),
            w2=_tensor(block, "experts.down_proj").transpose(1, 2),
        ),
        shared_expert=_mlp(block, "shared_expert", activation),
    )


FAMILIES: dict[str, Family] = {
    "MixtralSparseMoeBlock": Family("mixtral", _softmax_family(renormalize=True)),
    "MiniMaxSparseMoeBlock": Family("minimax", _softmax_family(renormalize=True)),
    "Qwen2MoeSparseMoeBlock": Family("qwen2_moe", _softmax_family()),
    "Qwen3MoeSparseMoeBlock": Family("qwen3_moe", _softmax_family()),
    "Qwen3NextSparseMoeBlock": Family("qwen3_next", _softmax_family()),
    "Qwen3_5MoeSparseMoeBlock": Family("qwen3_5_moe", _softmax_family(renormalize=True)),
    "Qwen3VLMoeTextSparseMoeBlock": Family("qwen3_vl_moe", _softmax_family(renormalize=True)),
    "OlmoeSparseMoeBlock": Family("olmoe", _softmax_family()),
    "FlexOlmoSparseMoeBlock": Family("flex_olmo", _softmax_family()),
    "GraniteMoeMoE": Family("granitemoe", _softmax_family("router", renormalize=True)),
    "GraniteMoeSharedMoE": Family("granitemoeshared", _softmax_family("router", renormalize=True)),
    "GraniteMoeHybridMoE": Family("granitemoehybrid", _softmax_family("router", renormalize=True)),
    "GraniteMoeSWAMoE": Family("granitemoe_swa", _softmax_family("router", renormalize=True)),
    "JambaSparseMoeBlock": Family("jamba", _softmax_family("router", renormalize=False)),
    "DbrxFFN": Family("dbrx", _dbrx),
    "DeepseekV2Moe": Family("deepseek_v2", _deepseek_v2),
    "DeepseekV3MoE": Family("deepseek_v3", _deepseek),
    "Glm4MoeMoE": Family("glm4_moe", _deepseek),
    "Glm4vMoeTextMoE": Family("glm4v_moe", _deepseek),
    "Dots1MoE": Family("dots1", _deepseek),
    "NemotronHMoE": Family("nemotron_h", _nemotron_h),
    "GptOssMLP": Family("gpt_oss", _gpt_oss, BlockReturn.WITH_TOPK_WEIGHTS),
    "PhimoeSparseMoeBlock": Family("phimoe", _phimoe),
    "Llama4TextMoe": Family("llama4", _llama4, BlockReturn.WITH_ROUTER_LOGITS),
}
"""transformers' sparse MoE block classes, by name, that :func:`swap_moe_blocks` replaces."""


def _text_config(model: nn.Module) -> object:
    config = getattr(model, "config", None)
    if config is None:
        raise ValueError(f"model: expected a transformers model with a .config, got {type(model).__name__}")
    get_text_config = getattr(config, "get_text_config", None)
    return config if get_text_config is None else get_text_config()


def swap_moe_blocks(
    model: nn.Module, *, backend: str | None = None, device: DeviceSpec | torch.device | None = None
) -> tuple[SwappedBlock, ...]:
    """Replace every sparse MoE block of ``model`` (a family in :data:`FAMILIES`) by a :class:`MoeCoreBlock`.

    Each layer's backend is chosen for the weights' dtype on ``device``
    (default: where the weights are), or is the one named ``backend``;
    selection raises, naming every candidate's reasons, where none fits.
    Returns what was replaced, with each chosen backend. A ValueError when
    the model has no block of a covered family; nothing is replaced when
    any block cannot be built.
    """
    config = _text_config(model)
    blocks = [(path, module) for path, module in model.named_modules() if type(module).__name__ in FAMILIES]
    if not blocks:
        raise ValueError(
            f"model: no sparse MoE block of a covered family in {type(model).__name__} "
            f"(covered: {', '.join(sorted({family.name for family in FAMILIES.values()}))})"
        )
    built = []
    for path, block in blocks:  # every layer built before any block is replaced: a refusal leaves the model as it was
        family = FAMILIES[type(block).__name__]
        parts = family.read(block, config)
        layer = dense_layer(
            parts.config(),
            parts.router,
            parts.weights,
            dtype=parts.weights.w13.dtype,
            device=device,
            backend=backend,
            shared_expert=parts.shared_expert,
        )
        replacement = MoeCoreBlock(layer, family.returns, family.name)
        replacement.train(block.training)
        built.append((path, replacement))
    for path, replacement in built:
        parent_path, _, name = path.rpartition(".")
        setattr(model.get_submodule(parent_path), name, replacement)
    return tuple(SwappedBlock(path, block.family, block.layer.backend) for path, block in built)
