"""An MoE layer over expert-parallel ranks: dispatch, this rank's forward, combine."""

from __future__ import annotations

from collections.abc import Callable
from typing import Generic, final

import attrs
import torch

from moe_core.config import MoeRunnerConfig, config_differences
from moe_core.dispatch import StandardDispatchOutput, TopKOutput
from moe_core.distributed.protocol import FormatT, HandleT, TokenDispatcher
from moe_core.registry import BoundRunner
from moe_core.runner import check_run_values


def _bound_config(forward: object) -> MoeRunnerConfig | None:
    """The config ``forward`` was bound for, where it says: a bound runner's, a scheme's ``apply``'s; None for
    another callable (a lambda around a runner)."""
    if isinstance(forward, BoundRunner):
        return forward.runner.config
    config = getattr(getattr(forward, "__self__", None), "config", None)
    return config if isinstance(config, MoeRunnerConfig) else None


@final
@attrs.frozen(eq=False)
class ExpertParallelMoe(Generic[FormatT, HandleT]):
    """``combine(forward(dispatch(tokens)))`` on each rank; world size 1 is the same walk with a local dispatcher.

    ``forward`` runs this rank's experts on what ``dispatcher`` delivers (a
    bound runner, e.g. ``lambda d: runner.run(d, local_weights)`` with
    ``runner = create_runner(key, dispatcher.runner_config(config))``); its
    parameter type must take the dispatcher's format, so mypy refuses a
    forward written for another one, and a forward that says its config (a
    bound runner, a scheme's ``apply``) must have been bound for
    ``dispatcher.runner_config(config)``. ``config`` is the whole layer's (every
    expert, the routing method): a top-k built with ``check_values`` is
    checked against it before the tokens leave (ids, and the weights the
    routing method gives), as a single-rank layer's bound forward does; the
    slot rows a dispatcher delivers cannot say what their token's weights
    summed to. Build a layer per rank once; calls hold no state between them.
    """

    dispatcher: TokenDispatcher[FormatT, HandleT]
    forward: Callable[[FormatT], torch.Tensor]
    config: MoeRunnerConfig = attrs.field(kw_only=True)

    def __attrs_post_init__(self) -> None:
        if not isinstance(self.config, MoeRunnerConfig):
            raise TypeError(f"ExpertParallelMoe.config: expected a MoeRunnerConfig, got {type(self.config).__name__}")
        if self.config.num_local_experts != self.config.num_experts:
            raise ValueError(
                "ExpertParallelMoe.config: expected the whole layer's config (every expert local; the dispatcher "
                f"gives each rank its own), got experts [{self.config.local_expert_offset}, "
                f"{self.config.local_expert_offset + self.config.num_local_experts}) of {self.config.num_experts}"
            )
        bound = _bound_config(self.forward)
        if bound is not None:
            differ = config_differences(bound, self.dispatcher.runner_config(self.config), "the dispatcher's")
            if differ:
                raise ValueError(
                    "ExpertParallelMoe.forward: bound for another config than this rank's part of the layer "
                    f"(dispatcher.runner_config(config)): {'; '.join(differ)}"
                )

    def __call__(self, hidden_states: torch.Tensor, topk: TopKOutput) -> torch.Tensor:
        """This rank's ``[T, H]`` output for its tokens ``hidden_states [T, H]`` routed by ``topk``."""
        if topk.check_values:
            check_run_values(self.config, StandardDispatchOutput(hidden_states, topk))
        dispatched = self.dispatcher.dispatch(hidden_states, topk)
        out = self.forward(dispatched.dispatch)
        if isinstance(out, torch.Tensor) and out.dtype != hidden_states.dtype:
            # the combine sends raw bytes, read on every rank as its own output's dtype: another rank would read these
            # fp16 bytes as bf16 (0.92 off) or fail inside the collective (adversarial pass 19, e02c)
            raise ValueError(
                f"ExpertParallelMoe.forward: returned {out.dtype} rows for {hidden_states.dtype} tokens; a forward "
                "returns its slot rows in the activations' dtype"
            )
        return self.dispatcher.combine(out, dispatched.handle)
