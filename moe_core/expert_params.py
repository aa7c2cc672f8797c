"""A MoE layer's checkpoint parameters, filled one expert and one shard at a time.

Serving engines create a layer's parameters before reading any file (often
on the meta device, then materialized), and their weight loader hands each
checkpoint tensor over as it meets it: ``experts.{e}.{gate_proj|up_proj|down_proj}.{name}``.
:class:`ExpertParams` is that container for a scheme: it knows each tensor's
name, dtype and per-expert shape, fuses gate (w1) and up (w3) into ``w13``
without mixing their scales, skips experts of other ranks, and reports a
wrong shape or dtype at the tensor that has it and a missing tensor by name.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Sequence
from typing import final

import attrs
import torch

from moe_core._checks import require_int, require_tensor
from moe_core.config import MoeRunnerConfig


class ExpertShard(enum.Enum):
    """Which of an expert's three projections a checkpoint tensor belongs to."""

    GATE = "w1"
    """``gate_proj`` (Mixtral: ``w1``), the first half of ``w13``."""
    UP = "w3"
    """``up_proj`` (Mixtral: ``w3``), the second half of ``w13``."""
    DOWN = "w2"
    """``down_proj`` (Mixtral: ``w2``)."""

    @property
    def projection(self) -> str:
        """The projection's name in Qwen/Llama-style checkpoints (``gate_proj``, ``up_proj``, ``down_proj``)."""
        return {ExpertShard.GATE: "gate_proj", ExpertShard.UP: "up_proj", ExpertShard.DOWN: "down_proj"}[self]

    @classmethod
    def from_projection(cls, projection: str) -> ExpertShard:
        """The shard of a checkpoint's projection name (``gate_proj`` or ``w1``, ...)."""
        shard = _PROJECTIONS.get(projection)
        if shard is None:
            raise ValueError(f"projection: expected one of {sorted(_PROJECTIONS)}, got {projection!r}")
        return shard


_PROJECTIONS = {
    "gate_proj": ExpertShard.GATE,
    "w1": ExpertShard.GATE,
    "up_proj": ExpertShard.UP,
    "w3": ExpertShard.UP,
    "down_proj": ExpertShard.DOWN,
    "w2": ExpertShard.DOWN,
}


