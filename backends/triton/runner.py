"""The Triton backend's one runner, generic over its typed plan: sort the tokens, two grouped GEMMs, the combine.

``TritonRunner(config, plan)`` is a ``Runner[Q]`` for the plan's quant info
type ``Q`` (:mod:`.plans`: one plan per weight format). ``run`` checks the
dispatch and quant info from metadata only, allocates its buffers from the
caching allocator and reads nothing back to the host, so a forward can be
captured in a CUDA graph and replayed.
"""

from __future__ import annotations

from typing import Generic, TypeVar, final

import attrs
import torch

from moe_core import DispatchFormat, DispatchOutput, MoeRunnerConfig, check_run_inputs
from moe_core.backends.triton.launch import fused_moe
from moe_core.backends.triton.plans import TritonPlan
from moe_core.runner import QuantInfo

Q = TypeVar("Q", bound=QuantInfo)


@final
@attrs.frozen
class TritonRunner(Generic[Q]):
    """Experts of one weight format through the fused Triton kernels, as ``plan`` launches its quant info."""

    config: MoeRunnerConfig
    plan: TritonPlan[Q]

    def __attrs_post_init__(self) -> None:
        """Refuse what no plan computes, for runners made by key (``create_runner``, ``key.bind``), which selection's
        ``supports`` never saw."""
        if self.config.routing_method.scales_input:
            raise ValueError(
                f"Triton fused MoE: its kernels weight each expert's output, not its input "
                f"({self.config.routing_method.value} routing)"
            )

    def run(self, dispatch: DispatchOutput, quant_info: Q, /) -> torch.Tensor:
        """The ``[T, H]`` MoE output in the activations' dtype."""
        check_run_inputs(self.config, dispatch, quant_info, (DispatchFormat.STANDARD,))
        self.plan.check(self.config, quant_info)
        launches = self.plan.launches(self.config, dispatch, quant_info)
        return fused_moe(self.config, dispatch, launches.w13, launches.w2, launches.inputs)
