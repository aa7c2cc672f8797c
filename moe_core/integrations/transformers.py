"""Swap every sparse MoE block of a loaded transformers model for a moe-core layer, in one call.

:func:`swap_moe_blocks` walks the model, and for each block of a covered
family reads its router, experts and shared expert once (the weights are
converted for the chosen backend then, not per forward), builds a
:class:`~moe_core.layer.MoeLayer` with the family's routing method and
activation as typed values, and puts a :class:`MoeCoreBlock` in the block's
place. The families are keyed by the block's class name (:data:`FAMILIES`),
so nothing here imports transformers. Unquantized (fp32/bf16/fp16) expert
weights only; inference only (a block in training mode refuses to run:
routers jitter and sparsemixer samples there). A family's config reading
that moe-core does not compute (say, expert groups scored by softmax) is
refused by name when the model is swapped. ``docs/transformers-families.md``
lists every MoE model type of transformers 5.24 with what is covered and why
the rest is not.

What a swapped model no longer does: record ``router_logits`` through
transformers' output hooks on its router classes (``output_router_logits``);
follow ``model.to(...)`` (the layers hold their weights as converted for the
chosen backend, not as parameters): place the model first, then swap.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping
from typing import TypeVar, final

import attrs
import torch
from torch import nn
from torch.nn.modules import module as module_hooks
from torch.nn.utils.prune import BasePruningMethod
from torch.nn.utils.spectral_norm import SpectralNorm
from torch.nn.utils.weight_norm import WeightNorm

from moe_core.capability import DeviceSpec
from moe_core.config import (
    HIDDEN_ACTS,
    Activation,
    ClampedSwiglu,
    ExpertActivation,
    GateClamp,
    GroupedTopK,
    GroupScore,
    LimitedSwiglu,
    Llama4Sigmoid,
    MoeRunnerConfig,
    Routing,
    RoutingMethod,
    Scoring,
    SigmoidTopK,
    SparseMixer,
)
from moe_core.formats.dense import DenseMoeWeights, ExpertBiases, GateUpLayout
from moe_core._compile import run_eagerly
from moe_core.layer import MoeLayer, SharedExpert, dense_layer
from moe_core.routing import Router

T = TypeVar("T")


class BlockReturn(enum.Enum):
    """What the replaced block returned, which its decoder layer unpacks."""

    HIDDEN = "hidden"
    """The output alone."""
    WITH_TOPK_WEIGHTS = "with_topk_weights"
    """``(output, top-k weights [T, K])`` (gpt-oss)."""
    WITH_ROUTER_LOGITS = "with_router_logits"
    """``(output, router logits [T, E])`` (Llama 4)."""
    WITH_TOPK_WEIGHTS_OVER_K = "with_topk_weights_over_k"
    """``(output, top-k weights / k [T, K])`` (OpenAI privacy filter, whose block multiplies its output by k)."""


class MoeCoreBlock(nn.Module):
    """A moe-core layer where a transformers sparse MoE block stood: ``[..., H]`` in, ``[..., H]`` out."""

    def __init__(
        self, layer: MoeLayer, returns: BlockReturn, family: str, dtype: torch.dtype, post_norm: nn.Module | None = None
    ) -> None:
        super().__init__()
        self.layer = layer
        self.returns = returns
        self.family = family
        self.dtype = dtype
        """The model's dtype when it was swapped: the router and experts were converted for it, not as parameters,
        so ``model.float()`` after the swap does not reach them."""
        self.post_norm = post_norm
        """The block's own norm of its output, kept as transformers' module (A.X-K1's ``post_mlp_layernorm``)."""

    @run_eagerly
    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """The layer's output, shaped like ``hidden_states``, with what the family's block returned beside it.

        Under ``torch.compile`` the model's graph breaks around this block, which runs eagerly."""
        if self.training:
            raise RuntimeError(f"{self.family} block swapped for moe-core: inference only, call model.eval() first")
        if hidden_states.dtype != self.dtype:
            raise TypeError(
                f"{self.family} block swapped for moe-core in {self.dtype}: got {hidden_states.dtype} hidden states "
                "(its router and experts were converted once, for the model's dtype at the swap, and model.to() does "
                "not reach them): change the model's dtype before swap_moe_blocks"
            )
        out, topk = self.layer.forward(hidden_states.reshape(-1, hidden_states.shape[-1]))
        out = out.view(hidden_states.shape)
        if self.post_norm is not None:
            out = self.post_norm(out)
        if self.returns is BlockReturn.WITH_TOPK_WEIGHTS:
            return out, topk.topk_weights.to(hidden_states.dtype)
        if self.returns is BlockReturn.WITH_TOPK_WEIGHTS_OVER_K:
            return out, (topk.topk_weights / self.layer.config.top_k).to(hidden_states.dtype)
        if self.returns is BlockReturn.WITH_ROUTER_LOGITS and topk.router_logits is not None:  # route() keeps them
            return out, topk.router_logits
        return out

    def _save_to_state_dict(self, destination: object, prefix: str, keep_vars: object) -> None:
        """Refuse to be saved: the experts are in the backend's layout, not parameters, and a ``state_dict`` without
        them would save a model that loads with its MoE blocks missing."""
        raise RuntimeError(
            f"{prefix.rstrip('.') or 'block'}: a swapped {self.family} block holds its experts in its backend's layout, "
            "not as parameters; take the model's state_dict before swap_moe_blocks"
        )

    def _load_from_state_dict(
        self,
        state_dict: Mapping[str, object],
        prefix: str,
        local_metadata: object,
        strict: object,
        missing_keys: list[str],
        unexpected_keys: list[str],
        error_msgs: list[str],
    ) -> None:
        """Refuse tensors for this block (loading after the swap would leave the converted experts stale)."""
        ours = [key for key in state_dict if key.startswith(prefix)]
        if ours:
            raise RuntimeError(
                f"{prefix.rstrip('.')}: a swapped {self.family} block cannot take {ours[0]!r} (and {len(ours) - 1} more): "
                "load the weights before swap_moe_blocks, which converts them once"
            )

    def extra_repr(self) -> str:
        """The family, the layer's sizes and semantics, the backend chosen and what computes the routing."""
        config = self.layer.config
        return (
            f"family={self.family}, experts={config.num_experts}, top_k={config.top_k}, "
            f"activation={config.activation.value}, routing={config.routing_method.value}, {self.layer.backend}, "
            f"{self.layer.routing}"
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
    post_norm: nn.Module | None = None
    """A norm the block applies to its whole output (routed plus shared), kept as transformers' module."""

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


def _checked_activation(block: nn.Module, config: object, field: str = "hidden_act", module: str = "experts") -> Activation:
    """The config's activation ``field``, checked against the block's ``module``'s own ``act_fn`` (:func:`_probed`): a
    sub-model (Qwen3-Omni's talker) may name its activation in a config other than the text config read here, and a
    config edited after the modules were built (``config.update``) names another than they compute."""
    return _probed(block, _hidden_act(_get(config, field, str)), f"{module}.act_fn")


def _probed(block: nn.Module, activation: Activation, path: str) -> Activation:
    """``activation``, checked on probe values against the block's activation module at the dotted ``path`` where it
    holds one (JetMoE's ``activation``, DBRX's ``experts.mlp.activation_fn``)."""
    act_fn: object = block
    for name in path.split("."):
        act_fn = getattr(act_fn, name, None)
    if isinstance(act_fn, nn.Module) and activation.gated:
        # in float64: transformers' erf-formula GELU (gelu_python) is 5e-7 off F.gelu in float32 (adversarial pass 20,
        # d11), where tanh-GELU is 5e-4 off the erf one; 1e-9 still tells every covered pair apart
        probe = torch.linspace(-6.0, 6.0, 49, dtype=torch.float64)
        with torch.no_grad():
            got, want = act_fn(probe), activation.apply(torch.cat((probe, torch.ones_like(probe))))
        if not torch.allclose(got, want, rtol=1e-9, atol=1e-9):
            raise ValueError(f"{path}: {type(act_fn).__name__} does not compute the config's {activation.value}")
    return activation


def _linear(owner: object, path: str) -> torch.Tensor:
    """The weight of the bias-free ``nn.Linear`` at ``path``; a ValueError where it has a bias."""
    linear = _get(owner, path, nn.Linear)
    if getattr(linear, "bias", None) is not None:  # typed as a Tensor, None where built with bias=False
        raise ValueError(f"{type(owner).__name__}.{path}: a linear layer with a bias is not covered here")
    return linear.weight.detach()


def _mlp(owner: object, path: str, activation: ExpertActivation, gate: torch.Tensor | None = None) -> SharedExpert:
    """A transformers dense MLP (bias-free ``gate_proj``, ``up_proj``, ``down_proj``) as a shared expert."""
    return SharedExpert.from_projections(
        gate=_linear(owner, f"{path}.gate_proj"), up=_linear(owner, f"{path}.up_proj"),
        down=_linear(owner, f"{path}.down_proj"), activation=activation, output_gate=gate,
    )


def _shared(block: nn.Module, path: str, activation: ExpertActivation) -> SharedExpert | None:
    """The block's ungated shared expert at ``path``, or None where it has none."""
    return _mlp(block, path, activation) if isinstance(getattr(block, path, None), nn.Module) else None


def _biased_sigmoid(
    *,
    top_k: int,
    activation: ExpertActivation,
    weights: DenseMoeWeights,
    router: Router,
    renormalize: bool = True,
    scale: float = 1.0,
    shared: SharedExpert | None = None,
) -> BlockParts:
    """Sigmoid scores, the top-k of the scores plus a correction bias, each weight its uncorrected score
    (renormalized, then scaled): DeepSeek-V3's grouped top-k with one group (every expert kept)."""
    return BlockParts(
        top_k=top_k,
        activation=activation,
        routing=GroupedTopK(n_group=1, topk_group=1, renormalize=renormalize),
        router=router,
        weights=weights,
        routed_scaling_factor=scale,
        shared_expert=shared,
    )


def _experts(block: nn.Module) -> DenseMoeWeights:
    """transformers' 3-d experts: ``gate_up_proj [E, 2I, H]`` (gate then up), ``down_proj [E, H, I]``."""
    return DenseMoeWeights(w13=_tensor(block, "experts.gate_up_proj"), w2=_tensor(block, "experts.down_proj"))


def _softmax_family(
    router: str = "gate", renormalize: bool | None = None, float32_router: bool = False
) -> Callable[[nn.Module, object], BlockParts]:
    """The reader of a softmax top-k family (Mixtral, Qwen, OLMoE, Granite, ...): renormalized as fixed here, or
    as the router's ``norm_topk_prob`` says; a ``shared_expert`` scaled by ``sigmoid(shared_expert_gate)`` where the
    block has one (Qwen2-MoE, Qwen3-Next, Qwen3.5-MoE). Top-k of the logits then softmax (Granite) is
    renormalized softmax top-k, computed the same way. The router runs in the weights' dtype, or in float32 where
    the family's does (``float32_router``: LaRA-mini)."""

    def read(block: nn.Module, config: object) -> BlockParts:
        activation = _checked_activation(block, config)
        shared = None
        if hasattr(block, "shared_expert"):  # gated by sigmoid(shared_expert_gate) where the block has one
            gate = _tensor(block, "shared_expert_gate.weight") if hasattr(block, "shared_expert_gate") else None
            shared = _mlp(block, "shared_expert", activation, gate=gate)
        norm = _get(block, f"{router}.norm_topk_prob", bool) if renormalize is None else renormalize
        weight = _tensor(block, f"{router}.weight")
        return BlockParts(
            top_k=_get(block, f"{router}.top_k", int),
            activation=activation,
            routing=RoutingMethod.TOPK_RENORMALIZE if norm else RoutingMethod.SOFTMAX_TOPK,
            router=Router(weight=weight.float() if float32_router else weight),
            weights=_experts(block),
            shared_expert=shared,
        )

    return read


def _dbrx(block: nn.Module, config: object) -> BlockParts:
    """DBRX: ``w1``/``v1``/``w2`` stacked as ``[E * I, H]``; softmax top-k, then divided by the weights' p-norm."""
    ffn = _get(config, "ffn_config", object)
    norm = getattr(block, "moe_normalize_expert_weights", getattr(ffn, "moe_normalize_expert_weights", None))
    if norm not in (None, 1, 1.0):  # the block's own, which its forward reads (set on a built model: pass 7, c10)
        raise ValueError(f"moe_normalize_expert_weights: expected None or 1 (an L1 norm), got {norm!r}")
    act = _get(ffn, "ffn_act_fn", dict).get("name", "silu")
    experts, hidden = _get(block, "experts.num_experts", int), _get(block, "experts.hidden_size", int)
    stack = (experts, -1, hidden)
    w1, v1 = _tensor(block, "experts.mlp.w1").view(stack), _tensor(block, "experts.mlp.v1").view(stack)
    return BlockParts(
        top_k=_get(block, "top_k", int),
        activation=_probed(block, _hidden_act(act), "experts.mlp.activation_fn"),
        routing=RoutingMethod.SOFTMAX_TOPK if norm is None else RoutingMethod.TOPK_RENORMALIZE,
        router=Router(weight=_tensor(block, "router.layer.weight")),
        weights=DenseMoeWeights(
            w13=torch.cat((w1, v1), dim=1), w2=_tensor(block, "experts.mlp.w2").view(stack).transpose(1, 2)
        ),
    )


def _grouped(
    block: nn.Module, activation: ExpertActivation, weights: DenseMoeWeights, shared: SharedExpert | None
) -> BlockParts:
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
    """DeepSeek-V3's block and its copies (GLM4-MoE, dots.llm1, Kimi Linear, Solar Open, ...); MiMo-V2-Flash's has
    no shared expert."""
    activation = _checked_activation(block, config)
    return _grouped(block, activation, _experts(block), _shared(block, "shared_experts", activation))


def _deepseek_v2(block: nn.Module, config: object) -> BlockParts:
    """DeepSeek-V2's routing of a float32 router, not renormalized, a scaled output, an ungated shared expert:
    ``greedy`` softmax top-k, or ``group_limited_greedy`` (softmax scores, groups ranked by their best score)."""
    method = _get(block, "gate.topk_method", str)
    if method == "greedy":
        routing: Routing = RoutingMethod.SOFTMAX_TOPK
    elif method == "group_limited_greedy":
        routing = GroupedTopK(
            n_group=_get(block, "gate.num_group", int), topk_group=_get(block, "gate.topk_group", int),
            renormalize=False, scoring=Scoring.SOFTMAX, group_score=GroupScore.MAX,
        )
    else:
        raise ValueError(f"topk_method: expected 'greedy' or 'group_limited_greedy', got {method!r}")
    activation = _checked_activation(block, config)
    return BlockParts(
        top_k=_get(block, "gate.top_k", int),
        activation=activation,
        routing=routing,
        router=Router(weight=_tensor(block, "gate.weight").float(), score_correction_bias=None),  # DeepSeek-V2 has none
        weights=_experts(block),
        routed_scaling_factor=_float(block, "gate.routed_scaling_factor"),
        shared_expert=_mlp(block, "shared_experts", activation),
    )


def _ernie4_5_moe(block: nn.Module, config: object) -> BlockParts:
    """ERNIE 4.5: softmax scores of a float32 router, the top-k of the scores plus a correction bias, each weight
    its score divided by ``max(sum, moe_norm_min)``; an ungated shared expert where the block has one."""
    activation = _checked_activation(block, config)
    return BlockParts(
        top_k=_get(block, "gate.top_k", int),
        activation=activation,
        routing=GroupedTopK(
            n_group=1, topk_group=1, renormalize=True, scoring=Scoring.SOFTMAX, sum_floor=_float(block, "gate.norm_min")
        ),
        router=Router(
            weight=_tensor(block, "gate.weight").float(),
            score_correction_bias=_tensor(block, "gate.moe_statics.e_score_correction_bias").float().reshape(-1),
        ),
        weights=_experts(block),
        shared_expert=_shared(block, "shared_experts", activation),
    )


def _nemotron_h(block: nn.Module, config: object) -> BlockParts:
    """Nemotron-H: DeepSeek-V3's routing over non-gated experts (``up_proj [E, I, H]``, ReLU^2) and shared expert."""
    if not isinstance(getattr(block, "fc1_latent_proj", None), nn.Identity):
        raise ValueError("NemotronHMoE.fc1_latent_proj: latent expert projections (moe_latent_size) are not covered")
    if _get(config, "mlp_bias", bool):
        raise ValueError("mlp_bias: a shared expert with biases is not covered")
    activation = _checked_activation(block, config, "mlp_hidden_act")
    if activation is not Activation.RELU2:  # a gated name's experts would be refused by their shapes, not by name
        raise ValueError(
            f"mlp_hidden_act: Nemotron-H's experts are not gated, and of non-gated activations moe-core computes relu2 "
            f"only, got {_get(config, 'mlp_hidden_act', str)!r}"
        )
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


def _sparsemixer_picks(block: nn.Module) -> int:
    """How many experts PhiMoE's router picks per token, asked of the router on a probe: transformers' sparsemixer
    picks two whatever the block's ``top_k`` (``num_experts_per_tok``) says, so the block's field is not read."""
    weight, router = _tensor(block, "router.weight"), _get(block, "router", nn.Module)
    probe = torch.linspace(-1.0, 1.0, 2 * int(weight.shape[1]), dtype=weight.dtype, device=weight.device)
    training = router.training
    router.eval()  # in training mode it samples (and jitters its input), drawing from the caller's random streams
    try:
        with torch.no_grad():
            routed = router.forward(probe.view(2, -1))  # its forward alone: a probe runs none of the caller's hooks
    finally:
        router.train(training)
    picked = routed[-1] if isinstance(routed, tuple) else None
    if not isinstance(picked, torch.Tensor) or picked.dim() != 2:
        raise ValueError(f"{type(block).__name__}.router: expected (logits, weights, experts [T, k]), got {type(routed).__name__}")
    return int(picked.shape[1])


def _phimoe(block: nn.Module, config: object) -> BlockParts:
    return BlockParts(
        top_k=_sparsemixer_picks(block),
        activation=_checked_activation(block, config),
        routing=SparseMixer(jitter_eps=_float(block, "router.router_jitter_noise")),
        router=Router(weight=_tensor(block, "router.weight")),
        weights=_experts(block),
    )


def _llama4(block: nn.Module, config: object) -> BlockParts:
    """Llama 4: sigmoid of the top-k logits scaling each expert's input, transposed experts, a shared expert."""
    activation = _checked_activation(block, config)
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


def _sigmoid_topk(block: nn.Module, config: object) -> BlockParts:
    """Flint: sigmoid top-k of a float32 router, renormalized as ``norm_topk_prob`` says, an ungated shared expert."""
    activation = _checked_activation(block, config)
    return BlockParts(
        top_k=_get(block, "gate.top_k", int),
        activation=activation,
        routing=SigmoidTopK(renormalize=_get(block, "gate.norm_topk_prob", bool)),
        router=Router(weight=_tensor(block, "gate.weight").float()),
        weights=_experts(block),
        shared_expert=_shared(block, "shared_expert", activation),
    )


def _axk1(block: nn.Module, config: object) -> BlockParts:
    """A.X-K1: DeepSeek-V3's block, its output through the block's own RMSNorm (``post_mlp_layernorm``), which the
    swapped block keeps and applies as transformers' module."""
    return attrs.evolve(_deepseek(block, config), post_norm=_get(block, "post_mlp_layernorm", nn.Module))


def _axk2(block: nn.Module, config: object) -> BlockParts:
    """A.X-K2: DeepSeek-V3's block; without expert groups (``n_group`` None) only: its grouped variant fills the
    dropped groups' scores with 0, not -inf, so a negative corrected score ranks below them."""
    if getattr(_get(block, "gate", nn.Module), "num_group", None) is not None:
        raise ValueError("n_group: grouped routing that masks dropped groups with 0.0 is not covered (n_group=None is)")
    activation = _checked_activation(block, config)
    return _biased_sigmoid(
        top_k=_get(block, "gate.top_k", int),
        activation=activation,
        weights=_experts(block),
        router=Router(
            weight=_tensor(block, "gate.weight").float(),
            score_correction_bias=_tensor(block, "gate.e_score_correction_bias").float(),
        ),
        renormalize=_get(block, "gate.norm_topk_prob", bool),
        scale=_float(block, "gate.routed_scaling_factor"),
        shared=_shared(block, "shared_experts", activation),
    )


def _beam(block: nn.Module, config: object) -> BlockParts:
    """Beam: DeepSeek-V3's grouped routing (the scaling factor on the block's output), no shared expert."""
    return BlockParts(
        top_k=_get(block, "gate.top_k", int),
        activation=_checked_activation(block, config),
        routing=GroupedTopK(
            n_group=_get(block, "gate.num_group", int),
            topk_group=_get(block, "gate.topk_group", int),
            renormalize=_get(block, "gate.norm_topk_prob", bool),
        ),
        router=Router(
            weight=_tensor(block, "gate.weight").float(),
            score_correction_bias=_tensor(block, "gate.e_score_correction_bias").float(),
        ),
        weights=_experts(block),
        routed_scaling_factor=_float(block, "routed_scaling_factor"),
    )


def _afmoe(block: nn.Module, config: object) -> BlockParts:
    """AFMoE: sigmoid scores chosen with the block's ``expert_bias``, renormalized, times ``route_scale``."""
    activation = _checked_activation(block, config)
    return _biased_sigmoid(
        top_k=_get(block, "router.top_k", int),
        activation=activation,
        weights=_experts(block),
        router=Router(
            weight=_linear(block, "router.gate"), score_correction_bias=_tensor(block, "expert_bias").float()
        ),
        scale=_float(block, "router.route_scale"),
        shared=_shared(block, "shared_experts", activation),
    )


def _hy_v3(block: nn.Module, config: object) -> BlockParts:
    """Hunyuan V3: sigmoid of a float32 router chosen with the block's correction bias, renormalized, scaled."""
    activation = _checked_activation(block, config)
    return _biased_sigmoid(
        top_k=_get(block, "gate.top_k", int),
        activation=activation,
        weights=_experts(block),
        router=Router(
            weight=_tensor(block, "gate.weight").float(),
            score_correction_bias=_tensor(block, "e_score_correction_bias").float(),
        ),
        scale=_float(block, "gate.router_scaling_factor"),
        shared=_shared(block, "shared_experts", activation),
    )


def _minimax_m2(block: nn.Module, config: object) -> BlockParts:
    """MiniMax-M2: sigmoid scores chosen with the block's correction bias, renormalized, no shared expert."""
    return _biased_sigmoid(
        top_k=_get(block, "gate.top_k", int),
        activation=_checked_activation(block, config),
        weights=_experts(block),
        router=Router(
            weight=_tensor(block, "gate.weight"),
            score_correction_bias=_tensor(block, "e_score_correction_bias").float(),
        ),
    )


def _scaled_biased_sigmoid(block: nn.Module, activation: ExpertActivation, shared: SharedExpert) -> BlockParts:
    """:func:`_biased_sigmoid` read from MiniMax-M2's gate (``gate.top_k``, ``gate.weight``,
    ``gate.e_score_correction_bias``), the output scaled by the block's ``routed_scaling_factor``."""
    return _biased_sigmoid(
        top_k=_get(block, "gate.top_k", int),
        activation=activation,
        weights=_experts(block),
        router=Router(
            weight=_tensor(block, "gate.weight"),
            score_correction_bias=_tensor(block, "gate.e_score_correction_bias").float(),
        ),
        scale=_float(block, "routed_scaling_factor"),
        shared=shared,
    )


def _minimax_m3_vl(block: nn.Module, config: object) -> BlockParts:
    """MiniMax-M3-VL's text model: MiniMax-M2's routing, the output scaled, gpt-oss's clamped SwiGLU in the experts
    and in the shared expert (whose ``gate_up_proj`` is one fused linear, gate rows first)."""
    activation = ClampedSwiglu(alpha=_float(block, "experts.swiglu_alpha"), limit=_float(block, "experts.swiglu_limit"))
    shared_activation = ClampedSwiglu(
        alpha=_float(block, "shared_experts.swiglu_alpha"), limit=_float(block, "shared_experts.swiglu_limit")
    )
    shared = SharedExpert(
        w13=_linear(block, "shared_experts.gate_up_proj"),
        w2=_linear(block, "shared_experts.down_proj"),
        activation=shared_activation,
    )
    return _scaled_biased_sigmoid(block, activation, shared)


def _limited(activation: Activation, limit: float, gate_clamp: GateClamp, path: str) -> ExpertActivation:
    """``activation`` with the SwiGLU limit read at ``path`` (none where it is infinite); only SiLU is limited."""
    if limit == float("inf"):
        return activation
    if activation is not Activation.SILU_GATED:
        raise ValueError(f"{path}: a limit on a {activation.value}-gated MLP is not computed here (only silu's), got {limit}")
    return LimitedSwiglu(limit=limit, gate_clamp=gate_clamp)


def _step3p7(block: nn.Module, config: object) -> BlockParts:
    """Step 3.7: MiniMax-M2's routing, the output scaled, a shared expert; where the layer's ``swiglu_limits`` (or
    ``swiglu_limits_shared``) set one, the experts' (or the shared expert's) SiLU output is clamped from above and the
    up half to ``[-limit, limit]``."""
    activation = _checked_activation(block, config)
    routed, shared = (
        _limited(activation, _float(block, path), GateClamp.AFTER_SILU, path)
        for path in ("experts.limit", "shared_experts.limit")
    )
    return _scaled_biased_sigmoid(block, routed, _mlp(block, "shared_experts", shared))


def _limited_deepseek(shared_limited: bool) -> Callable[[nn.Module, object], BlockParts]:
    """The reader of a DeepSeek-V3-routed block whose experts clamp their gate before the SiLU and their up half to
    ``[-swiglu_limit, swiglu_limit]`` (DeepSeek-V4's experts): GLM-5-Next, whose shared expert is limited the same
    way (``shared_limited``), and HY-V4, whose shared expert is not."""

    def read(block: nn.Module, config: object) -> BlockParts:
        hidden_act = _checked_activation(block, config)
        if hidden_act is not Activation.SILU_GATED:  # the experts compute F.silu whatever hidden_act says
            raise ValueError(f"hidden_act: the limited experts are SiLU-gated, got {hidden_act.value} for the shared expert")
        routed = LimitedSwiglu(limit=_float(block, "experts.swiglu_limit"), gate_clamp=GateClamp.BEFORE_SILU)
        shared = (
            LimitedSwiglu(limit=_float(block, "shared_experts.swiglu_limit"), gate_clamp=GateClamp.BEFORE_SILU)
            if shared_limited
            else hidden_act
        )
        return _grouped(block, routed, _experts(block), _mlp(block, "shared_experts", shared))

    return read


def _laguna(block: nn.Module, config: object) -> BlockParts:
    """Laguna: sigmoid scores chosen with a correction bias, renormalized, the output scaled, a shared expert;
    without router logit soft-capping only."""
    cap = _float(block, "gate.router_logit_softcapping")
    if cap > 0:
        raise ValueError(f"moe_router_logit_softcapping: soft-capped router logits are not covered, got {cap}")
    activation = _checked_activation(block, config)
    return _scaled_biased_sigmoid(block, activation, _mlp(block, "shared_experts", activation))


def _lfm2_moe(block: nn.Module, config: object) -> BlockParts:
    """LFM2-MoE: sigmoid top-k (chosen with ``expert_bias`` where the block has one), renormalized as
    ``norm_topk_prob`` says, scaled; SiLU experts. Its renormalization adds 1e-6 to the sum, which moe-core's
    does not (a relative difference of at most 1e-6 / the sum of the k weights). The router runs in float32:
    transformers' runs in the model's dtype and, in bf16, adds ``expert_bias`` to bf16 sigmoid scores, rounding
    neighbouring scores together (its bf16 block is 0.29 off float32 at 512 tokens on the CPU; float32 routing, 2e-3)."""
    top_k = _get(block, "gate.top_k", int)
    renormalize = _get(block, "gate.norm_topk_prob", bool)
    scale = _float(block, "gate.routed_scaling_factor")
    weight = _tensor(block, "gate.weight").float()
    if not _get(block, "use_expert_bias", bool):
        return BlockParts(
            top_k=top_k,
            activation=Activation.SILU_GATED,
            routing=SigmoidTopK(renormalize=renormalize),
            router=Router(weight=weight),
            weights=_experts(block),
            routed_scaling_factor=scale,
        )
    router = Router(weight=weight, score_correction_bias=_tensor(block, "expert_bias").float())
    return _biased_sigmoid(
        top_k=top_k, activation=Activation.SILU_GATED, weights=_experts(block), router=router,
        renormalize=renormalize, scale=scale,
    )


def _hunyuan_v1_moe(block: nn.Module, config: object) -> BlockParts:
    """Hunyuan-A13B: renormalized softmax top-k of a float32 router (``gate.wg``), an ungated shared MLP."""
    activation = _checked_activation(block, config)
    return BlockParts(
        top_k=_get(block, "gate.top_k", int),
        activation=activation,
        routing=RoutingMethod.TOPK_RENORMALIZE,
        router=Router(weight=_linear(block, "gate.wg")),
        weights=_experts(block),
        shared_expert=_mlp(block, "shared_mlp", activation),
    )


def _aria(block: nn.Module, config: object) -> BlockParts:
    """Aria's text model: top-k of the logits then softmax, transposed experts (``[E, H, 2I]``) with SiLU, a
    shared expert with the config's activation."""
    return BlockParts(
        top_k=_get(block, "router.top_k", int),
        activation=Activation.SILU_GATED,
        routing=RoutingMethod.TOPK_RENORMALIZE,
        router=Router(weight=_tensor(block, "router.weight")),
        weights=DenseMoeWeights(
            w13=_tensor(block, "experts.gate_up_proj").transpose(1, 2),
            w2=_tensor(block, "experts.down_proj").transpose(1, 2),
        ),
        shared_expert=_mlp(block, "shared_experts", _checked_activation(block, config, module="shared_experts")),
    )


def _cohere2_moe(block: nn.Module, config: object) -> BlockParts:
    """Cohere2-MoE: top-k of the logits, then softmax, or sigmoid (renormalized as ``norm_topk_prob`` says);
    shared experts summed with the routed output, or averaged with it (both halved: the scaling factor and
    the shared expert's ``w2``)."""
    activation = _checked_activation(block, config)
    selection = _get(block, "gate.expert_selection_fn", str)
    if selection == "softmax":
        routing: Routing = RoutingMethod.TOPK_RENORMALIZE
    elif selection == "sigmoid":
        routing = SigmoidTopK(renormalize=_get(block, "gate.norm_topk_prob", bool))
    else:
        raise ValueError(f"expert_selection_fn: expected 'softmax' or 'sigmoid', got {selection!r}")
    shared, scale = None, 1.0
    if _get(block, "num_shared_experts", int) > 0:
        shared = _mlp(block, "shared_experts", activation)
        strategy = _get(block, "shared_expert_combination_strategy", str)
        if strategy == "average":
            shared, scale = attrs.evolve(shared, w2=shared.w2 * 0.5), 0.5
        elif strategy != "sum":
            raise ValueError(f"shared_expert_combination_strategy: expected 'sum' or 'average', got {strategy!r}")
    return BlockParts(
        top_k=_get(block, "gate.top_k", int),
        activation=activation,
        routing=routing,
        router=Router(weight=_tensor(block, "gate.weight")),
        weights=_experts(block),
        routed_scaling_factor=scale,
        shared_expert=shared,
    )


def _mistral4(float32_router: bool) -> Callable[[nn.Module, object], BlockParts]:
    """Mistral 4 / Mistral Large 4: softmax scores, grouped top-k (groups ranked by their two best scores; where
    every group is kept, the configs' default of one group, that is plain softmax top-k), renormalized (Mistral 4:
    as ``norm_topk_prob`` says), scaled; an ungated shared expert. Mistral Large 4 computes its router in float32
    (``float32_router``), Mistral 4 in the weights' dtype."""

    def read(block: nn.Module, config: object) -> BlockParts:
        groups, kept = _get(block, "gate.num_group", int), _get(block, "gate.topk_group", int)
        renormalize = getattr(_get(block, "gate", nn.Module), "norm_topk_prob", True)
        routing: Routing = RoutingMethod.TOPK_RENORMALIZE if renormalize else RoutingMethod.SOFTMAX_TOPK
        if kept != groups:
            routing = GroupedTopK(n_group=groups, topk_group=kept, renormalize=renormalize, scoring=Scoring.SOFTMAX)
        activation = _checked_activation(block, config)
        weight = _tensor(block, "gate.weight")
        return BlockParts(
            top_k=_get(block, "gate.top_k", int),
            activation=activation,
            routing=routing,
            router=Router(weight=weight.float() if float32_router else weight, score_correction_bias=None),  # none
            weights=_experts(block),
            routed_scaling_factor=_float(block, "gate.routed_scaling_factor"),
            shared_expert=_mlp(block, "shared_experts", activation),
        )

    return read


def _openai_privacy_filter(block: nn.Module, config: object) -> BlockParts:
    """OpenAI privacy filter: gpt-oss's biased router and clamped SwiGLU, gate and up halves not interleaved; its
    softmax weights divided by k and the output multiplied by k, which is the renormalized top-k; a float32 router."""
    biases = ExpertBiases(w13=_tensor(block, "experts.gate_up_proj_bias"), w2=_tensor(block, "experts.down_proj_bias"))
    return BlockParts(
        top_k=_get(block, "router.top_k", int),
        activation=ClampedSwiglu(alpha=_float(block, "experts.alpha"), limit=_float(block, "experts.limit")),
        routing=RoutingMethod.TOPK_RENORMALIZE,
        router=Router(weight=_tensor(block, "router.weight").float(), bias=_tensor(block, "router.bias").float()),
        weights=DenseMoeWeights(
            w13=_tensor(block, "experts.gate_up_proj").transpose(1, 2),
            w2=_tensor(block, "experts.down_proj").transpose(1, 2),
            biases=biases,
        ),
    )


def _jetmoe(block: nn.Module, config: object) -> BlockParts:
    """JetMoE's MoE MLP: top-k of the logits then softmax; the block's output bias ``[H]`` added once per token,
    which is each expert's ``w2`` bias (the k weights sum to 1)."""
    w13, w2 = _tensor(block, "input_linear.weight"), _tensor(block, "output_linear.weight")
    experts = int(w13.shape[0])
    bias = _tensor(block, "bias")
    biases = ExpertBiases(
        w13=w13.new_zeros(experts, int(w13.shape[1])), w2=bias.unsqueeze(0).expand(experts, -1).contiguous()
    )
    return BlockParts(
        top_k=_get(block, "router.top_k", int),
        activation=_probed(block, _hidden_act(_get(config, "activation_function", str)), "activation"),
        routing=RoutingMethod.TOPK_RENORMALIZE,
        router=Router(weight=_linear(block, "router.layer")),
        weights=DenseMoeWeights(w13=w13, w2=w2, biases=biases),
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
    # Copies of a covered family's block under another name.
    "Qwen4ExpTextSparseMoeBlock": Family("qwen4_exp", _softmax_family()),
    "MellumSparseMoeBlock": Family("mellum", _softmax_family()),
    "Qwen3OmniMoeThinkerTextSparseMoeBlock": Family("qwen3_omni_moe", _softmax_family()),
    "Qwen3OmniMoeTalkerTextSparseMoeBlock": Family("qwen3_omni_moe_talker", _softmax_family()),
    "LaraMiniSparseMoeBlock": Family("lara_mini", _softmax_family(float32_router=True)),
    "BailingHybridMoE": Family("bailing_hybrid", _deepseek),
    "DeepseekV32MoE": Family("deepseek_v32", _deepseek),
    "Dots3NoteTextMoE": Family("dots3_note", _deepseek),
    "ExaoneMoeSparseMoEBlock": Family("exaone_moe", _deepseek),
    "Glm4MoeLiteMoE": Family("glm4_moe_lite", _deepseek),
    "GlmMoeDsaMoE": Family("glm_moe_dsa", _deepseek),
    "KimiLinearMoE": Family("kimi_linear", _deepseek),
    "MiMoV2FlashMoE": Family("mimo_v2_flash", _deepseek),
    "SolarOpenMoE": Family("solar_open", _deepseek),
    "DeepseekOcr2TextMoe": Family("deepseek_ocr2", _deepseek_v2),
    "UnlimitedOcrTextMoe": Family("unlimited_ocr", _deepseek_v2),
    # Routing and experts moe-core computes, read from their own block layouts.
    "AXK1MoE": Family("axk1", _axk1),
    "AXK2MoE": Family("axk2", _axk2),
    "AfmoeSparseMoeBlock": Family("afmoe", _afmoe),
    "AriaTextMoELayer": Family("aria", _aria),
    "BeamMoE": Family("beam", _beam),
    "Cohere2MoeSparseMoeBlock": Family("cohere2_moe", _cohere2_moe),
    "Ernie4_5_MoeSparseMoeBlock": Family("ernie4_5_moe", _ernie4_5_moe),
    "FlintSparseMoeBlock": Family("flint", _sigmoid_topk),
    "HunYuanMoEV1Moe": Family("hunyuan_v1_moe", _hunyuan_v1_moe),
    "HYV3MoE": Family("hy_v3", _hy_v3),
    "JetMoeMoE": Family("jetmoe", _jetmoe),
    "LagunaSparseMoeBlock": Family("laguna", _laguna),
    "Lfm2MoeSparseMoeBlock": Family("lfm2_moe", _lfm2_moe),
    "MiniMaxM2SparseMoeBlock": Family("minimax_m2", _minimax_m2),
    "MiniMaxM3VLSparseMoeBlock": Family("minimax_m3_vl", _minimax_m3_vl),
    "Mistral4MoE": Family("mistral4", _mistral4(float32_router=False)),
    "MistralLarge4TextMoE": Family("mistral_large4", _mistral4(float32_router=True)),
    "OpenAIPrivacyFilterMLP": Family(
        "openai_privacy_filter", _openai_privacy_filter, BlockReturn.WITH_TOPK_WEIGHTS_OVER_K
    ),
    "Step3p7SparseMoeBlock": Family("step3p7", _step3p7),
    "Glm5NextTextMoE": Family("glm5_next", _limited_deepseek(shared_limited=True)),
    "HYV4MoE": Family("hy_v4", _limited_deepseek(shared_limited=False)),
    "HYV4VLMoE": Family("hy_v4_vl", _limited_deepseek(shared_limited=False)),
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
    Returns what was replaced, with each chosen backend (a block that
    several layers share is built once and replaced at each). A ValueError when
    the model has no block of a covered family; nothing is replaced when
    any block cannot be built.
    """
    config = _text_config(model)
    if getattr(config, "output_router_logits", False) is True:
        raise ValueError(
            "config.output_router_logits: a swapped block does not record router logits for transformers' output "
            "hooks (the model would fail inside transformers); set it to False before swap_moe_blocks"
        )
    # every path, a block shared by several layers included (named_modules() lists a shared module once)
    paths = [(path, module) for path, module in model.named_modules(remove_duplicate=False) if type(module).__name__ in FAMILIES]
    blocks = list({id(module): (path, module) for path, module in reversed(paths)}.values())[::-1]
    if not blocks:
        raise ValueError(
            f"model: no sparse MoE block of a covered family in {type(model).__name__} "
            f"(covered: {', '.join(sorted({family.name for family in FAMILIES.values()}))})"
        )
    built = []
    for path, block in blocks:  # every layer built before any block is replaced: a refusal leaves the model as it was
        family = FAMILIES[type(block).__name__]
        _recompute_hooked_weights(block)
        parts = family.read(block, config)
        _refuse_hooks(path, block, parts.post_norm)
        layer = dense_layer(
            parts.config(),
            parts.router,
            parts.weights,
            dtype=parts.weights.w13.dtype,
            device=device,
            backend=backend,
            shared_expert=parts.shared_expert,
        )
        replacement = MoeCoreBlock(layer, family.returns, family.name, parts.weights.w13.dtype, parts.post_norm)
        replacement.train(block.training)
        built.append((block, replacement))
    replacements = {id(block): replacement for block, replacement in built}
    for path, block in paths:
        parent_path, _, name = path.rpartition(".")
        setattr(model.get_submodule(parent_path), name, replacements[id(block)])
    model.register_forward_pre_hook(_refuse_router_logits, with_kwargs=True)
    return tuple(
        SwappedBlock(path, replacements[id(block)].family, replacements[id(block)].layer.backend) for path, block in paths
    )


_WEIGHT_HOOKS = (BasePruningMethod, WeightNorm, SpectralNorm)
"""The pre-hooks that compute a module's weight from its parts, which the swap runs before reading the weight."""

_KNOWN_CODE = ("transformers.", "torch.nn.modules.", *(hook.__module__ for hook in _WEIGHT_HOOKS))
"""Where the forwards and hooks a swap may leave behind come from: transformers' own (its output-capturing hooks record
router logits the swap refuses anyway), torch's standard modules' forwards, and the pruning, weight-norm and
spectral-norm hooks, which the swap runs first (:func:`_recompute_hooked_weights`) so that it reads the weights they
compute. Anything else, torch's own included, is the caller's: quantization-aware modules fake-quantize their weights
in their forward (adversarial pass 16, c04)."""


def _theirs(function: object) -> bool:
    """Whether ``function`` comes from elsewhere than :data:`_KNOWN_CODE` (the caller's, or a torch utility that
    changes what a module computes)."""
    return not str(getattr(function, "__module__", "")).startswith(_KNOWN_CODE)


def _recompute_hooked_weights(block: nn.Module) -> None:
    """Run the pruning, weight-norm and spectral-norm pre-hooks of ``block``'s modules, as the block's next forward
    would first: each writes the weight the swap reads from its parts (the original and the mask, the norm and
    direction, or the original over its spectral norm), which an optimizer step or a load since the last forward left
    stale, and which spectral norm has not written at all before the first forward (adversarial passes 16, c04, and
    17, c08: 5.9e-2 and 1.7e-2 off). In training mode spectral norm's hook takes its power-iteration step, as that
    forward would."""
    with torch.no_grad():
        for module in block.modules():
            for hook in list(module._forward_pre_hooks.values()):
                if isinstance(hook, _WEIGHT_HOOKS):
                    hook(module, ())


def _named(hook: object) -> str:
    """A hook's name: a function's, or a hook object's class (spectral norm's, pruning's)."""
    return str(getattr(hook, "__qualname__", type(hook).__qualname__))


def _refuse_hooks(path: str, block: nn.Module, kept: nn.Module | None) -> None:
    """A ValueError naming what of the caller's would change ``block``'s computation and not run once swapped: a forward
    hook or pre-hook on it or its modules, one registered for every module, or a forward replaced on an instance
    (accelerate's hooks) or on a class (steering, pruning, monitoring, device placement: the model would compute
    without them, silently; adversarial passes 14 and 15: 1.27-1.44 off under a steering hook). ``kept``, a module the
    swapped block calls itself (A.X-K1's post-MLP norm), keeps its hooks."""
    global_hooks = [*module_hooks._global_forward_hooks.values(), *module_hooks._global_forward_pre_hooks.values()]
    theirs = [hook for hook in global_hooks if _theirs(hook)]
    if theirs:
        raise ValueError(
            f"{path}: {len(theirs)} forward hook(s) registered for every module "
            f"({_named(theirs[0])}) would no longer see the block's router and experts once "
            "swapped; remove them before swap_moe_blocks"
        )
    for name, module in block.named_modules():
        if kept is not None and any(module is inner for inner in kept.modules()):
            continue
        where = f"{path}.{name}" if name else path
        hooks = [hook for hook in (*module._forward_hooks.values(), *module._forward_pre_hooks.values()) if _theirs(hook)]
        if hooks:
            raise ValueError(
                f"{where}: has {len(hooks)} forward hook(s) or pre-hook(s) ({_named(hooks[0])}), "
                "which the swapped block would not run; remove them before swap_moe_blocks and register them on the "
                "swapped block"
            )
        on_instance = "forward" in vars(module)
        if on_instance or _theirs(type(module).forward):
            raise ValueError(
                f"{where}: its forward was replaced (on the {'instance' if on_instance else 'class'}, as "
                "accelerate's hooks or a patch do), which the swapped block would not run; swap the model as "
                "transformers builds it"
            )


def _refuse_router_logits(
    model: nn.Module, args: tuple[object, ...], kwargs: dict[str, object]
) -> tuple[tuple[object, ...], dict[str, object]] | None:
    """A swapped model's forward hook: ``output_router_logits=True`` asked per call, or by the model's config after the
    swap (which refuses the flag; adversarial pass 20, d02b), as transformers reads it: the call's, else the
    config's (transformers failed inside its load-balancing loss with a raw ``IndexError``)."""
    asked = kwargs.get("output_router_logits")
    if asked is None:
        asked = getattr(getattr(model, "config", None), "output_router_logits", None)
        where = "config.output_router_logits=True (set after the swap)"
    else:
        where = f"{type(model).__name__}(output_router_logits=True)"
    if asked is True:
        raise ValueError(
            f"{where}: its MoE blocks were swapped for moe-core layers, which record no router logits for "
            "transformers' load-balancing loss; call it without output_router_logits"
        )
    return None
