"""What a token's row carries on the wire, and the dispatch type its slot rows become after the exchange.

A payload encodes each token's hidden state as uint8 bytes before any
exchange (one row per token, :class:`~moe_core.distributed.wire.RowLayout`)
and decodes the slot rows a rank receives into its runner's input type.
:class:`StandardPayload` sends the activations as they are and delivers a
:class:`~moe_core.dispatch.StandardDispatchOutput`. The quantized payloads
deliver their own types, so that only a runner written for pre-quantized
rows can be paired with them: :class:`Fp8Payload` (FP8 E4M3 codes and a
per-token scale, ``H + 4`` bytes) delivers :class:`Fp8SlotRows`;
:class:`Nvfp4Payload` (packed E2M1 codes and linear E4M3 block scales under
the layer's scalar input scale, ``H / 2 + H / 16`` bytes) delivers
:class:`Nvfp4SlotRows`. A kernel that takes swizzled block scales swizzles
them after the exchange: the 128x4 tiles span rows, which only the
receiving rank has together. A quantizer (:class:`Fp8TokenQuantizer`,
:class:`Nvfp4TokenQuantizer`) makes the payload for a batch.
"""

from __future__ import annotations

from typing import Protocol, TypeVar, final

import attrs
import torch

from moe_core._checks import FLOAT_DTYPES, require_dtype, require_ndim, require_same_device, require_shape, require_tensor
from moe_core.block_scales import LinearBlockScales
from moe_core.dispatch import StandardDispatchOutput, TopKOutput
from moe_core.distributed.slots import slot_rows
from moe_core.distributed.wire import RowLayout, as_bytes
from moe_core.fp8 import dynamic_fp8_scales, quantize_fp8
from moe_core.global_scales import QuantizeGlobalScale
from moe_core.nvfp4 import BLOCK_SIZE, Nvfp4Tensor, quantize_activation

FormatT_co = TypeVar("FormatT_co", covariant=True)


class Payload(Protocol[FormatT_co]):
    """How a dispatcher encodes tokens for the wire and decodes the slot rows it receives."""

    @property
    def row_bytes(self) -> int:
        """Bytes of one token's encoded row."""
        ...

    def encode(self, hidden_states: torch.Tensor) -> torch.Tensor:
        """uint8 ``[T, row_bytes]``: each token of ``hidden_states [T, H]`` as its wire row."""
        ...

    def decode(self, rows: torch.Tensor, expert_ids: torch.Tensor, weights: torch.Tensor, num_experts: int) -> FormatT_co:
        """The runner's input from slot rows: encoded ``rows [R, row_bytes]``, each one's expert id and weight ``[R]``."""
        ...


@final
@attrs.frozen
class StandardPayload:
    """The activations as they are (``dtype``, ``hidden_size`` columns): slot rows are a ``StandardDispatchOutput``."""

    dtype: torch.dtype
    hidden_size: int

    @classmethod
    def of(cls, hidden_states: torch.Tensor) -> StandardPayload:
        """The payload of ``hidden_states [T, H]``."""
        return cls(hidden_states.dtype, int(hidden_states.shape[1]))

    @property
    def layout(self) -> RowLayout:
        """One column block: the hidden state."""
        return RowLayout(((self.dtype, self.hidden_size),))

    @property
    def row_bytes(self) -> int:
        """``hidden_size * itemsize``."""
        return self.layout.row_bytes

    def encode(self, hidden_states: torch.Tensor) -> torch.Tensor:
        """Each token's bytes (a view of contiguous ``hidden_states``: nothing is copied before the exchange packs)."""
        return as_bytes(hidden_states)

    def decode(
        self, rows: torch.Tensor, expert_ids: torch.Tensor, weights: torch.Tensor, num_experts: int
    ) -> StandardDispatchOutput:
        """The hidden states read back, with each row's expert and weight."""
        (hidden,) = self.layout.unpack(rows)
        return slot_rows(hidden, expert_ids, weights, num_experts)


