"""The one reference forward every format's oracle is built from.

Written for clarity, not speed: one expert at a time, float32 arithmetic, on
any device torch runs on. A format's kit says only what differs, as a
:class:`ReferenceRecipe`: its experts' float32 weights and how each GEMM's
input is quantized (not at all for 16-bit activations).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Generic, Protocol, TypeVar, final

import attrs
import torch

from moe_core.config import MoeRunnerConfig
from moe_core.dispatch import DispatchFormat, DispatchOutput
from moe_core.runner import QuantInfo, check_run_inputs, check_run_values

W = TypeVar("W", bound=QuantInfo)
W_contra = TypeVar("W_contra", bound=QuantInfo, contravariant=True)

ExpertMlp = Callable[[int, torch.Tensor], torch.Tensor]
"""``(local expert index, float32 tokens [n, H]) -> float32 [n, H]``."""


class ReferenceRecipe(Protocol[W_contra]):
    """What one format's reference computes differently: weights and activation quantization."""

    def gate_up(self, weights: W_contra, expert: int) -> torch.Tensor:
        """Local expert ``expert``'s ``w13`` in float32, ``[2I, H]`` (gate rows first)."""
        ...

    def down(self, weights: W_contra, expert: int) -> torch.Tensor:
        """Local expert ``expert``'s ``w2`` in float32, ``[H, I]``."""
        ...

    def quantize_input(self, weights: W_contra, x: torch.Tensor) -> torch.Tensor:
        """The first GEMM's float32 input as the format's kernels see it (a quantization round trip, or ``x``)."""
        ...

    def quantize_hidden(self, weights: W_contra, h: torch.Tensor) -> torch.Tensor:
        """The gated activation as the second GEMM sees it."""
        ...


def run_experts(
    config: MoeRunnerConfig, dispatch: DispatchOutput, quant_info: QuantInfo, expert_mlp: ExpertMlp
) -> torch.Tensor:
    """Sum each token's local experts' outputs, weighted by top-k and the scaling factor (values checked first)."""
    check_run_inputs(config, dispatch, quant_info, (DispatchFormat.STANDARD,))
    check_run_values(config, dispatch)
    hidden = dispatch.hidden_states
    ids, weights = dispatch.topk.topk_ids, dispatch.topk.topk_weights
    out = torch.zeros(hidden.shape, dtype=torch.float32, device=hidden.device)
    for local in range(config.num_local_experts):
        tokens, slots = torch.nonzero(ids == config.local_expert_offset + local, as_tuple=True)
        if tokens.numel() == 0:
            continue
        y = expert_mlp(local, hidden[tokens].to(torch.float32))
        out.index_add_(0, tokens, y * weights[tokens, slots].unsqueeze(-1))
    return (out * config.routed_scaling_factor).to(hidden.dtype)


@final
@attrs.frozen
class ReferenceRunner(Generic[W]):
    """A format's oracle: :func:`run_experts` with the recipe's weights and quantization, the config's activation."""

    config: MoeRunnerConfig
    recipe: ReferenceRecipe[W]

    def run(self, dispatch: DispatchOutput, quant_info: W, /) -> torch.Tensor:
        """The ``[T, H]`` MoE output."""
        recipe, activation = self.recipe, self.config.activation

        def mlp(expert: int, x: torch.Tensor) -> torch.Tensor:
            h = activation.apply(recipe.quantize_input(quant_info, x) @ recipe.gate_up(quant_info, expert).T)
            return recipe.quantize_hidden(quant_info, h) @ recipe.down(quant_info, expert).T

        return run_experts(self.config, dispatch, quant_info, mlp)
