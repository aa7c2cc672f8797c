"""Dispatchers that quantize each token before the exchange, and the reference runners of the rows they deliver.

A quantized dispatcher is built with a :class:`~moe_core.distributed.payload.TokenQuantizer`:
FP8 E4M3 with a per-token scale (``H + 4`` bytes a row instead of ``2 H``
for bf16) or NVFP4 under the layer's scalar input scale (``H / 2 + H / 16``).
The rows travel as uint8 and reach the runner as the quantizer's own type
(:class:`~moe_core.distributed.payload.Fp8SlotRows`, :class:`~moe_core.distributed.payload.Nvfp4SlotRows`),
which no runner of ``DispatchOutput`` takes: mypy refuses a bf16 forward
paired with these dispatchers. The combine returns slot outputs unquantized.

Why every rank's output is the world-of-one layer's (:class:`QuantizedLocalDispatcher`)
bit for bit: a token's FP8 scale is its row's ``amax / 448`` and its codes
its row divided by that scale; its NVFP4 block scales and codes come from
16-element blocks of its row and the one scalar the layer shares. These are
elementwise operations and exact maxima over that row alone, so the token's
rank quantizes it to the same bits whatever else is in its batch; bytes
travel unchanged; the rest is the argument of :mod:`moe_core.distributed.all_to_all`
and :mod:`moe_core.distributed.all_gather` (each expert sees the single-rank
rows in the single-rank order).
"""

from __future__ import annotations

from typing import Generic, TypeVar, final

import attrs
import torch
import torch.distributed as dist

from moe_core.config import MoeRunnerConfig
from moe_core.dispatch import StandardDispatchOutput, TopKOutput
from moe_core.distributed.all_gather import AllGatherHandle, TokenSharding, gather_slots, scatter_slots
from moe_core.distributed.all_to_all import AllToAllHandle, exchange_slots, return_slots
from moe_core.distributed.local import LocalHandle
from moe_core.distributed.payload import Fp8SlotRows, Nvfp4SlotRows, TokenQuantizer
from moe_core.distributed.placement import ExpertPlacement, require_whole_layer
from moe_core.distributed.protocol import Dispatched
from moe_core.distributed.slots import check_rows, slot_config, sum_slots
from moe_core.formats.fp8_channel.reference import Fp8ChannelRecipe
from moe_core.formats.fp8_channel.weights import Fp8ChannelMoeWeights
from moe_core.formats.nvfp4.reference import Nvfp4Recipe
from moe_core.formats.nvfp4.weights import Nvfp4MoeWeights
from moe_core.formats.reference import ReferenceRecipe, ReferenceRunner
from moe_core.runner import QuantInfo

RowsT = TypeVar("RowsT")
"""The quantized rows a quantizer's payload delivers."""
W = TypeVar("W", bound=QuantInfo)


def _check_quantizer(quantizer: object) -> None:
    if not callable(getattr(quantizer, "payload", None)):
        raise TypeError(f"quantizer: expected a TokenQuantizer (Fp8TokenQuantizer, ...), got {type(quantizer).__name__}")


def _check_group(group: dist.ProcessGroup, placement: ExpertPlacement) -> None:
    if not isinstance(placement, ExpertPlacement):
        raise TypeError(f"placement: expected an ExpertPlacement, got {type(placement).__name__}")
    if placement.world_size != group.size():
        raise ValueError(f"placement: expected world_size={group.size()} like the group, got {placement.world_size}")


