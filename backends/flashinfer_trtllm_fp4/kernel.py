"""The one module that calls FlashInfer for the TRT-LLM-gen FP4 backend, through typed Protocols.

FlashInfer's functions are typed ``Any``; :func:`load_kernels` imports them
once, checks that the installed signatures take every keyword this backend
passes (:func:`~moe_core.backends._flashinfer.require_parameters`), resolves
the enum members by name, and returns them behind the Protocols below. The
runner never touches ``flashinfer`` itself, and tests hand it
:class:`TrtllmFp4Kernels` built from pure-PyTorch models of the same
functions (``tests/kernel_models``).

Arguments up to ``routed_scaling_factor`` are the stable head (positional in
every supported release); everything after it is passed by keyword.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol, final

import attrs
import torch

from moe_core.backends._flashinfer import require_parameters

EPILOGUE_TILE_M = 128
"""Rows per epilogue tile the weight shuffle is built for (FlashInfer's tests use 128 with these kernels)."""

TAIL_KEYWORDS = ("routing_method_type", "do_finalize", "activation_type", "output")
"""Keyword arguments every supported release takes after the stable head."""

OPTIONAL_KEYWORDS = ("hidden_states_scale_layout", "nvfp4_4over6")
"""Keyword arguments of newer releases, passed only where the installed function takes them."""


class Fp4Quantize(Protocol):
    """``flashinfer.fp4_quantize``: NVFP4 codes ``uint8 [T, H / 2]`` and E4M3 scale bytes of ``input``."""

    def __call__(
        self,
        input: torch.Tensor,
        global_scale: torch.Tensor,
        sf_vec_size: int,
        sf_use_ue8m0: bool,
        is_sf_swizzled_layout: bool,
        /,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Quantize with the quantize-side ``global_scale`` (``[1]`` float32)."""
        ...


class TrtllmFp4RoutedMoe(Protocol):
    """``flashinfer.fused_moe.trtllm_fp4_block_scale_routed_moe`` as this backend calls it."""

    def __call__(
        self,
        topk_ids: tuple[torch.Tensor, torch.Tensor],
        routing_bias: None,
        hidden_states: torch.Tensor,
        hidden_states_scale: torch.Tensor,
        gemm1_weights: torch.Tensor,
        gemm1_weights_scale: torch.Tensor,
        gemm1_bias: None,
        gemm1_alpha: None,
        gemm1_beta: None,
        gemm1_clamp_limit: None,
        gemm2_weights: torch.Tensor,
        gemm2_weights_scale: torch.Tensor,
        gemm2_bias: None,
        output1_scale_scalar: torch.Tensor,
        output1_scale_gate_scalar: torch.Tensor,
        output2_scale_scalar: torch.Tensor,
        num_experts: int,
        top_k: int,
        n_group: None,
        topk_group: None,
        intermediate_size: int,
        local_expert_offset: int,
        local_num_experts: int,
        routed_scaling_factor: None,
        /,
        *,
        routing_method_type: int,
        do_finalize: bool,
        activation_type: int,
        output: torch.Tensor,
        **newer: object,
    ) -> object:
        """Writes the MoE output into ``output``; ``newer`` holds :data:`OPTIONAL_KEYWORDS` the release takes."""
        ...


class TrtllmFp4LogitsMoe(Protocol):
    """``flashinfer.fused_moe.trtllm_fp4_block_scale_moe`` (routing inside the kernel) as this backend calls it."""

    def __call__(
        self,
        routing_logits: torch.Tensor,
        routing_bias: None,
        hidden_states: torch.Tensor,
        hidden_states_scale: torch.Tensor,
        gemm1_weights: torch.Tensor,
        gemm1_weights_scale: torch.Tensor,
        gemm1_bias: None,
        gemm1_alpha: None,
        gemm1_beta: None,
        gemm1_clamp_limit: None,
        gemm2_weights: torch.Tensor,
        gemm2_weights_scale: torch.Tensor,
        gemm2_bias: None,
        output1_scale_scalar: torch.Tensor,
        output1_scale_gate_scalar: torch.Tensor,
        output2_scale_scalar: torch.Tensor,
        num_experts: int,
        top_k: int,
        n_group: None,
        topk_group: None,
        intermediate_size: int,
        local_expert_offset: int,
        local_num_experts: int,
        routed_scaling_factor: None,
        /,
        *,
        routing_method_type: int,
        do_finalize: bool,
        activation_type: int,
        output: torch.Tensor,
        **newer: object,
    ) -> object:
        """Routes ``routing_logits`` and writes the MoE output into ``output``."""
        ...


@final
@attrs.frozen(eq=False, kw_only=True)
class TrtllmFp4Kernels:
    """The FlashInfer functions the runner calls, typed, with the installed release's enums and optional keywords."""

    quantize: Fp4Quantize
    routed_moe: TrtllmFp4RoutedMoe
    logits_moe: TrtllmFp4LogitsMoe
    routing_methods: Mapping[str, int]
    """``RoutingMethodType`` member name -> the value this release gives it."""
    swiglu: int
    """``ActivationType.Swiglu``'s value in this release."""
    routed_extra: Mapping[str, object]
    """:data:`OPTIONAL_KEYWORDS` the installed routed function takes, with the values to pass."""
    logits_extra: Mapping[str, object]
    """The same for the logits function."""


def _newer_keywords(parameters: frozenset[str], linear_layout: object) -> dict[str, object]:
    values: dict[str, object] = {"hidden_states_scale_layout": linear_layout, "nvfp4_4over6": None}
    return {name: values[name] for name in OPTIONAL_KEYWORDS if name in parameters}


def load_kernels() -> TrtllmFp4Kernels:
    """FlashInfer's functions behind this backend's Protocols (imports flashinfer; raises if its API drifted)."""
    import flashinfer
    from flashinfer.fused_moe import trtllm_fp4_block_scale_moe, trtllm_fp4_block_scale_routed_moe
    from flashinfer.tllm_enums import ActivationType, RoutingMethodType, SfLayout

    routed = require_parameters(
        trtllm_fp4_block_scale_routed_moe, "flashinfer.fused_moe.trtllm_fp4_block_scale_routed_moe", TAIL_KEYWORDS
    )
    logits = require_parameters(trtllm_fp4_block_scale_moe, "flashinfer.fused_moe.trtllm_fp4_block_scale_moe", TAIL_KEYWORDS)
    return TrtllmFp4Kernels(
        quantize=flashinfer.fp4_quantize,
        routed_moe=trtllm_fp4_block_scale_routed_moe,
        logits_moe=trtllm_fp4_block_scale_moe,
        routing_methods={member.name: int(member) for member in RoutingMethodType},
        swiglu=int(ActivationType.Swiglu),
        routed_extra=_newer_keywords(routed, SfLayout.layout_linear),
        logits_extra=_newer_keywords(logits, SfLayout.layout_linear),
    )


def fc1_row_order(rows: int) -> torch.Tensor:
    """Source row of each kernel row of FC1 ``[up; gate]`` (``rows = 2 * I``): gated interleave, then the epilogue shuffle.

    FlashInfer's own index helpers (pure PyTorch), composed as its tests do
    (``tests/moe/trtllm_gen_fused_moe_utils.py``, ``FP4Moe.prepare_static_weights_for_kernel``).
    """
    from flashinfer.fused_moe.core import get_reorder_rows_for_gated_act_gemm_row_indices
    from flashinfer.utils import get_shuffle_matrix_a_row_indices

    shape_only = torch.empty((rows, 1), dtype=torch.uint8)
    interleave: torch.Tensor = get_reorder_rows_for_gated_act_gemm_row_indices(shape_only)
    shuffle: torch.Tensor = get_shuffle_matrix_a_row_indices(shape_only, EPILOGUE_TILE_M)
    return interleave[shuffle]


def fc2_row_order(rows: int) -> torch.Tensor:
    """Source row of each kernel row of FC2 (``rows = H``): the epilogue shuffle only."""
    from flashinfer.utils import get_shuffle_matrix_a_row_indices

    order: torch.Tensor = get_shuffle_matrix_a_row_indices(torch.empty((rows, 1), dtype=torch.uint8), EPILOGUE_TILE_M)
    return order
