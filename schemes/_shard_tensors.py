"""Checkpoint tensors whose per-expert shapes :class:`~moe_core.expert_params.ParamLayout` has no layout for.

gpt-oss's E8M0 scales (one per 32 elements) and biases (one-dimensional),
compressed-tensors' per-channel FP8 scales (``[out, 1]``) and DeepSeek-V3's
128x128 block scales (``[out / 128, in / 128]``): each spec gives its shape as
a function of the projection's ``(out_features, in_features)``. Filled one
expert and one shard at a time, as :class:`~moe_core.expert_params.ExpertParams`
is, with the same checks and messages; the schemes that use it create no
``ExpertParams`` tensors. (Folding this into ``ParamLayout`` would let them.)
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Sequence
from typing import TypeVar, final

import attrs
import torch

from moe_core._checks import require_int, require_tensor
from moe_core.config import MoeRunnerConfig
from moe_core.conversion import WeightFormat
from moe_core.expert_params import ExpertShard
from moe_core.registry import FormatRoute
from moe_core.runner import QuantInfo
from moe_core.scheme import ExpertScheme

W = TypeVar("W", bound=QuantInfo)

_SHARDS = list(ExpertShard)


@final
@attrs.frozen
class TensorSpec:
    """One checkpoint tensor of every expert projection, its shape a function of ``(out_features, in_features)``."""

    name: str
    dtype: torch.dtype
    shape: Callable[[int, int], tuple[int, ...]]
    every_expert: bool = attrs.field(default=False, kw_only=True)
    """Kept for every expert of the layer (a static input scale), not only this rank's."""
    upcast_from: tuple[torch.dtype, ...] = attrs.field(default=(), kw_only=True)
    """Narrower dtypes also taken, stored exactly as ``dtype`` (llmcompressor writes FP8 scales in bf16)."""


class ShardTensors:
    """This rank's experts' tensors of ``specs``: ``gate_up(name)`` is ``[E_local, 2, *shape]`` (gate at 0),
    ``down(name)`` ``[E_local, *shape]``; ``[E, ...]`` with global ids for ``every_expert`` specs."""

    def __init__(self, scheme: str, specs: Sequence[TensorSpec], config: MoeRunnerConfig, device: torch.device) -> None:
        self.scheme = scheme
        self.config = config
        self.specs = {spec.name: spec for spec in specs}
        hidden, inter = config.hidden_size, config.intermediate_size_per_partition
        self._sizes = {ExpertShard.GATE: (inter, hidden), ExpertShard.UP: (inter, hidden), ExpertShard.DOWN: (hidden, inter)}
        self._w13: dict[str, torch.Tensor] = {}
        self._w2: dict[str, torch.Tensor] = {}
        for spec in specs:
            experts = config.num_experts if spec.every_expert else config.num_local_experts
            self._w13[spec.name] = torch.empty((experts, 2, *spec.shape(inter, hidden)), dtype=spec.dtype, device=device)
            self._w2[spec.name] = torch.empty((experts, *spec.shape(hidden, inter)), dtype=spec.dtype, device=device)
        self._loaded = {name: torch.zeros(self._w2[name].shape[0], 3, dtype=torch.bool) for name in self.specs}

    def load(self, name: str, tensor: torch.Tensor, *, expert_id: int, shard: ExpertShard) -> bool:
        """Copy one checkpoint tensor in; False for an expert of another rank. Raises naming the tensor for an unknown
        name, a wrong dtype or shape (a one-value tensor ``[]`` and ``[1]`` are the same)."""
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
        out_features, in_features = self._sizes[shard]
        expected = spec.shape(out_features, in_features)
        shape = tuple(tensor.shape)
        if shape != expected and not (tensor.numel() == 1 and expected in ((), (1,)) and shape in ((), (1,))):
            raise ValueError(
                f"{where}: expected shape {expected} for a projection of out_features={out_features}, "
                f"in_features={in_features}, got {shape}"
            )
        if not self._w2:
            raise RuntimeError(f"{self.scheme}: the checkpoint tensors were released after processing the weights")
        local = expert_id if spec.every_expert else expert_id - config.local_expert_offset
        if not 0 <= local < self._w2[name].shape[0]:
            return False
        value = tensor.reshape(expected)
        if shard is ExpertShard.DOWN:
            self._w2[name][local].copy_(value)
        else:
            self._w13[name][local, 0 if shard is ExpertShard.GATE else 1].copy_(value)
        self._loaded[name][local, _SHARDS.index(shard)] = True
        return True

    def require_complete(self) -> None:
        """Raise ``ValueError`` naming the first missing tensors, if any is missing."""
        missing = [
            f"experts.{index + (0 if self.specs[name].every_expert else self.config.local_expert_offset)}"
            f".{_SHARDS[column].projection}.{name}"
            for name, loaded in self._loaded.items()
            for index, column in (~loaded).nonzero().tolist()
        ]
        if missing:
            more = f" and {len(missing) - 5} more" if len(missing) > 5 else ""
            raise ValueError(
                f"{self.scheme}: {len(missing)} checkpoint tensors were never loaded: {', '.join(missing[:5])}{more}"
            )

    def gate_up(self, name: str) -> torch.Tensor:
        """``w13``'s tensor ``name``, ``[E_local, 2, *shape]``."""
        return self._w13[name]

    def gate_up_fused(self, name: str) -> torch.Tensor:
        """``w13``'s tensor ``name`` with the halves' rows fused, ``[E_local, 2 * out, ...]``."""
        tensor = self._w13[name]
        return tensor.reshape(tensor.shape[0], 2 * tensor.shape[2], *tensor.shape[3:])

    def down(self, name: str) -> torch.Tensor:
        """``w2``'s tensor ``name``, ``[E_local, *shape]``."""
        return self._w2[name]

    def release(self) -> None:
        """Drop every tensor once the canonical weights are built; loading after this raises."""
        self._w13.clear()
        self._w2.clear()


class ShardScheme(ExpertScheme[W], abc.ABC):
    """A scheme whose checkpoint tensors are :class:`ShardTensors` (``self.tensors``), released after processing."""

    def __init__(
        self,
        name: str,
        source: WeightFormat[W],
        specs: Sequence[TensorSpec],
        config: MoeRunnerConfig,
        device: torch.device,
        *,
        backend: FormatRoute[W] | str | None,
        strict: bool,
        activation_dtype: torch.dtype,
    ) -> None:
        super().__init__(name, source, (), config, device, backend=backend, strict=strict, activation_dtype=activation_dtype)
        self.tensors = ShardTensors(name, specs, config, device)
        """The checkpoint tensors of this rank's experts, until processed."""

    def load_expert_weight(self, name: str, tensor: torch.Tensor, *, expert_id: int, shard: ExpertShard) -> bool:
        """Take one checkpoint tensor (``experts.{expert_id}.{shard}.{name}``); False if the expert is not local."""
        return self.tensors.load(name, tensor, expert_id=expert_id, shard=shard)

    def process_weights_after_loading(self, *, keep_canonical: bool = False) -> None:
        """As every scheme does, first naming any tensor never loaded; then the checkpoint tensors are released."""
        self.tensors.require_complete()
        super().process_weights_after_loading(keep_canonical=keep_canonical)
        self.tensors.release()
