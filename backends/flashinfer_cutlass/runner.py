"""The CUTLASS fused-MoE runner: one kernel call per forward, into a preallocated output.

One runner class serves every format: each quant info hands over its
kernel operands (:meth:`CutlassQuantInfo.kernel_operands`) and the hidden
states as the kernel takes them (:meth:`CutlassQuantInfo.kernel_input`). Expert parallelism goes as the kernel's
``ep_size``/``ep_rank``, so the config's local experts must be one of
``num_experts / num_local_experts`` equal slices. Checks read metadata only.
"""

from __future__ import annotations

from typing import Generic, Protocol, TypeVar, final

import attrs
import torch

from moe_core import DispatchFormat, DispatchOutput, MoeRunnerConfig, QuantInfo, check_run_inputs
from moe_core.backends._flashinfer import require_swiglu
from moe_core.backends.flashinfer_cutlass.kernel import CutlassKernels

OUTPUT_DTYPES = (torch.bfloat16, torch.float16)
"""Output dtypes the kernel writes; float32 hidden states get a bf16 result, converted back."""


class CutlassQuantInfo(QuantInfo, Protocol):
    """What the runner needs of a CUTLASS quant info besides the common facts."""

    def kernel_input(self, hidden_states: torch.Tensor) -> torch.Tensor:
        """The hidden states as the kernel takes them (cast, or quantized with a static scale)."""
        ...

    def kernel_operands(self) -> tuple[torch.Tensor, torch.Tensor, list[torch.Tensor] | None]:
        """``fc1_expert_weights``, ``fc2_expert_weights``, ``quant_scales``."""
        ...


Q = TypeVar("Q", bound=CutlassQuantInfo)


def expert_parallel_rank(config: MoeRunnerConfig) -> tuple[int, int]:
    """``(ep_size, ep_rank)`` for the config's local experts; ``ValueError`` if they are not an equal slice."""
    local, offset, total = config.num_local_experts, config.local_expert_offset, config.num_experts
    if total % local or offset % local:
        raise ValueError(
            f"CUTLASS fused MoE: local experts [{offset}, {offset + local}) of {total} are not one of "
            f"{total}/{local} equal slices (the kernel takes expert parallelism as ep_size/ep_rank)"
        )
    return total // local, offset // local


@final
@attrs.frozen(eq=False)
class CutlassRunner(Generic[Q]):
    """Runs a CUTLASS quant info ``Q`` through ``kernels`` (FlashInfer's, or a model of them in tests)."""

    config: MoeRunnerConfig = attrs.field()
    kernels: CutlassKernels = attrs.field(kw_only=True)
    ep_size: int = attrs.field(init=False)
    ep_rank: int = attrs.field(init=False)

    def __attrs_post_init__(self) -> None:
        require_swiglu("CUTLASS fused MoE", self.config)
        ep_size, ep_rank = expert_parallel_rank(self.config)
        object.__setattr__(self, "ep_size", ep_size)
        object.__setattr__(self, "ep_rank", ep_rank)

    def run(self, dispatch: DispatchOutput, quant_info: Q, /) -> torch.Tensor:
        """The ``[T, H]`` MoE output in the dtype of the hidden states."""
        config = self.config
        check_run_inputs(config, dispatch, quant_info, (DispatchFormat.STANDARD,))
        hidden = dispatch.hidden_states
        out_dtype = hidden.dtype if hidden.dtype in OUTPUT_DTYPES else torch.bfloat16
        x = quant_info.kernel_input(hidden)
        weights = dispatch.topk.topk_weights
        if config.routed_scaling_factor != 1.0:
            weights = weights * config.routed_scaling_factor
        fc1, fc2, quant_scales = quant_info.kernel_operands()
        out = torch.empty(hidden.shape, dtype=out_dtype, device=hidden.device)
        self.kernels.fused_moe(
            x,
            dispatch.topk.topk_ids,
            weights,
            fc1,
            fc2,
            out_dtype,
            quant_scales,
            ep_size=self.ep_size,
            ep_rank=self.ep_rank,
            output=out,
            activation_type=self.kernels.swiglu,
        )
        return out if out_dtype == hidden.dtype else out.to(hidden.dtype)