@final
@attrs.frozen(eq=False)
class Fp8SlotRows:
    """Slot rows quantized to FP8 E4M3 before the exchange, one dequantize-side scale per row.

    ``codes`` float8_e4m3fn ``[R, H]``, ``scales`` float32 ``[R, 1]``
    (:func:`~moe_core.fp8.dynamic_fp8_scales` of the token's row), ``topk``
    each row's global expert and weight (``top_k = 1``), ``dtype`` the
    activations' dtype, which the runner returns. A row dequantizes to
    ``codes * scales``, bit for bit what the per-token FP8 round trip of the
    FP8 channel format gives for the token, on whichever rank quantized it.
    """

    codes: torch.Tensor
    scales: torch.Tensor
    topk: TopKOutput
    dtype: torch.dtype

    def __attrs_post_init__(self) -> None:
        require_tensor("codes", self.codes)
        require_ndim("codes", self.codes, 2, "[rows, hidden_size]")
        require_dtype("codes", self.codes, (torch.float8_e4m3fn,))
        require_tensor("scales", self.scales)
        require_dtype("scales", self.scales, (torch.float32,))
        require_shape("scales", self.scales, (self.codes.shape[0], 1), "[rows like codes, 1]")
        if not isinstance(self.topk, TopKOutput):
            raise TypeError(f"topk: expected a TopKOutput, got {type(self.topk).__name__}")
        if self.topk.top_k != 1 or self.topk.num_tokens != self.codes.shape[0]:
            raise ValueError(
                f"topk: expected one expert for each of the {self.codes.shape[0]} rows, got {tuple(self.topk.topk_ids.shape)}"
            )
        if self.dtype not in FLOAT_DTYPES:
            raise TypeError(f"dtype: expected one of {FLOAT_DTYPES}, got {self.dtype!r}")
        require_same_device([("codes", self.codes), ("scales", self.scales), ("topk_ids", self.topk.topk_ids)])

    def dequantize(self) -> torch.Tensor:
        """float32 ``[R, H]``: ``codes * scales``."""
        return self.codes.to(torch.float32) * self.scales


@final
@attrs.frozen
class Fp8Payload:
    """Each token quantized to FP8 E4M3 with its own scale before it leaves its rank: slot rows are :class:`Fp8SlotRows`.

    The scale is the token's ``amax / 448`` (:func:`~moe_core.fp8.dynamic_fp8_scales`),
    computed from that row alone, so no rank's batch changes any token's bits.
    """

    dtype: torch.dtype
    """Of the activations, which the runner returns."""
    hidden_size: int

    @classmethod
    def of(cls, hidden_states: torch.Tensor) -> Fp8Payload:
        """The payload of ``hidden_states [T, H]``."""
        return cls(hidden_states.dtype, int(hidden_states.shape[1]))

    @property
    def layout(self) -> RowLayout:
        """The E4M3 codes, then the float32 scale."""
        return RowLayout(((torch.float8_e4m3fn, self.hidden_size), (torch.float32, 1)))

    @property
    def row_bytes(self) -> int:
        """``hidden_size + 4``."""
        return self.layout.row_bytes

    def encode(self, hidden_states: torch.Tensor) -> torch.Tensor:
        """Each token's codes and scale as bytes."""
        scales = dynamic_fp8_scales(hidden_states)
        return self.layout.pack(quantize_fp8(hidden_states, scales), scales)

    def decode(self, rows: torch.Tensor, expert_ids: torch.Tensor, weights: torch.Tensor, num_experts: int) -> Fp8SlotRows:
        """The codes and scales read back, with each row's expert and weight."""
        codes, scales = self.layout.unpack(rows)
        topk = TopKOutput(expert_ids.reshape(-1, 1), weights.reshape(-1, 1), num_experts=num_experts, check_values=False)
        return Fp8SlotRows(codes, scales, topk, self.dtype)


@final
@attrs.frozen(eq=False)
class Nvfp4SlotRows:
    """Slot rows quantized to NVFP4 before the exchange with the layer's scalar input scale (the first GEMM's).

    ``activations`` ``[R, H]``: packed E2M1 codes, linear E4M3 block scales
    (16 elements each, per row) and the global input scale every rank used;
    ``topk`` each row's global expert and weight (``top_k = 1``); ``dtype``
    the activations' dtype, which the runner returns.
    """

    activations: Nvfp4Tensor
    topk: TopKOutput
    dtype: torch.dtype

    def __attrs_post_init__(self) -> None:
        if not isinstance(self.activations, Nvfp4Tensor):
            raise TypeError(f"activations: expected an Nvfp4Tensor, got {type(self.activations).__name__}")
        if not isinstance(self.topk, TopKOutput):
            raise TypeError(f"topk: expected a TopKOutput, got {type(self.topk).__name__}")
        rows = self.activations.shape[0]
        if self.topk.top_k != 1 or self.topk.num_tokens != rows:
            raise ValueError(f"topk: expected one expert for each of the {rows} rows, got {tuple(self.topk.topk_ids.shape)}")
        if self.dtype not in FLOAT_DTYPES:
            raise TypeError(f"dtype: expected one of {FLOAT_DTYPES}, got {self.dtype!r}")
        require_same_device([("activations", self.activations.packed), ("topk_ids", self.topk.topk_ids)])

    def dequantize(self) -> torch.Tensor:
        """float32 ``[R, H]``: the values the codes stand for (``Nvfp4Tensor.dequantize`` cannot unpack zero rows)."""
        rows, hidden_size = self.activations.shape
        if rows == 0:
            return torch.empty((0, hidden_size), dtype=torch.float32, device=self.activations.packed.device)
        return self.activations.dequantize()


