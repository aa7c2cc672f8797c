"""A plugin that claims every config yet computes only the default one, for the tests of ``moe-core check``'s variants.

Importing this module registers five dense backends: one that always
computes gated SiLU, whatever the config's activation, one that computes the
config's activation without its limits (the clamped and limited SwiGLUs),
one that drops the routed scaling factor, one that drops the experts'
biases, and one that weights every
expert's output by its top-k weight whatever the routing method (Llama 4's
weights scale the expert's input). All answer ``supports`` with ok for any
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
    register_backend,
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


IGNORING: tuple[tuple[str, str, Callable[[MoeRunnerConfig], Runner[DenseMoeWeights]]], ...] = (
    ("ignores-activation", "claims every activation, computes gated SiLU", AlwaysSiluRunner),
    ("ignores-limits", "claims every activation, computes the clamped and limited SwiGLUs without their limits",
     UnlimitedRunner),
    ("ignores-scaling-factor", "claims every routed scaling factor, applies none", UnscaledRunner),
    ("ignores-biases", "claims expert biases, adds none", UnbiasedRunner),
    ("ignores-routing", "claims every routing method, weights every expert's output", OutputWeightingRunner),
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
