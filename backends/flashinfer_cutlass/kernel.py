"""The one module that calls FlashInfer for the CUTLASS fused-MoE backend, through a typed Protocol.

:func:`load_kernels` imports ``flashinfer.fused_moe.cutlass_fused_moe`` once,
checks that the installed signature takes every keyword this backend passes,
resolves ``ActivationType.Swiglu`` by name, and returns it behind
:class:`CutlassFusedMoe`. Tests build :class:`CutlassKernels` from a
pure-PyTorch model of the function instead (``tests/kernel_models``).

The first seven arguments (``input`` .. ``quant_scales``) are the stable head,
positional in every supported release; the rest go by keyword. The function
returns the output in some releases and a one-element list in others: the
runner passes a preallocated ``output`` and ignores what comes back.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, final

import attrs
import torch

from moe_core.backends._flashinfer import require_parameters

TAIL_KEYWORDS = ("ep_size", "ep_rank", "output", "activation_type")
"""Keyword arguments every supported release takes after the stable head."""


class CutlassFusedMoe(Protocol):
    """``flashinfer.fused_moe.cutlass_fused_moe`` as this backend calls it."""

    def __call__(
        self,
        input: torch.Tensor,
        token_selected_experts: torch.Tensor,
        token_final_scales: torch.Tensor,
        fc1_expert_weights: torch.Tensor,
        fc2_expert_weights: torch.Tensor,
        output_dtype: torch.dtype,
        quant_scales: Sequence[torch.Tensor] | None,
        /,
        *,
        ep_size: int,
        ep_rank: int,
        output: torch.Tensor,
        activation_type: object,
    ) -> object:
        """Writes the MoE output into ``output``; ``activation_type`` is the release's ``ActivationType`` member."""
        ...


@final
@attrs.frozen(eq=False, kw_only=True)
class CutlassKernels:
    """The FlashInfer function the runner calls, typed, with the release's SwiGLU member."""

    fused_moe: CutlassFusedMoe
    swiglu: object
    """``ActivationType.Swiglu`` of the installed release (an enum member; passed as is)."""


def load_kernels() -> CutlassKernels:
    """FlashInfer's ``cutlass_fused_moe`` behind :class:`CutlassFusedMoe` (imports flashinfer; raises if its API drifted)."""
    from flashinfer.fused_moe import cutlass_fused_moe
    from flashinfer.tllm_enums import ActivationType

    require_parameters(cutlass_fused_moe, "flashinfer.fused_moe.cutlass_fused_moe", TAIL_KEYWORDS)
    return CutlassKernels(fused_moe=cutlass_fused_moe, swiglu=ActivationType.Swiglu)
