"""A backend from outside this repo registers, converts from a canonical format and is chosen like ours."""

import attrs
import torch
from typing_extensions import assert_type

from moe_core import (
    DENSE,
    BackendKey,
    Conversion,
    DenseMoeWeights,
    DeviceSpec,
    DispatchFormat,
    DispatchOutput,
    FormatRoute,
    LayerSpec,
    MoeForward,
    MoeRunnerConfig,
    Priority,
    Runner,
    Support,
    Tier,
    check_run_inputs,
    create_runner,
    register_backend,
    select_backend,
)
from moe_core.backends.reference import REFERENCE_DENSE


@attrs.frozen
class ScaledIdentityQuantInfo:
    """A toy backend's quant info: each expert multiplies by one factor."""

    factors: torch.Tensor
    hidden_size: int
    intermediate_size: int

    @property
    def num_experts(self) -> int:
        return int(self.factors.shape[0])

    @property
    def device(self) -> torch.device:
        return self.factors.device


@attrs.frozen
class ScaledIdentityRunner:
    config: MoeRunnerConfig

    def run(self, dispatch: DispatchOutput, quant_info: ScaledIdentityQuantInfo, /) -> torch.Tensor:
        check_run_inputs(self.config, dispatch, quant_info, (DispatchFormat.STANDARD,))
        factor = quant_info.factors[dispatch.topk.topk_ids.long()] * dispatch.topk.topk_weights
        return dispatch.hidden_states * factor.sum(dim=1, keepdim=True).to(dispatch.hidden_states.dtype)


def cpu_only(device: DeviceSpec, layer: LayerSpec) -> Support:
    if device.kind != "cpu":
        return Support.no(f"runs on the CPU only, not {device.kind}")
    return Support.yes()


def from_dense(weights: DenseMoeWeights) -> ScaledIdentityQuantInfo:
    """The toy's once-after-loading step: each expert's mean down-projection weight."""
    return ScaledIdentityQuantInfo(weights.w2.mean(dim=(1, 2)), weights.hidden_size, weights.intermediate_size)


def register() -> BackendKey[ScaledIdentityQuantInfo]:
    """Register the toy backend (once per process) and return its key."""
    key = register_backend(
        "example-scaled-identity",
        description="toy third-party backend",
        factory=ScaledIdentityRunner,
        supports=cpu_only,
        priority=Priority(Tier.FALLBACK),
        conversions=[Conversion(DENSE, from_dense)],
    )
    assert_type(key, BackendKey[ScaledIdentityQuantInfo])
    return key


def runner_for(key: BackendKey[ScaledIdentityQuantInfo], config: MoeRunnerConfig) -> Runner[ScaledIdentityQuantInfo]:
    return create_runner(key, config)


def choose(
    key: BackendKey[ScaledIdentityQuantInfo], config: MoeRunnerConfig, weights: DenseMoeWeights, flag: str | None
) -> MoeForward:
    """Backends of different quant info types fed from one format are chosen among by name, as routes."""
    routes: list[FormatRoute[DenseMoeWeights]] = [key.route(DENSE), REFERENCE_DENSE.route(DENSE)]
    selection = select_backend(routes, torch.device("cpu"), LayerSpec(config, DENSE), name=flag)
    return selection.chosen.bind(config, weights)
