"""The dispatcher between routing and the runner, typed by the dispatch format it delivers and the handle it returns."""

from __future__ import annotations

from typing import Generic, Protocol, TypeVar, final

import attrs
import torch

from moe_core.config import MoeRunnerConfig
from moe_core.dispatch import TopKOutput

FormatT = TypeVar("FormatT")
"""The dispatch type a dispatcher delivers, the one its runner's forward must take: a ``DispatchOutput`` for
activations as they are, another type for rows quantized before the exchange (:mod:`~moe_core.distributed.payload`)."""
HandleT = TypeVar("HandleT")
"""What one dispatch leaves for its combine."""


@final
@attrs.frozen(eq=False)
class Dispatched(Generic[FormatT, HandleT]):
    """One dispatch's result: the runner's input, and the handle its combine reads (and nothing else)."""

    dispatch: FormatT
    handle: HandleT


class TokenDispatcher(Protocol[FormatT, HandleT]):
    """Moves this rank's routed tokens to the ranks holding their experts, and their outputs back.

    ``dispatch`` returns the runner's input and a frozen handle (split sizes,
    row indices); ``combine`` reads only that handle and the dispatcher's
    fixed configuration (group, placement), so dispatches may be in flight
    together and nothing per call hides in the dispatcher.
    """

    def runner_config(self, config: MoeRunnerConfig) -> MoeRunnerConfig:
        """The config to create this rank's runner for, from the whole layer's ``config``.

        The dispatcher decides the rows the runner sees (which experts are
        local, how many slots a row has), so it says how the runner is built.
        """
        ...

    def dispatch(self, hidden_states: torch.Tensor, topk: TopKOutput) -> Dispatched[FormatT, HandleT]:
        """The runner's input for this rank's tokens ``hidden_states [T, H]`` routed by ``topk``."""
        ...

    def combine(self, out: torch.Tensor, handle: HandleT) -> torch.Tensor:
        """This rank's ``[T, H]`` layer output from the runner's output ``out`` on the dispatch behind ``handle``."""
        ...
