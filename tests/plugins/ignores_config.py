"""A plugin that claims every config yet computes only the default one, for the tests of ``moe-core check``'s variants.

Importing this module registers two dense backends: one that always computes
gated SiLU, whatever the config's activation, and one that drops the routed
scaling factor. Both answer ``supports`` with ok for any layer.
"""

from __future__ import annotations

import attrs
import torch

from moe_core import DENSE, Activation, Conversion, DenseMoeWeights, DispatchOutput, MoeRunnerConfig, register_backend
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
class UnscaledRunner:
    """The dense reference, with the routed scaling factor dropped."""

    config: MoeRunnerConfig

    def run(self, dispatch: DispatchOutput, quant_info: DenseMoeWeights, /) -> torch.Tensor:
        unscaled = attrs.evolve(self.config, routed_scaling_factor=1.0)
        return REFERENCE_DENSE.factory(unscaled).run(dispatch, quant_info)


register_backend(
    "ignores-activation",
    description="claims every activation, computes gated SiLU",
    factory=AlwaysSiluRunner,
    supports=reference_supports,
    priority=ORACLE,
    conversions=[Conversion(DENSE, _as_is)],
)
register_backend(
    "ignores-scaling-factor",
    description="claims every routed scaling factor, applies none",
    factory=UnscaledRunner,
    supports=reference_supports,
    priority=ORACLE,
    conversions=[Conversion(DENSE, _as_is)],
)