@final
@attrs.frozen(eq=False)
class Nvfp4Payload:
    """Each token quantized to NVFP4 with ``input_scale`` before it leaves its rank: slot rows are :class:`Nvfp4SlotRows`.

    The FP4 kernels' activation quantizer (:func:`~moe_core.nvfp4.quantize_activation`):
    16-element blocks within a row and one scalar for the layer, so a token's
    bytes depend on its row alone.
    """

    dtype: torch.dtype
    """Of the activations, which the runner returns."""
    hidden_size: int
    input_scale: QuantizeGlobalScale
    """The layer's first GEMM input scale, one scalar over every expert (the same on every rank)."""

    @property
    def layout(self) -> RowLayout:
        """The packed codes, then the E4M3 block scales."""
        return RowLayout(((torch.uint8, self.hidden_size // 2), (torch.float8_e4m3fn, self.hidden_size // BLOCK_SIZE)))

    @property
    def row_bytes(self) -> int:
        """``hidden_size / 2 + hidden_size / 16``."""
        return self.layout.row_bytes

    def encode(self, hidden_states: torch.Tensor) -> torch.Tensor:
        """Each token's packed codes and block scales as bytes (none for no tokens, which the quantizer refuses)."""
        if hidden_states.shape[0] == 0:
            return hidden_states.new_empty((0, self.row_bytes), dtype=torch.uint8)
        quantized = quantize_activation(hidden_states, self.input_scale)
        return self.layout.pack(quantized.packed, quantized.block_scales.data)

    def decode(self, rows: torch.Tensor, expert_ids: torch.Tensor, weights: torch.Tensor, num_experts: int) -> Nvfp4SlotRows:
        """The codes and block scales read back under the input scale, with each row's expert and weight."""
        packed, scales = self.layout.unpack(rows)
        activations = Nvfp4Tensor(packed, LinearBlockScales.from_checkpoint(scales), self.input_scale.to(rows.device))
        topk = TopKOutput(expert_ids.reshape(-1, 1), weights.reshape(-1, 1), num_experts=num_experts, check_values=False)
        return Nvfp4SlotRows(activations, topk, self.dtype)


class TokenQuantizer(Protocol[FormatT_co]):
    """What a quantized dispatcher is built with: the payload of each batch (its dtype and hidden size)."""

    def payload(self, hidden_states: torch.Tensor) -> Payload[FormatT_co]:
        """The payload ``hidden_states [T, H]`` travel in."""
        ...


@final
@attrs.frozen
class Fp8TokenQuantizer:
    """FP8 E4M3 with a per-token scale (:class:`Fp8Payload`): no calibration, any hidden size."""

    def payload(self, hidden_states: torch.Tensor) -> Fp8Payload:
        """The FP8 payload of ``hidden_states [T, H]``."""
        return Fp8Payload.of(hidden_states)


@final
@attrs.frozen(eq=False)
class Nvfp4TokenQuantizer:
    """NVFP4 under the layer's scalar first-GEMM input scale (:class:`Nvfp4Payload`; ``w13_input_scale``)."""

    input_scale: QuantizeGlobalScale

    def __attrs_post_init__(self) -> None:
        if not isinstance(self.input_scale, QuantizeGlobalScale):
            raise TypeError(f"input_scale: expected a QuantizeGlobalScale, got {type(self.input_scale).__name__}")

    def payload(self, hidden_states: torch.Tensor) -> Nvfp4Payload:
        """The NVFP4 payload of ``hidden_states [T, H]`` (``H`` a multiple of 16)."""
        hidden_size = int(hidden_states.shape[1])
        if hidden_size % BLOCK_SIZE:
            raise ValueError(f"hidden_states: expected a multiple of {BLOCK_SIZE} columns for NVFP4 blocks, got {hidden_size}")
        return Nvfp4Payload(hidden_states.dtype, hidden_size, self.input_scale)