@final
@attrs.frozen(eq=False)
class QuantizedLocalDispatcher(Generic[RowsT]):
    """World size 1 with quantized rows: every token quantized here, slot rows in ``(token, slot)`` order.

    The layer the quantized dispatchers must reproduce; no communication and no host synchronization.
    """

    quantizer: TokenQuantizer[RowsT]

    def __attrs_post_init__(self) -> None:
        _check_quantizer(self.quantizer)

    def runner_config(self, config: MoeRunnerConfig) -> MoeRunnerConfig:
        """The whole layer's ``config`` over slot rows (``top_k = 1``)."""
        require_whole_layer(config)
        return slot_config(config)

    def dispatch(self, hidden_states: torch.Tensor, topk: TopKOutput) -> Dispatched[RowsT, LocalHandle]:
        """Row ``t * top_k + k`` is token ``t`` quantized, for its slot ``k``."""
        StandardDispatchOutput(hidden_states, topk)  # checks the pair
        payload = self.quantizer.payload(hidden_states)
        rows = payload.encode(hidden_states).repeat_interleave(topk.top_k, dim=0)
        dispatch = payload.decode(rows, topk.topk_ids.flatten(), topk.topk_weights.flatten(), topk.num_experts)
        return Dispatched(dispatch, LocalHandle(topk.num_tokens, topk.top_k))

    def combine(self, out: torch.Tensor, handle: LocalHandle) -> torch.Tensor:
        """Each token's slot outputs added in slot order."""
        check_rows(out, handle.num_tokens * handle.top_k)
        return sum_slots(out, handle.top_k)


@final
@attrs.frozen(eq=False)
class QuantizedAllToAllDispatcher(Generic[RowsT]):
    """:class:`~moe_core.distributed.AllToAllDispatcher` with each token quantized by ``quantizer`` before it is sent."""

    group: dist.ProcessGroup
    placement: ExpertPlacement
    quantizer: TokenQuantizer[RowsT]

    def __attrs_post_init__(self) -> None:
        _check_group(self.group, self.placement)
        _check_quantizer(self.quantizer)

    def runner_config(self, config: MoeRunnerConfig) -> MoeRunnerConfig:
        """This rank's experts of the layer's ``config``, over slot rows (``top_k = 1``)."""
        return slot_config(self.placement.runner_config(config, self.group.rank()))

    def dispatch(self, hidden_states: torch.Tensor, topk: TopKOutput) -> Dispatched[RowsT, AllToAllHandle]:
        """The quantized slot rows of every rank for this rank's experts, in source-rank then ``(token, slot)`` order."""
        where = "QuantizedAllToAllDispatcher.dispatch"
        return exchange_slots(where, self.quantizer.payload, hidden_states, topk, self.placement, self.group)

    def combine(self, out: torch.Tensor, handle: AllToAllHandle) -> torch.Tensor:
        """Each received row's output back to its rank (unquantized); there, each token's slots added in slot order."""
        return return_slots(out, handle, self.group)


@final
@attrs.frozen(eq=False)
class QuantizedAllGatherDispatcher(Generic[RowsT]):
    """:class:`~moe_core.distributed.AllGatherDispatcher` with each token quantized by ``quantizer`` before it is gathered."""

    group: dist.ProcessGroup
    placement: ExpertPlacement
    quantizer: TokenQuantizer[RowsT]
    tokens: TokenSharding = TokenSharding.PER_RANK

    def __attrs_post_init__(self) -> None:
        _check_group(self.group, self.placement)
        _check_quantizer(self.quantizer)
        if not isinstance(self.tokens, TokenSharding):
            raise TypeError(f"tokens: expected a TokenSharding, got {self.tokens!r}")

    def runner_config(self, config: MoeRunnerConfig) -> MoeRunnerConfig:
        """This rank's experts of the layer's ``config``, over slot rows (``top_k = 1``)."""
        return slot_config(self.placement.runner_config(config, self.group.rank()))

    def dispatch(self, hidden_states: torch.Tensor, topk: TopKOutput) -> Dispatched[RowsT, AllGatherHandle]:
        """The quantized slot rows of every rank's tokens routed to this rank's experts, in gathered ``(token, slot)`` order."""
        where = "QuantizedAllGatherDispatcher.dispatch"
        return gather_slots(where, self.quantizer.payload, hidden_states, topk, self.placement, self.group, self.tokens)

    def combine(self, out: torch.Tensor, handle: AllGatherHandle) -> torch.Tensor:
        """Every slot output to its token's rank (bytes, exactly), then each token's slots added in slot order."""
        return scatter_slots(out, handle, self.group, self.tokens)


