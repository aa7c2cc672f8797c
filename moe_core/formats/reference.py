"""The one reference forward every format's oracle is built from.

Written for clarity, not speed: one expert at a time, float32 arithmetic, on
any device torch runs on. A format's kit says only what differs, as a
:class:`ReferenceRecipe`: its experts' float32 weights and how each GEMM's
input is quantized (not at all for 16-bit activations); a kit whose weights
may carry per-expert biases implements :class:`BiasedRecipe` too. The
config's activation, routing method (weights on each expert's output, or on
its input for :class:`~moe_core.config.Llama4Sigmoid`) and scaling factor
are honoured here, for every format.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Generic, Protocol, TypeVar, final, runtime_checkable

import attrs
import torch

from moe_core.config import MoeRunnerConfig
from moe_core.dispatch import DispatchFormat, DispatchOutput
from moe_core._checks import values_readable
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

    def quantize_input(self, weights: W_contra, expert: int, x: torch.Tensor) -> torch.Tensor:
        """The first GEMM's float32 input to local expert ``expert`` as the format's kernels see it (a quantization
        round trip, or ``x``)."""
        ...

    def quantize_hidden(self, weights: W_contra, expert: int, h: torch.Tensor) -> torch.Tensor:
        """The gated activation as the second GEMM sees it."""
        ...


CLIPPED_SHARE = 0.25
"""The share of a GEMM input's values beyond its static scale's range above which the reference refuses the scale."""


def require_static_range(name: str, x: torch.Tensor, covered_amax: float, expert: int, gemm: str) -> None:
    """Refuse a static input scale that clips more than :data:`CLIPPED_SHARE` of the values it quantizes.

    A calibrated scale covers its calibration's amax; inputs that differ from
    the calibration's pass it by a few percent of their values (up to 9% in
    this repository's synthetic layers, whose scales come from other draws).
    A quarter or more beyond it means the scale is not theirs: a
    dequantize-side checkpoint value passed where an amax belongs (a range
    hundreds to thousands of times too small clips nearly every value).
    Swapped GEMM scales clip fewer, and only the one of them whose range is
    smaller. ``expert`` (local) and ``gemm`` name the input.
    """
    if x.numel() == 0 or not values_readable(x):
        return
    clipped = int((x.abs() > covered_amax).sum())
    if clipped > CLIPPED_SHARE * x.numel():
        raise ValueError(
            f"{name}: {clipped} of the {x.numel()} values of local expert {expert}'s {gemm} input "
            f"({clipped / x.numel():.0%}) lie beyond +-{covered_amax:.4g}, the most this static scale represents "
            f"(their largest: {float(x.abs().max()):.4g}): a scale read from the wrong side (a checkpoint's scale "
            "passed as an amax), or the other GEMM's input scale?"
        )


@runtime_checkable
class BiasedRecipe(ReferenceRecipe[W_contra], Protocol[W_contra]):
    """A recipe of weights that may carry per-expert biases, added after each GEMM."""

    def biases(self, weights: W_contra, expert: int) -> tuple[torch.Tensor, torch.Tensor] | None:
        """Local expert ``expert``'s ``w13`` bias (``[rows of w13]``) and ``w2`` bias (``[H]``) in float32, or None."""
        ...


def run_experts(
    config: MoeRunnerConfig, dispatch: DispatchOutput, quant_info: QuantInfo, expert_mlp: ExpertMlp
) -> torch.Tensor:
    """Sum each token's local experts' outputs, weighted by top-k and the scaling factor (values checked first).

    The top-k weights scale each expert's output, or its input where the
    config's routing method says so (then the output counts once).
    """
    check_run_inputs(config, dispatch, quant_info, (DispatchFormat.STANDARD,))
    check_run_values(config, dispatch)
    hidden = dispatch.hidden_states
    ids, weights = dispatch.topk.topk_ids, dispatch.topk.topk_weights
    out = torch.zeros(hidden.shape, dtype=torch.float32, device=hidden.device)
    for local in range(config.num_local_experts):
        tokens, slots = torch.nonzero(ids == config.local_expert_offset + local, as_tuple=True)
        if tokens.numel() == 0:
            continue
        x, w = hidden[tokens].to(torch.float32), weights[tokens, slots].unsqueeze(-1)
        if config.routing_method.scales_input:
            out.index_add_(0, tokens, expert_mlp(local, x * w))
        else:
            out.index_add_(0, tokens, expert_mlp(local, x) * w)
    return (out * config.routed_scaling_factor).to(hidden.dtype)


@final
@attrs.frozen
class ReferenceRunner(Generic[W]):
    """A format's oracle: :func:`run_experts` with the recipe's weights and quantization, the config's activation,
    and the weights' biases where the config says the experts have some."""

    config: MoeRunnerConfig
    recipe: ReferenceRecipe[W]

    def __attrs_post_init__(self) -> None:
        if self.config.expert_biases and not isinstance(self.recipe, BiasedRecipe):
            raise ValueError(
                f"config.expert_biases: {type(self.recipe).__name__} adds no biases (its format carries none)"
            )

    def run(self, dispatch: DispatchOutput, quant_info: W, /) -> torch.Tensor:
        """The ``[T, H]`` MoE output."""
        recipe, config = self.recipe, self.config
        activation, rows = config.activation, config.intermediate_size_per_partition
        rows *= 2 if activation.gated else 1
        biased = recipe if isinstance(recipe, BiasedRecipe) else None

        def mlp(expert: int, x: torch.Tensor) -> torch.Tensor:
            w13 = recipe.gate_up(quant_info, expert)
            if w13.shape[0] != rows:
                raise ValueError(f"quant_info: expected w13 of {rows} rows for {activation.value}, got {w13.shape[0]}")
            biases = None if biased is None else biased.biases(quant_info, expert)
            if (biases is not None) != config.expert_biases:
                raise ValueError(
                    f"quant_info: the config says expert_biases={config.expert_biases}, "
                    f"the weights carry {'some' if biases is not None else 'none'}"
                )
            h = recipe.quantize_input(quant_info, expert, x) @ w13.T
            if biases is not None:
                h = h + biases[0]
            y = recipe.quantize_hidden(quant_info, expert, activation.apply(h)) @ recipe.down(quant_info, expert).T
            return y if biases is None else y + biases[1]

        return run_experts(config, dispatch, quant_info, mlp)
