"""An MoE layer in float64, one token and one expert at a time: the check on the reference backends.

It shares nothing with the reference runners but the NVFP4 quantizer (itself
checked bit for bit against compressed-tensors), so an indexing, routing,
scaling or activation mistake in either shows up as a difference.
"""

from __future__ import annotations

import torch

from moe_core.config import Activation, MoeRunnerConfig
from moe_core.dispatch import DispatchOutput
from moe_core.global_scales import QuantizeGlobalScale
from moe_core.nvfp4 import Nvfp4Tensor


def _fake_quantize(x: torch.Tensor, scale: QuantizeGlobalScale) -> torch.Tensor:
    """One token's vector after an NVFP4 round trip from its float32 value, as float64."""
    return Nvfp4Tensor.quantize(x.float()[None], scale).dequantize()[0].double()


def float64_moe(
    config: MoeRunnerConfig,
    dispatch: DispatchOutput,
    w13: torch.Tensor,
    w2: torch.Tensor,
    input_scales: tuple[QuantizeGlobalScale, QuantizeGlobalScale] | None = None,
) -> torch.Tensor:
    """The layer's ``[T, H]`` output in float64, on the CPU, for weights ``w13 [E, 2I, H]`` and ``w2 [E, H, I]``.

    With ``input_scales``, each GEMM input goes through an NVFP4 round trip
    first (from its float32 value, as W4A4 kernels see it).
    """
    hidden, topk = dispatch.hidden_states.cpu(), dispatch.topk
    ids, weights = topk.topk_ids.cpu(), topk.topk_weights.cpu()
    w13, w2 = w13.cpu(), w2.cpu()
    inter = config.intermediate_size_per_partition
    out = torch.zeros(hidden.shape, dtype=torch.float64)
    for t in range(hidden.shape[0]):
        for k in range(topk.top_k):
            local = int(ids[t, k]) - config.local_expert_offset
            if not 0 <= local < config.num_local_experts:
                continue
            xt = hidden[t].double()
            if input_scales is not None:
                xt = _fake_quantize(xt, input_scales[0])
            h = w13[local].double() @ xt
            gate, up = h[:inter], h[inter:]
            if config.activation is Activation.SILU_GATED:
                act = gate * torch.sigmoid(gate) * up
            else:
                act = 0.5 * gate * (1 + torch.erf(gate / 2**0.5)) * up
            if input_scales is not None:
                act = _fake_quantize(act, input_scales[1])
            out[t] += float(weights[t, k]) * (w2[local].double() @ act)
    return out * config.routed_scaling_factor
