"""What every format's expert weights share: the ``w13 [E, 2I, H]`` / ``w2 [E, H, I]`` sizes a quant info reports."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol, runtime_checkable

import torch

if TYPE_CHECKING:  # the dense kit imports this module
    from moe_core.formats.dense.weights import DenseMoeWeights


def shape3(tensor: torch.Tensor) -> tuple[int, int, int]:
    """A 3-d stack's ``(num_experts, rows, cols)`` as ints."""
    first, second, third = tensor.shape
    return int(first), int(second), int(third)


def check_expert_shapes(cls_name: str, w13: tuple[int, int, int], w2: tuple[int, int, int]) -> None:
    """``ValueError`` naming ``cls_name`` unless ``w13 [E, 2I, H]`` and ``w2 [E, H, I]`` agree."""
    experts, two_i, hidden = w13
    if two_i % 2:
        raise ValueError(f"{cls_name}.w13: expected an even row count [gate | up], got {two_i}")
    expected = (experts, hidden, two_i // 2)
    if w2 != expected:
        raise ValueError(
            f"{cls_name}.w2: expected shape {expected} [num_experts, hidden_size, intermediate_size] "
            f"to match w13 {w13}, got {w2}"
        )


@runtime_checkable
class Dequantizes(Protocol):
    """Quantized canonical weights that give back the dense weights their codes stand for (every format but dense)."""

    def dequantize(self, dtype: torch.dtype = torch.float32) -> DenseMoeWeights:
        """The dense weights (and biases) the codes stand for; activation scales are not used."""
        ...


class Stacked(Protocol):
    """Stacked expert matrices (a tensor, or quantized codes) that report their ``(num_experts, rows, cols)``."""

    @property
    def shape(self) -> Sequence[int]: ...


class ExpertSizes:
    """The sizes a QuantInfo reports, read from its ``w13 [E, 2I, H]`` and ``w2 [E, H, I]`` stacks."""

    w13: Stacked
    w2: Stacked

    @property
    def num_experts(self) -> int:
        """Experts held (this rank's local experts)."""
        return int(self.w13.shape[0])

    @property
    def hidden_size(self) -> int:
        """H."""
        return int(self.w13.shape[2])

    @property
    def intermediate_size(self) -> int:
        """I, per partition."""
        return int(self.w2.shape[2])


class TensorExperts(ExpertSizes):
    """The QuantInfo properties of weights held as two tensors ``w13`` and ``w2`` (dense, or a kernel's layout)."""

    w13: torch.Tensor
    w2: torch.Tensor

    @property
    def device(self) -> torch.device:
        """Where the weights live."""
        return self.w13.device
