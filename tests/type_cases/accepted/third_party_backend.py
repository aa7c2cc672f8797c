"""A backend from outside this repo registers and dispatches like ours do."""

import attrs
import torch
from typing_extensions import assert_type

from moe_core import (
    Availability,
    BackendKey,
    DispatchFormat,
    DispatchOutput,
    MoeRunnerConfig,
    Runner,
    check_run_inputs,
    create_runner,
    register_backend,
)


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

    def run(self, dispatch: DispatchOutput, quant_info: ScaledIdentityQuantInfo) -> torch.Tensor:
        check_run_inputs(self.config, dispatch, quant_info, (DispatchFormat.STANDARD,))
        factor = quant_info.factors[dispatch.topk.topk_ids.long()] * dispatch.topk.topk_weights
        return dispatch.hidden_states * factor.sum(dim=1, keepdim=True).to(dispatch.hidden_states.dtype)


def cpu_only(device: torch.device) -> Availability:
    if device.type != "cpu":
        return Availability.unavailable(f"runs on the CPU only, not {device.type}")
    return Availability.available()


def register() -> BackendKey[ScaledIdentityQuantInfo]:
    """Register the toy backend (once per process) and return its key."""
    key = register_backend(
        "example-scaled-identity",
        description="toy third-party backend",
        factory=ScaledIdentityRunner,
        availability=cpu_only,
    )
    assert_type(key, BackendKey[ScaledIdentityQuantInfo])
    return key


def runner_for(key: BackendKey[ScaledIdentityQuantInfo], config: MoeRunnerConfig) -> Runner[ScaledIdentityQuantInfo]:
    return create_runner(key, config)