class ParamLayout(enum.Enum):
    """How a tensor's per-expert shape follows from the projection's ``[out_features, in_features]``."""

    MATRIX = 1
    """The weight itself, ``[out, in]``."""
    PACKED_FP4 = 2
    """Two FP4 codes a byte, ``[out, in / 2]``."""
    BLOCK_SCALES = 16
    """One scale per 16 elements of a row, ``[out, in / 16]``."""
    SCALAR = 0
    """One value per projection (checkpoints store it as shape ``[]`` or ``[1]``)."""

    def shape(self, out_features: int, in_features: int) -> tuple[int, ...]:
        """The per-expert shape for a projection of this size."""
        if self is ParamLayout.SCALAR:
            return ()
        return (out_features, in_features // self.value)

    def describe(self) -> str:
        """The dims in words, for error messages."""
        return {
            ParamLayout.MATRIX: "[out_features, in_features]",
            ParamLayout.PACKED_FP4: "[out_features, in_features / 2]",
            ParamLayout.BLOCK_SCALES: "[out_features, in_features / 16]",
            ParamLayout.SCALAR: "(one value)",
        }[self]


@final
@attrs.frozen
class ShapedLayout:
    """A per-expert shape :class:`ParamLayout` has no member for, as a function of ``(out_features, in_features)``:
    E8M0 scales per 32 elements, one-dimensional biases, ``[out, 1]`` channel scales, 128x128 block scales."""

    shape: Callable[[int, int], tuple[int, ...]]
    """The per-expert shape for a projection of ``(out_features, in_features)``."""
    description: str
    """The dims in words, for error messages (e.g. ``[out_features / 128, in_features / 128]``)."""

    def describe(self) -> str:
        """The dims in words, for error messages."""
        return self.description


def _bias_shape(out_features: int, in_features: int) -> tuple[int, ...]:
    return (out_features,)


BIAS = ShapedLayout(_bias_shape, "[out_features]")
"""A projection's bias, one value per output feature (gpt-oss's experts)."""


@final
@attrs.frozen
class ParamSpec:
    """One checkpoint tensor of every expert projection, e.g. ``weight_packed`` (uint8, packed FP4)."""

    name: str
    """The checkpoint's name after the projection (``experts.3.up_proj.<name>``)."""
    dtype: torch.dtype
    layout: ParamLayout | ShapedLayout
    upcast_from: tuple[torch.dtype, ...] = attrs.field(default=(), kw_only=True)
    """Narrower dtypes also taken, stored exactly as ``dtype`` (llmcompressor writes FP8 scales in bf16)."""
    every_expert: bool = attrs.field(default=False, kw_only=True)
    """Kept for every expert of the layer, not only this rank's: a static input scale, which collapses into one
    scalar over the whole layer so that every rank quantizes a token alike (whatever the expert placement)."""


def _projection_size(config: MoeRunnerConfig, shard: ExpertShard) -> tuple[int, int]:
    hidden, inter = config.hidden_size, config.intermediate_size_per_partition
    return (hidden, inter) if shard is ExpertShard.DOWN else (inter, hidden)


class ExpertParams:
    """The parameters of this rank's experts, as a scheme creates and an engine's loader fills them.

    ``w13`` tensors are ``[E_local, 2, *shape]`` (index 0 gate, 1 up), ``w2``
    tensors ``[E_local, *shape]``; expert ids passed to :meth:`load` are
    global, and those of other ranks are skipped, except for the tensors a
    spec keeps for every expert (``[E, ...]``, global ids).
    """

    def __init__(self, scheme: str, specs: Sequence[ParamSpec], config: MoeRunnerConfig, device: torch.device) -> None:
        """Allocate every tensor of ``specs`` on ``device`` (uninitialized until loaded)."""
        self.scheme = scheme
        """The scheme's name, for error messages."""
        self.config = config
        """The layer the parameters are for."""
        self.device = device
        """Where the parameters live."""
        self.specs = {spec.name: spec for spec in specs}
        """The tensors of each projection, by checkpoint name."""
        self._w13: dict[str, torch.Tensor] = {}
        self._w2: dict[str, torch.Tensor] = {}
        for spec in specs:
            experts = config.num_experts if spec.every_expert else config.num_local_experts
            gate_shape = spec.layout.shape(*_projection_size(config, ExpertShard.GATE))
            down_shape = spec.layout.shape(*_projection_size(config, ExpertShard.DOWN))
            self._w13[spec.name] = torch.empty((experts, 2, *gate_shape), dtype=spec.dtype, device=device)
            self._w2[spec.name] = torch.empty((experts, *down_shape), dtype=spec.dtype, device=device)
        self._loaded = {name: torch.zeros(self._w2[name].shape[0], 3, dtype=torch.bool) for name in self.specs}
        self._released = False

    def load(self, name: str, tensor: torch.Tensor, *, expert_id: int, shard: ExpertShard) -> bool:
        """Copy one checkpoint tensor in; False (nothing copied) for an expert of another rank.

        Raises for an unknown name, a wrong dtype or a wrong shape, naming the
        tensor as the checkpoint does.
        """
        config = self.config
        require_int("expert_id", expert_id, minimum=0)
        if expert_id >= config.num_experts:
            raise ValueError(f"expert_id: expected an id < {config.num_experts} (num_experts), got {expert_id}")
        if not isinstance(shard, ExpertShard):
            raise TypeError(f"shard: expected an ExpertShard, got {shard!r}")
        where = f"experts.{expert_id}.{shard.projection}.{name}"
        spec = self.specs.get(name)
        if spec is None:
            raise ValueError(f"{where}: the {self.scheme} scheme takes no tensor {name!r} (it takes {sorted(self.specs)})")
        require_tensor(where, tensor)
        if tensor.dtype != spec.dtype and tensor.dtype not in spec.upcast_from:
            wanted = " or ".join(str(dtype) for dtype in (spec.dtype, *spec.upcast_from))
            raise TypeError(f"{where}: expected dtype {wanted}, got {tensor.dtype}")
        expected = spec.layout.shape(*_projection_size(config, shard))
        shape = tuple(tensor.shape)
        if shape != expected and not (spec.layout is ParamLayout.SCALAR and shape == (1,)):
            out_features, in_features = _projection_size(config, shard)
            raise ValueError(
                f"{where}: expected shape {expected} {spec.layout.describe()} for a projection of "
                f"out_features={out_features}, in_features={in_features}, got {shape}"
            )
        local = expert_id if spec.every_expert else expert_id - config.local_expert_offset
        if not 0 <= local < self._w2[name].shape[0]:
            return False
        self._require_held()
        column = list(ExpertShard).index(shard)
        if self._loaded[name][local, column]:
            raise ValueError(
                f"{where}: loaded twice (does the checkpoint hold this expert's {shard.projection} under two names, "
                "e.g. gate_proj and w1, or a stale shard beside the current one?): each tensor loads once"
            )
        value = tensor.reshape(expected)
        if shard is ExpertShard.DOWN:
            self._w2[name][local].copy_(value)
        else:
            self._w13[name][local, 0 if shard is ExpertShard.GATE else 1].copy_(value)
        self._loaded[name][local, column] = True
        return True

    def missing(self) -> list[str]:
        """Every tensor not loaded yet, as ``experts.{global id}.{shard}.{name}``."""
        return [
            f"experts.{index + (0 if self.specs[name].every_expert else self.config.local_expert_offset)}"
            f".{shard.projection}.{name}"
            for name, loaded in self._loaded.items()
            for index, column in (~loaded).nonzero().tolist()
            for shard in (list(ExpertShard)[column],)
        ]

    def require_complete(self) -> None:
        """Raise ``ValueError`` naming the first missing tensors, if any is missing."""
        missing = self.missing()
        if missing:
            more = f" and {len(missing) - 5} more" if len(missing) > 5 else ""
            raise ValueError(
                f"{self.scheme}: {len(missing)} checkpoint tensors were never loaded: {', '.join(missing[:5])}{more}"
            )

    def release(self) -> None:
        """Drop every tensor (after the scheme built its weights from them), so the layer holds one copy of its
        weights: the backend's. Loading or reading after this raises."""
        self._w13.clear()
        self._w2.clear()
        self._released = True

    def _require_held(self) -> None:
        if self._released:
            raise RuntimeError(f"{self.scheme}: the checkpoint parameters were released after processing the weights")

    def gate_up(self, name: str) -> torch.Tensor:
        """``w13``'s tensor ``name``, ``[E_local, 2, *shape]`` (gate at index 0, up at 1)."""
        self._require_held()
        return self._w13[name]

    def down(self, name: str) -> torch.Tensor:
        """``w2``'s tensor ``name``, ``[E_local, *shape]``."""
        self._require_held()
        return self._w2[name]

    def gate_up_fused(self, name: str) -> torch.Tensor:
        """``w13``'s tensor ``name`` with the halves' rows fused, ``[E_local, 2 * out, in']`` (matrix layouts).

        A tensor of one value per projection (``ParamLayout.SCALAR``, a global scale) has no rows to fuse: its halves
        differ, and :meth:`gate_up` keeps them apart (``ValueError``)."""
        tensor = self.gate_up(name)
        if tensor.dim() < 3:
            raise ValueError(
                f"{self.scheme}: gate_up_fused({name!r}): a tensor of one value per projection has no rows to fuse; "
                f"read gate_up({name!r}) ([E_local, 2]: gate's and up's own values)"
            )
        return tensor.reshape(tensor.shape[0], 2 * tensor.shape[2], *tensor.shape[3:])
