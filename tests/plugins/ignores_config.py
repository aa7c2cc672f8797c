"""A plugin that claims every config yet computes only the default one, for the tests of ``moe-core check``'s variants.

Importing this module registers eleven dense backends: one that always
computes gated SiLU, whatever the config's activation, one that computes the
config's activation without its limits (the clamped and limited SwiGLUs),
one that drops the routed scaling factor, one that drops the experts'
biases, one that weights every expert's output by its top-k weight whatever
the routing method (Llama 4's weights scale the expert's input), one that
skips slots of small weight, one that is wrong past 48 tokens, and four more
(adversarial pass 19): one taking its experts to be the layer's last ones, one
wrong on small batches, one routing again from the logits a top-k carries,
and one computing two slots a token. All answer ``supports`` with ok for any
layer.
"""

from __future__ import annotations

from collections.abc import Callable

import attrs
import torch

from moe_core import (
    DENSE,
    Activation,
    ClampedSwiglu,
    Conversion,
    DenseMoeWeights,
    DispatchOutput,
    LimitedSwiglu,
    MoeRunnerConfig,
    Runner,
    SigmoidTopK,
    StandardDispatchOutput,
    TopKOutput,
    register_backend,
    select_experts,
)
from moe_core.backends.reference import ORACLE, REFERENCE_DENSE, reference_supports


def _as_is(weights: DenseMoeWeights) -> DenseMoeWeights:
    return weights


@attrs.frozen
class AlwaysSiluRunner:
    """The dense reference, with the config's activation replaced by gated SiLU."""

    config: MoeRunnerConfig

    def run(self, dispatch: DispatchOutput, quant_info: DenseMoeWeights, /) -> torch.Tensor:
        silu = attrs.evolve(self.config, activation=Activation.SILU_GATED)
        return REFERENCE_DENSE.factory(silu).run(dispatch, quant_info)


@attrs.frozen
class UnlimitedRunner:
    """The dense reference, with the activation's limit (if it has one) raised far past every pre-activation."""

    config: MoeRunnerConfig

    def run(self, dispatch: DispatchOutput, quant_info: DenseMoeWeights, /) -> torch.Tensor:
        config = self.config
        if isinstance(config.activation, (ClampedSwiglu, LimitedSwiglu)):
            config = attrs.evolve(config, activation=attrs.evolve(config.activation, limit=1e4))
        return REFERENCE_DENSE.factory(config).run(dispatch, quant_info)


@attrs.frozen
class UnscaledRunner:
    """The dense reference, with the routed scaling factor dropped."""

    config: MoeRunnerConfig

    def run(self, dispatch: DispatchOutput, quant_info: DenseMoeWeights, /) -> torch.Tensor:
        unscaled = attrs.evolve(self.config, routed_scaling_factor=1.0)
        return REFERENCE_DENSE.factory(unscaled).run(dispatch, quant_info)


@attrs.frozen
class UnbiasedRunner:
    """The dense reference, with the experts' biases dropped."""

    config: MoeRunnerConfig

    def run(self, dispatch: DispatchOutput, quant_info: DenseMoeWeights, /) -> torch.Tensor:
        unbiased = attrs.evolve(self.config, expert_biases=False)
        return REFERENCE_DENSE.factory(unbiased).run(dispatch, DenseMoeWeights(w13=quant_info.w13, w2=quant_info.w2))


@attrs.frozen
class OutputWeightingRunner:
    """The dense reference, with the routing method taken as one that weights the experts' outputs."""

    config: MoeRunnerConfig

    def run(self, dispatch: DispatchOutput, quant_info: DenseMoeWeights, /) -> torch.Tensor:
        weighted = self.config
        if self.config.routing_method.scales_input:
            weighted = attrs.evolve(self.config, routing_method=SigmoidTopK(renormalize=False))
        return REFERENCE_DENSE.factory(weighted).run(dispatch, quant_info)


SMALL_WEIGHT = 0.1
"""Slots weighted less than this are dropped by :class:`SmallSlotDroppingRunner`."""


@attrs.frozen
class SmallSlotDroppingRunner:
    """The dense reference, with the slots of top-k weight under :data:`SMALL_WEIGHT` skipped (a "fast path" that
    is right wherever the routing is confident: adversarial pass 6, c13)."""

    config: MoeRunnerConfig

    def run(self, dispatch: DispatchOutput, quant_info: DenseMoeWeights, /) -> torch.Tensor:
        topk = dispatch.topk
        kept = torch.where(topk.topk_weights < SMALL_WEIGHT, torch.zeros_like(topk.topk_weights), topk.topk_weights)
        pruned = StandardDispatchOutput(
            dispatch.hidden_states, TopKOutput(topk.topk_ids, kept, num_experts=topk.num_experts, check_values=False)
        )
        return REFERENCE_DENSE.factory(self.config).run(pruned, quant_info)


