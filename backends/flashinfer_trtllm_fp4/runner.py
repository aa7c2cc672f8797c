"""The TRT-LLM-gen FP4 runner: quantize the hidden states, one fused kernel call, bf16 out.

With precomputed top-k (the standard dispatch) it calls the routed kernel
with the ``(ids, weights)`` pair; where the dispatch carries router logits
and the config's routing method is one the kernel implements, it lets the
kernel route (for any other method, the routed kernel takes the dispatch's
top-k, which the kernel then neither recomputes nor rescales). The hidden states are quantized to NVFP4 with the quant
info's scalar ``[1]`` global scale and linear-layout block scales (the only
layout the kernel reads). Checks read metadata only; nothing is read back.

The routed scaling factor goes inside the kernel, folded into FC2's
per-expert output scalar (``output2_scale_scalar * factor``, float32, applied
before the kernel's bf16 output), not as the kernel's own
``routed_scaling_factor`` argument: the kernel applies that one only in its
DeepSeekV3 and MiniMax2 routing (``csrc/fused_moe/trtllm_backend/
trtllm_fused_moe_routing_runner.cu`` sets ``mRouteScale`` there alone) and
ignores it for Default and Renormalize routing and precomputed top-k, the
paths this runner takes. Multiplying the bf16 output afterwards would round
it once more.
"""

from __future__ import annotations

from typing import final

import attrs
import torch

from moe_core import DispatchFormat, DispatchOutput, MoeRunnerConfig, RoutingMethod, check_run_inputs
from moe_core.backends.flashinfer_trtllm_fp4.kernel import TrtllmFp4Kernels
from moe_core.backends._flashinfer import require_row_alignment, require_swiglu
from moe_core.backends.flashinfer_trtllm_fp4.quant_info import TrtllmFp4Weights

KERNEL_ROUTING = {
    RoutingMethod.SOFTMAX_TOPK: "Default",
    RoutingMethod.TOPK_RENORMALIZE: "Renormalize",
}
"""Our routing methods -> the kernel's ``RoutingMethodType`` member that computes the same."""

ACTIVATION_DTYPES = (torch.bfloat16, torch.float16)
"""Hidden-state dtypes the quantizer takes; float32 input is rounded to bf16 first."""


def _check_config(config: MoeRunnerConfig) -> None:
    require_swiglu("TRT-LLM-gen FP4 MoE", config)
    require_row_alignment(
        "TRT-LLM-gen FP4 MoE",
        hidden_size=config.hidden_size,
        intermediate_size_per_partition=config.intermediate_size_per_partition,
    )


@final
@attrs.frozen(eq=False)
class TrtllmFp4Runner:
    """Runs :class:`TrtllmFp4Weights` through ``kernels`` (FlashInfer's, or models of them in tests)."""

    config: MoeRunnerConfig = attrs.field()
    kernels: TrtllmFp4Kernels = attrs.field(kw_only=True)

    def __attrs_post_init__(self) -> None:
        _check_config(self.config)

    def run(self, dispatch: DispatchOutput, quant_info: TrtllmFp4Weights, /) -> torch.Tensor:
        """The ``[T, H]`` MoE output in the dtype of the hidden states."""
        config, kernels = self.config, self.kernels
        check_run_inputs(config, dispatch, quant_info, (DispatchFormat.STANDARD,))
        hidden = dispatch.hidden_states
        tokens, hidden_size = hidden.shape
        x = hidden if hidden.dtype in ACTIVATION_DTYPES else hidden.to(torch.bfloat16)
        x_codes, x_scale_bytes = kernels.quantize(x, quant_info.hidden_states_scale.value, 16, False, False)
        x_scales = x_scale_bytes.view(torch.float8_e4m3fn).reshape(tokens, hidden_size // 16)
        out = torch.empty((tokens, hidden_size), dtype=torch.bfloat16, device=hidden.device)
        topk = dispatch.topk
        output2_scale = quant_info.output2_scale_scalar.value
        if config.routed_scaling_factor != 1.0:
            output2_scale = output2_scale * config.routed_scaling_factor
        head = (
            None,
            x_codes,
            x_scales,
            quant_info.gemm1_weights,
            quant_info.gemm1_scales._tiles,
            None,
            None,
            None,
            None,
            quant_info.gemm2_weights,
            quant_info.gemm2_scales._tiles,
            None,
            quant_info.output1_scale_scalar.value,
            quant_info.output1_scale_gate_scalar.value,
            output2_scale,
            config.num_experts,
            config.top_k,
            None,
            None,
            config.intermediate_size_per_partition,
            config.local_expert_offset,
            config.num_local_experts,
            None,
        )
        method = config.routing_method
        kernel_method = KERNEL_ROUTING.get(method) if isinstance(method, RoutingMethod) else None
        routing = kernels.routing_methods[kernel_method or "Default"]
        if topk.router_logits is not None and topk.from_router_logits and kernel_method is not None:
            kernels.logits_moe(
                topk.router_logits,
                *head,
                routing_method_type=routing,
                do_finalize=True,
                activation_type=kernels.swiglu,
                output=out,
                **kernels.logits_extra,
            )
        else:
            kernels.routed_moe(
                (topk.topk_ids, topk.topk_weights),
                *head,
                routing_method_type=routing,
                do_finalize=True,
                activation_type=kernels.swiglu,
                output=out,
                **kernels.routed_extra,
            )
        return out if hidden.dtype == torch.bfloat16 else out.to(hidden.dtype)
