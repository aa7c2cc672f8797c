"""An MoE layer over expert-parallel ranks: dispatch, this rank's forward, combine."""

from __future__ import annotations

from collections.abc import Callable
from typing import Generic, final

import attrs
import torch

from moe_core.dispatch import TopKOutput
from moe_core.distributed.protocol import FormatT, HandleT, TokenDispatcher


@final
@attrs.frozen(eq=False)
class ExpertParallelMoe(Generic[FormatT, HandleT]):
    """``combine(forward(dispatch(tokens)))`` on each rank; world size 1 is the same walk with a local dispatcher.

    ``forward`` runs this rank's experts on what ``dispatcher`` delivers (a
    bound runner, e.g. ``lambda d: runner.run(d, local_weights)`` with
    ``runner = create_runner(key, dispatcher.runner_config(config))``); its
    parameter type must take the dispatcher's format, so mypy refuses a
    forward written for another one. Build a layer per rank once; calls hold
    no state between them.
    """

    dispatcher: TokenDispatcher[FormatT, HandleT]
    forward: Callable[[FormatT], torch.Tensor]

    def __call__(self, hidden_states: torch.Tensor, topk: TopKOutput) -> torch.Tensor:
        """This rank's ``[T, H]`` output for its tokens ``hidden_states [T, H]`` routed by ``topk``."""
        dispatched = self.dispatcher.dispatch(hidden_states, topk)
        return self.dispatcher.combine(self.forward(dispatched.dispatch), dispatched.handle)