CHUNK_TOKENS = 48
"""Tokens :class:`ChunkingRunner` computes right: those past it it takes from the first chunk's outputs."""


@attrs.frozen
class ChunkingRunner:
    """The dense reference on the first :data:`CHUNK_TOKENS` tokens, whose outputs it repeats for the rest (a chunk
    loop that never advanced: adversarial pass 6, c29, wrong only past the check's own token count)."""

    config: MoeRunnerConfig

    def run(self, dispatch: DispatchOutput, quant_info: DenseMoeWeights, /) -> torch.Tensor:
        out = REFERENCE_DENSE.factory(self.config).run(dispatch, quant_info)
        tokens = out.shape[0]
        if tokens <= CHUNK_TOKENS:
            return out
        return out[torch.arange(tokens, device=out.device) % CHUNK_TOKENS].contiguous()


def _reweighted(dispatch: DispatchOutput, weights: torch.Tensor) -> StandardDispatchOutput:
    topk = dispatch.topk
    return StandardDispatchOutput(
        dispatch.hidden_states, TopKOutput(topk.topk_ids, weights, num_experts=topk.num_experts, check_values=False)
    )


@attrs.frozen
class LastExpertsRunner:
    """The dense reference, taking this rank's experts to be the layer's last ones whatever its offset (right for one
    rank of two, wrong elsewhere: adversarial pass 19, k01)."""

    config: MoeRunnerConfig

    def run(self, dispatch: DispatchOutput, quant_info: DenseMoeWeights, /) -> torch.Tensor:
        last = attrs.evolve(self.config, local_expert_offset=self.config.num_experts - self.config.num_local_experts)
        return REFERENCE_DENSE.factory(last).run(dispatch, quant_info)


@attrs.frozen
class SmallBatchRunner:
    """The dense reference, with a "small batch path" (2 to 32 tokens) that drops each token's last slot."""

    config: MoeRunnerConfig

    def run(self, dispatch: DispatchOutput, quant_info: DenseMoeWeights, /) -> torch.Tensor:
        topk = dispatch.topk
        if 2 <= topk.num_tokens <= 32 and topk.top_k > 1:
            weights = topk.topk_weights.clone()
            weights[:, -1] = 0
            dispatch = _reweighted(dispatch, weights)
        return REFERENCE_DENSE.factory(self.config).run(dispatch, quant_info)


@attrs.frozen
class RoutingAgainRunner:
    """The dense reference on the top-k routed again from the router logits a top-k carries, edited or not."""

    config: MoeRunnerConfig

    def run(self, dispatch: DispatchOutput, quant_info: DenseMoeWeights, /) -> torch.Tensor:
        logits = dispatch.topk.router_logits
        if logits is not None:
            dispatch = StandardDispatchOutput(dispatch.hidden_states, select_experts(logits, self.config, score_correction_bias=None))
        return REFERENCE_DENSE.factory(self.config).run(dispatch, quant_info)


@attrs.frozen
class TopTwoRunner:
    """The dense reference over each token's first two slots only (a top-2 kernel), whatever the top-k."""

    config: MoeRunnerConfig

    def run(self, dispatch: DispatchOutput, quant_info: DenseMoeWeights, /) -> torch.Tensor:
        weights = dispatch.topk.topk_weights.clone()
        weights[:, 2:] = 0
        return REFERENCE_DENSE.factory(self.config).run(_reweighted(dispatch, weights), quant_info)


IGNORING: tuple[tuple[str, str, Callable[[MoeRunnerConfig], Runner[DenseMoeWeights]]], ...] = (
    ("ignores-activation", "claims every activation, computes gated SiLU", AlwaysSiluRunner),
    ("ignores-limits", "claims every activation, computes the clamped and limited SwiGLUs without their limits",
     UnlimitedRunner),
    ("ignores-scaling-factor", "claims every routed scaling factor, applies none", UnscaledRunner),
    ("ignores-biases", "claims expert biases, adds none", UnbiasedRunner),
    ("ignores-routing", "claims every routing method, weights every expert's output", OutputWeightingRunner),
    ("drops-small-slots", f"skips slots weighted under {SMALL_WEIGHT}", SmallSlotDroppingRunner),
    ("chunks-wrong", f"right on {CHUNK_TOKENS} tokens, repeats them past that", ChunkingRunner),
    ("ignores-expert-offset", "takes its experts to be the layer's last ones", LastExpertsRunner),
    ("ignores-small-batches", "drops each token's last slot on 2 to 32 tokens", SmallBatchRunner),
    ("ignores-topk-edits", "routes again from the router logits a top-k carries", RoutingAgainRunner),
    ("ignores-extra-slots", "computes each token's first two slots only", TopTwoRunner),
)
"""Each plugin's name, what it claims and computes, and its runner."""

for name, description, factory in IGNORING:
    register_backend(
        name,
        description=description,
        factory=factory,
        supports=reference_supports,
        priority=ORACLE,
        conversions=[Conversion(DENSE, _as_is)],
    )
