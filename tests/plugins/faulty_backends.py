"""Backends that misbehave as real plugins do, for the tests of ``moe-core info`` and ``check``.

Importing this module registers them: one whose supports check raises,
and two whose outputs have the wrong shape (one broadcastable, one not).
"""

from __future__ import annotations

import attrs
import torch

from moe_core import NVFP4, Conversion, DeviceSpec, DispatchOutput, LayerSpec, MoeRunnerConfig, Nvfp4MoeWeights, Support, register_backend
from moe_core.backends.reference import ORACLE, REFERENCE_NVFP4, reference_supports


def _as_is(weights: Nvfp4MoeWeights) -> Nvfp4MoeWeights:
    return weights


def _raising_supports(device: DeviceSpec, layer: LayerSpec) -> Support:
    raise RuntimeError("driver probe crashed")


@attrs.frozen
class FirstRowRunner:
    """Returns only the first token's row: ``[1, H]``, which broadcasts against ``[T, H]``."""

    config: MoeRunnerConfig

    def run(self, dispatch: DispatchOutput, quant_info: Nvfp4MoeWeights, /) -> torch.Tensor:
        return REFERENCE_NVFP4.factory(self.config).run(dispatch, quant_info)[:1]


@attrs.frozen
class ExtraColumnRunner:
    """Returns ``[T, H + 1]``."""

    config: MoeRunnerConfig

    def run(self, dispatch: DispatchOutput, quant_info: Nvfp4MoeWeights, /) -> torch.Tensor:
        out = REFERENCE_NVFP4.factory(self.config).run(dispatch, quant_info)
        return torch.cat((out, out[:, :1]), dim=1)


register_backend(
    "faulty-supports",
    description="supports check raises",
    factory=REFERENCE_NVFP4.factory,
    supports=_raising_supports,
    priority=ORACLE,
    conversions=[Conversion(NVFP4, _as_is)],
)
register_backend(
    "faulty-broadcast-shape",
    description="returns [1, H]",
    factory=FirstRowRunner,
    supports=reference_supports,
    priority=ORACLE,
    conversions=[Conversion(NVFP4, _as_is)],
)
register_backend(
    "faulty-wrong-shape",
    description="returns [T, H + 1]",
    factory=ExtraColumnRunner,
    supports=reference_supports,
    priority=ORACLE,
    conversions=[Conversion(NVFP4, _as_is)],
)
