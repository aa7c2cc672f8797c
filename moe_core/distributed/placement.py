"""Which rank holds which experts of a layer: contiguous ranges, E not necessarily divisible by the world size."""

from __future__ import annotations

from typing import final

import attrs
import torch

from moe_core._checks import require_int, require_tensor
from moe_core.config import MoeRunnerConfig
from moe_core.dispatch import StandardDispatchOutput, TopKOutput
from moe_core.distributed.errors import RedundantExpertsError


@final
@attrs.frozen
class ExpertPlacement:
    """Global experts ``[0, num_experts)`` dealt to ``world_size`` ranks in contiguous ranges.

    Rank ``r`` holds ``experts_of(r)``; the first ``num_experts % world_size``
    ranks hold one expert more (DeepSeek-V3's 256 experts on 3 ranks: 86, 85, 85).
    Every rank holds at least one expert.

    ``num_physical_experts`` counts the expert slots over all ranks. It equals
    ``num_experts`` today (physical slot = logical id). Redundant experts
    (EPLB: hot experts copied, more slots than experts) would add a
    logical-to-physical map here and a replica choice in the dispatchers;
    until then a placement with more slots raises :class:`RedundantExpertsError`.
    """

    num_experts: int
    world_size: int
    num_physical_experts: int = attrs.field(
        default=attrs.Factory(lambda self: self.num_experts, takes_self=True), kw_only=True
    )

    def __attrs_post_init__(self) -> None:
        require_int("num_experts", self.num_experts, minimum=1)
        require_int("world_size", self.world_size, minimum=1)
        require_int("num_physical_experts", self.num_physical_experts, minimum=1)
        if self.num_physical_experts > self.num_experts:
            raise RedundantExpertsError(
                f"num_physical_experts: {self.num_physical_experts} slots for {self.num_experts} experts means "
                "redundant copies, which are not built; expected num_physical_experts == num_experts"
            )
        if self.num_physical_experts < self.num_experts:
            raise ValueError(
                f"num_physical_experts: expected num_experts={self.num_experts} (every expert held once), "
                f"got {self.num_physical_experts}"
            )
        if self.world_size > self.num_experts:
            raise ValueError(
                f"world_size: expected at most num_experts={self.num_experts} ranks (each holds at least one expert), "
                f"got {self.world_size}"
            )

    @property
    def counts(self) -> tuple[int, ...]:
        """Experts held by each rank."""
        base, extra = divmod(self.num_experts, self.world_size)
        return tuple(base + (rank < extra) for rank in range(self.world_size))

    @property
    def offsets(self) -> tuple[int, ...]:
        """The first global expert of each rank."""
        base, extra = divmod(self.num_experts, self.world_size)
        return tuple(rank * base + min(rank, extra) for rank in range(self.world_size))

    def experts_of(self, rank: int) -> range:
        """The global experts rank ``rank`` holds."""
        self._check_rank(rank)
        return range(self.offsets[rank], self.offsets[rank] + self.counts[rank])

    def rank_of(self, expert_ids: torch.Tensor) -> torch.Tensor:
        """The rank holding each global expert id (int64, the shape of ``expert_ids``); arithmetic only, no sync."""
        require_tensor("expert_ids", expert_ids)
        base, extra = divmod(self.num_experts, self.world_size)
        ids = expert_ids.long()
        cut = extra * (base + 1)  # the experts of the ranks that hold base + 1
        return torch.where(ids < cut, ids // (base + 1), extra + (ids - cut) // base)

    def runner_config(self, config: MoeRunnerConfig, rank: int) -> MoeRunnerConfig:
        """``config`` (the whole layer's) as rank ``rank`` runs it: its ``num_local_experts`` and ``local_expert_offset``."""
        require_whole_layer(config)
        if config.num_experts != self.num_experts:
            raise ValueError(f"config.num_experts: expected {self.num_experts} like the placement, got {config.num_experts}")
        experts = self.experts_of(rank)
        return attrs.evolve(config, num_local_experts=len(experts), local_expert_offset=experts.start)

    def local_slice(self, per_expert: torch.Tensor, rank: int) -> torch.Tensor:
        """Rank ``rank``'s rows of a per-expert tensor ``[num_experts, ...]`` (a view).

        Slice weights, block scales and per-expert weight scales with it. A
        per-expert *input* scale is collapsed to the layer's one scalar over
        all ``num_experts`` experts first (``from_checkpoint(..., policy=...)``
        on the unsliced tensor), never over a rank's slice: every rank must
        quantize a token's activations with the same scale, or an expert's
        output would depend on which rank runs it.
        """
        require_tensor("per_expert", per_expert)
        if per_expert.dim() < 1 or per_expert.shape[0] != self.num_experts:
            raise ValueError(
                f"per_expert: expected a tensor [num_experts={self.num_experts}, ...], got shape {tuple(per_expert.shape)}"
            )
        experts = self.experts_of(rank)
        return per_expert[experts.start : experts.stop]

    def check_routing(self, hidden_states: torch.Tensor, topk: TopKOutput) -> None:
        """Raise unless ``hidden_states [T, H]`` and ``topk`` make a dispatch of this placement's layer (metadata only)."""
        StandardDispatchOutput(hidden_states, topk)
        if topk.num_experts != self.num_experts:
            raise ValueError(f"topk.num_experts: expected {self.num_experts} like the placement, got {topk.num_experts}")

    def _check_rank(self, rank: int) -> None:
        require_int("rank", rank, minimum=0)
        if rank >= self.world_size:
            raise ValueError(f"rank: expected a rank below world_size={self.world_size}, got {rank}")


def require_whole_layer(config: MoeRunnerConfig) -> None:
    """Raise unless ``config`` is a whole layer's (every expert local): the config dispatchers derive a rank's from."""
    if not isinstance(config, MoeRunnerConfig):
        raise TypeError(f"config: expected a MoeRunnerConfig, got {type(config).__name__}")
    if config.num_local_experts != config.num_experts:
        raise ValueError(
            "config: expected the whole layer's config (num_local_experts == num_experts), got "
            f"num_local_experts={config.num_local_experts}, local_expert_offset={config.local_expert_offset}"
        )