@final
@attrs.frozen
class _ReceivedInput(Generic[W]):
    """A format's recipe with the first GEMM's input taken as it arrived: quantized on its rank, as the recipe would."""

    recipe: ReferenceRecipe[W]

    def gate_up(self, weights: W, expert: int) -> torch.Tensor:
        """As the format's recipe."""
        return self.recipe.gate_up(weights, expert)

    def down(self, weights: W, expert: int) -> torch.Tensor:
        """As the format's recipe."""
        return self.recipe.down(weights, expert)

    def quantize_input(self, weights: W, expert: int, x: torch.Tensor) -> torch.Tensor:
        """``x`` as received: its round trip happened before the exchange."""
        return x

    def quantize_hidden(self, weights: W, expert: int, h: torch.Tensor) -> torch.Tensor:
        """As the format's recipe."""
        return self.recipe.quantize_hidden(weights, expert, h)


def _refuse_input_weighting(config: MoeRunnerConfig) -> None:
    if not isinstance(config, MoeRunnerConfig):
        raise TypeError(f"config: expected a MoeRunnerConfig, got {type(config).__name__}")
    if config.routing_method.scales_input:
        raise ValueError(
            f"config.routing_method: {config.routing_method!r} weights each expert's input, which rows "
            "quantized before the exchange cannot be; expected a method that weights the output"
        )


@final
@attrs.frozen
class Fp8RowsReferenceRunner:
    """The FP8 channel format's reference (``reference-fp8-channel``) on rows that arrive quantized per token.

    It dequantizes the rows (``codes * scales``, what the format's per-token
    round trip of the token gives) and runs the format's reference with that
    first round trip already done, returning the activations' dtype: the
    bits of ``reference-fp8-channel`` on the unquantized slot rows. Create it
    with the dispatcher's ``runner_config``. Routing methods that weight an
    expert's input (Llama 4) are refused: their kernels quantize ``x * w``,
    which a token quantized before the exchange cannot be.
    """

    config: MoeRunnerConfig

    def __attrs_post_init__(self) -> None:
        _refuse_input_weighting(self.config)

    def run(self, rows: Fp8SlotRows, quant_info: Fp8ChannelMoeWeights, /) -> torch.Tensor:
        """``[R, H]`` in ``rows.dtype``: each row's expert output, weighted."""
        dispatch = StandardDispatchOutput(rows.dequantize(), rows.topk)
        return ReferenceRunner(self.config, _ReceivedInput(Fp8ChannelRecipe())).run(dispatch, quant_info).to(rows.dtype)


@final
@attrs.frozen
class Nvfp4RowsReferenceRunner:
    """The NVFP4 W4A4 format's reference (``reference-nvfp4``) on rows that arrive quantized with its input scale.

    The rows' global scale must be the weights' ``w13_input_scale`` (checked
    by value: a reference, not a hot path). They are dequantized and run
    with the first round trip already done: the bits of ``reference-nvfp4``
    on the unquantized slot rows. Input-weighting routing is refused, as in
    :class:`Fp8RowsReferenceRunner`.
    """

    config: MoeRunnerConfig

    def __attrs_post_init__(self) -> None:
        _refuse_input_weighting(self.config)

    def run(self, rows: Nvfp4SlotRows, quant_info: Nvfp4MoeWeights, /) -> torch.Tensor:
        """``[R, H]`` in ``rows.dtype``: each row's expert output, weighted."""
        sent, expected = rows.activations.global_scale.value, quant_info.w13_input_scale.value
        if not torch.equal(sent.cpu(), expected.cpu()):
            raise ValueError(
                f"rows: quantized with global scale {sent.item()}, expected the weights' w13_input_scale {expected.item()}"
            )
        dispatch = StandardDispatchOutput(rows.dequantize(), rows.topk)
        return ReferenceRunner(self.config, _ReceivedInput(Nvfp4Recipe())).run(dispatch, quant_info).to(rows.dtype)
