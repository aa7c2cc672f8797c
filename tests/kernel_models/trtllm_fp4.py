"""Pure-PyTorch models of the FlashInfer functions the TRT-LLM-gen FP4 backend calls.

Each model has the installed function's exact signature (tests/test_kernel_models.py
checks it against flashinfer 0.7.4), refuses what the real launcher refuses,
raises ``NotImplementedError`` for features it does not model, and computes
what the kernel computes, in float32. Rules, each from FlashInfer's source:

- Arguments (``flashinfer/fused_moe/core.py`` ``trtllm_fp4_block_scale_routed_moe``
  docstring, ``csrc/trtllm_fused_moe_kernel_launcher.cu`` ``FP4BlockScaleLauncher``):
  ids int32 and weights bf16/float32 ``[T, top_k]``; hidden states uint8
  ``[T, H / 2]`` with E4M3 scales ``[T, H / 16]`` (or flat), in the linear layout
  only: a declared swizzled layout raises ``NotImplementedError``, an undeclared
  one warns (deprecated); uint8 weights ``[local_experts, 2I, H / 2]`` and
  ``[local_experts, H, I / 2]`` with E4M3 scales of the same rows; the three
  output scalars required, float32 ``[local_num_experts]``; ``intermediate_size``
  a multiple of 128 ("the second dimension of weights must be a multiple of 128").
- Weight layout (``tests/moe/trtllm_gen_fused_moe_utils.py``
  ``FP4Moe.prepare_static_weights_for_kernel``): FC1 rows ``[up; gate]``
  (``fused_moe/core.py`` ``reorder_rows_for_gated_act_gemm``: "rows [0, M // 2)
  are X1 (the linear/up half)"), interleaved by that function, then shuffled by
  ``shuffle_matrix_a`` with epilogue tile 128; FC2 rows shuffled; scales shuffled
  like their rows, then 128x4-interleaved. The model undoes the row orders with
  FlashInfer's own index helpers and the interleave by its offset formula.
- Numerics (``tests/moe/test_trtllm_gen_fused_moe.py`` ``run_moe_dequant``; the
  scalars of ``FP4Moe.prepare_static_weights_for_kernel``):
  ``h = silu(x2 * output1_scale_gate_scalar) * (x1 * output1_scale_scalar)`` with
  ``x1`` the up and ``x2`` the gate accumulators, ``h`` quantized to NVFP4 with
  global scale 1 (``output1_scale_scalar`` already carries the activation's),
  ``y = (h @ W2^T) * output2_scale_scalar``, summed over the token's local
  experts with its routing weights; bf16 out.
- Routing inside the kernel (``RoutingMethodType``): ``Default`` is softmax then
  top-k, ``Renormalize`` top-k then softmax; the weights come out in bf16
  (the ``trtllm_fp4_block_scale_moe`` docstring, Returns).
- ``routed_scaling_factor``: the kernel scales the routing weights by it only in
  its DeepSeekV3 and MiniMax2 routing (``csrc/fused_moe/trtllm_backend/
  trtllm_fused_moe_routing_runner.cu``: ``mRouteScale`` is set in those branches
  alone); for Default and Renormalize, and for precomputed top-k, it is accepted
  and ignored. The model does the same, and raises ``NotImplementedError`` for
  a factor with any other routing method.
"""

from __future__ import annotations

import warnings
from typing import Optional, Union

import torch
from flashinfer.fused_moe.core import get_reorder_rows_for_gated_act_gemm_row_indices
from flashinfer.tllm_enums import ActivationType, RoutingMethodType, SfLayout
from flashinfer.utils import get_shuffle_matrix_a_row_indices

from tests.kernel_models import nvfp4_layouts
from tests.kernel_models.nvfp4_layouts import decode_packed, dequantize, quantize_blocks, unswizzle

UNSET = object()
"""Stands for FlashInfer's own "read the environment" sentinel default."""

EPILOGUE_TILE_M = 128


def _require(condition: bool, message: str) -> None:
    if not condition:
        raise ValueError(message)


def _require_tensor(name: str, tensor: object, dtypes: tuple[torch.dtype, ...], shape: tuple[int, ...]) -> torch.Tensor:
    _require(isinstance(tensor, torch.Tensor), f"{name} must be a tensor, got {type(tensor).__name__}")
    assert isinstance(tensor, torch.Tensor)
    _require(tensor.dtype in dtypes, f"{name} must be {' or '.join(map(str, dtypes))}, got {tensor.dtype}")
    _require(tuple(tensor.shape) == shape, f"{name} must have shape {shape}, got {tuple(tensor.shape)}")
    return tensor


def _unsupported(**arguments: object) -> None:
    for name, value in arguments.items():
        if value is not None:
            raise NotImplementedError(f"the model does not cover {name}")


def fp4_quantize(
    input: torch.Tensor,
    global_scale: Optional[torch.Tensor] = None,
    sf_vec_size: int = 16,
    sf_use_ue8m0: bool = False,
    is_sf_swizzled_layout: bool = True,
    is_sf_8x4_layout: bool = False,
    is_global_scale_inversed: bool = False,
    enable_pdl: Optional[bool] = None,
    backend: str = "auto",
    nvfp4_4over6: object = UNSET,
    *,
    batch_invariant: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Model of ``flashinfer.fp4_quantize`` for NVFP4 with linear scales: codes uint8 ``[T, H / 2]``, scale bytes ``[T, H / 16]``.

    ``global_scale`` is the quantize-side ``[1]`` float32 scalar
    (``fp4_quantization.py`` ``fp4_quantize`` docstring); the model refuses a per-expert one.
    """
    _require(input.dtype in (torch.bfloat16, torch.float16), f"input must be bf16 or fp16, got {input.dtype}")
    _require(input.dim() == 2 and input.shape[-1] % 16 == 0, f"input must be [M, K] with K % 16 == 0, got {tuple(input.shape)}")
    _require(global_scale is not None, "NVFP4 needs global_scale")
    assert global_scale is not None
    _require(
        global_scale.dtype == torch.float32 and global_scale.numel() == 1,
        f"global_scale must be one float32 value, got {global_scale.dtype} {tuple(global_scale.shape)}",
    )
    if sf_vec_size != 16 or sf_use_ue8m0 or is_sf_swizzled_layout or is_sf_8x4_layout or is_global_scale_inversed:
        raise NotImplementedError("the model covers NVFP4 (16, E4M3) with linear, non-inverted scales only")
    values, scales = quantize_blocks(input, global_scale.float().reshape(()))
    return nvfp4_layouts.encode_packed(values), scales.view(torch.uint8)


def _logical_rows(kernel_rows: torch.Tensor, order: torch.Tensor) -> torch.Tensor:
    """Undo ``kernel = logical[order]`` along dim 1."""
    logical = torch.empty_like(kernel_rows)
    logical[:, order] = kernel_rows
    return logical


def _fc1_order(rows: int) -> torch.Tensor:
    shape_only = torch.empty((rows, 1), dtype=torch.uint8)
    interleave: torch.Tensor = get_reorder_rows_for_gated_act_gemm_row_indices(shape_only)
    shuffle: torch.Tensor = get_shuffle_matrix_a_row_indices(shape_only, EPILOGUE_TILE_M)
    return interleave[shuffle]


def _fc2_order(rows: int) -> torch.Tensor:
    shuffle: torch.Tensor = get_shuffle_matrix_a_row_indices(torch.empty((rows, 1), dtype=torch.uint8), EPILOGUE_TILE_M)
    return shuffle


def _dequantized_weights(codes: torch.Tensor, scales: torch.Tensor, order: torch.Tensor) -> torch.Tensor:
    """Logical float32 weights ``[E, rows, cols]`` from the kernel's shuffled codes and swizzled scales."""
    experts, rows, half_cols = codes.shape
    linear_scales = unswizzle(scales, rows, 2 * half_cols // 16)
    weights = dequantize(decode_packed(codes), linear_scales)
    return _logical_rows(weights, order.to(codes.device))


def _check_layout(hidden_states_scale_layout: object) -> None:
    if hidden_states_scale_layout is None:
        warnings.warn("hidden_states_scale_layout omitted: linear layout inferred (deprecated)", DeprecationWarning, stacklevel=3)
    elif hidden_states_scale_layout != SfLayout.layout_linear:
        raise NotImplementedError(f"trtllm-gen reads hidden_states_scale in the linear layout only, got {hidden_states_scale_layout}")


def _fp4_moe(
    ids: torch.Tensor,
    weights: torch.Tensor,
    hidden_states: torch.Tensor,
    hidden_states_scale: torch.Tensor,
    gemm1_weights: torch.Tensor,
    gemm1_weights_scale: torch.Tensor,
    gemm2_weights: torch.Tensor,
    gemm2_weights_scale: torch.Tensor,
    scalars: tuple[Optional[torch.Tensor], Optional[torch.Tensor], Optional[torch.Tensor]],
    num_experts: int,
    intermediate_size: int,
    local_expert_offset: int,
    local_num_experts: int,
    output: Optional[torch.Tensor],
) -> list[torch.Tensor]:
    tokens, top_k = ids.shape
    _require(hidden_states.dtype == torch.uint8, f"hidden_states must be packed NVFP4 (uint8), got {hidden_states.dtype}")
    _require(hidden_states.dim() == 2 and hidden_states.shape[0] == tokens, f"hidden_states must be [{tokens}, H / 2], got {tuple(hidden_states.shape)}")
    hidden = 2 * int(hidden_states.shape[1])
    _require(hidden_states_scale.dtype == torch.float8_e4m3fn, f"hidden_states_scale must be float8_e4m3fn, got {hidden_states_scale.dtype}")
    _require(
        hidden_states_scale.numel() == tokens * hidden // 16,
        f"hidden_states_scale must hold [{tokens}, {hidden // 16}] linear scales, got shape {tuple(hidden_states_scale.shape)}",
    )
    _require(intermediate_size % 128 == 0, "the second dimension of weights must be a multiple of 128.")
    _require(0 <= local_expert_offset and local_expert_offset + local_num_experts <= num_experts, "local experts exceed num_experts")
    inter = intermediate_size
    _require_tensor("gemm1_weights", gemm1_weights, (torch.uint8,), (local_num_experts, 2 * inter, hidden // 2))
    _require_tensor("gemm1_weights_scale", gemm1_weights_scale, (torch.float8_e4m3fn,), (local_num_experts, 2 * inter, hidden // 16))
    _require_tensor("gemm2_weights", gemm2_weights, (torch.uint8,), (local_num_experts, hidden, inter // 2))
    _require_tensor("gemm2_weights_scale", gemm2_weights_scale, (torch.float8_e4m3fn,), (local_num_experts, hidden, inter // 16))
    names = ("output1_scale_scalar", "output1_scale_gate_scalar", "output2_scale_scalar")
    for name, scalar in zip(names, scalars):
        _require(scalar is not None, f"{name} is required for E2m1 activation")
        _require_tensor(name, scalar, (torch.float32,), (local_num_experts,))
    scale_c1, scale_gate1, scale_c2 = (s.float() for s in scalars if s is not None)
    if output is not None:
        _require_tensor("output", output, (torch.bfloat16,), (tokens, hidden))

    x = dequantize(decode_packed(hidden_states), hidden_states_scale.reshape(tokens, hidden // 16))
    w1 = _dequantized_weights(gemm1_weights, gemm1_weights_scale.view(torch.uint8), _fc1_order(2 * inter))
    w2 = _dequantized_weights(gemm2_weights, gemm2_weights_scale.view(torch.uint8), _fc2_order(hidden))
    result = torch.zeros((tokens, hidden), dtype=torch.float32, device=hidden_states.device)
    one = torch.ones((), dtype=torch.float32, device=hidden_states.device)
    for local in range(local_num_experts):
        rows, slots = torch.nonzero(ids == local_expert_offset + local, as_tuple=True)
        if rows.numel() == 0:
            continue
        acc1 = x[rows] @ w1[local].T
        up, gate = acc1[:, :inter] * scale_c1[local], acc1[:, inter:] * scale_gate1[local]
        h_values, h_scales = quantize_blocks(torch.nn.functional.silu(gate) * up, one)
        y = (dequantize(h_values, h_scales) @ w2[local].T) * scale_c2[local]
        result.index_add_(0, rows, y * weights[rows, slots].float().unsqueeze(-1))
    out = result.to(torch.bfloat16)
    if output is not None:
        output.copy_(out)
        out = output
    return [out]


def trtllm_fp4_block_scale_routed_moe(
    topk_ids: Union[torch.Tensor, tuple[torch.Tensor, torch.Tensor]],
    routing_bias: Optional[torch.Tensor],
    hidden_states: torch.Tensor,
    hidden_states_scale: Optional[torch.Tensor],
    gemm1_weights: torch.Tensor,
    gemm1_weights_scale: torch.Tensor,
    gemm1_bias: Optional[torch.Tensor],
    gemm1_alpha: Optional[torch.Tensor],
    gemm1_beta: Optional[torch.Tensor],
    gemm1_clamp_limit: Optional[torch.Tensor],
    gemm2_weights: torch.Tensor,
    gemm2_weights_scale: torch.Tensor,
    gemm2_bias: Optional[torch.Tensor],
    output1_scale_scalar: Optional[torch.Tensor],
    output1_scale_gate_scalar: Optional[torch.Tensor],
    output2_scale_scalar: Optional[torch.Tensor],
    num_experts: int,
    top_k: int,
    n_group: Optional[int],
    topk_group: Optional[int],
    intermediate_size: int,
    local_expert_offset: int,
    local_num_experts: int,
    routed_scaling_factor: Optional[float],
    routing_method_type: int = 0,
    do_finalize: bool = True,
    enable_pdl: Optional[bool] = None,
    activation_type: int = 3,
    per_token_scale: Optional[torch.Tensor] = None,
    output: Optional[torch.Tensor] = None,
    tune_max_num_tokens: int = 8192,
    gemm1_lora_delta: Optional[torch.Tensor] = None,
    valid_hidden_size: Optional[int] = None,
    valid_intermediate_size: Optional[int] = None,
    num_fused_shared_experts: Optional[int] = None,
    hidden_states_scale_layout: Optional[SfLayout] = None,
    workspace_buffer: Optional[torch.Tensor] = None,
    nvfp4_4over6: object = UNSET,
    routing_metadata: object = None,
) -> list[torch.Tensor]:
    """Model of ``trtllm_fp4_block_scale_routed_moe`` with unpacked ``(ids, weights)`` routing, NVFP4 x NVFP4, SwiGLU."""
    if not isinstance(topk_ids, tuple):
        raise NotImplementedError("the model covers the unpacked (ids, weights) routing only")
    ids, weights = topk_ids
    _require(ids.dtype == torch.int32, "topk_ids must be int32 for unpacked precomputed routing.")
    _require(weights.dtype in (torch.bfloat16, torch.float32), "topk_weights must be bfloat16 or float32 for unpacked precomputed routing.")
    _require(ids.dim() == 2 and ids.shape[1] == top_k and weights.shape == ids.shape, "topk_ids must have num_tokens * top_k elements")
    _require(bool(((ids >= 0) & (ids < num_experts)).all()), "topk_ids must be expert ids below num_experts")
    _unsupported(
        routing_bias=routing_bias, gemm1_bias=gemm1_bias, gemm1_alpha=gemm1_alpha, gemm1_beta=gemm1_beta,
        gemm1_clamp_limit=gemm1_clamp_limit, gemm2_bias=gemm2_bias, n_group=n_group, topk_group=topk_group,
        per_token_scale=per_token_scale, gemm1_lora_delta=gemm1_lora_delta,
        valid_hidden_size=valid_hidden_size, valid_intermediate_size=valid_intermediate_size,
        num_fused_shared_experts=num_fused_shared_experts, workspace_buffer=workspace_buffer, routing_metadata=routing_metadata,
    )
    covered = (RoutingMethodType.Default.value, RoutingMethodType.Renormalize.value)
    if routed_scaling_factor not in (None, 1.0) and routing_method_type not in covered:
        raise NotImplementedError("the model covers routed_scaling_factor where the kernel ignores it (Default, Renormalize)")
    if not do_finalize or activation_type != ActivationType.Swiglu.value:
        raise NotImplementedError("the model covers do_finalize=True with SwiGLU only")
    _check_layout(hidden_states_scale_layout)
    _require(hidden_states_scale is not None, "hidden_states_scale is required for E2m1 activation")
    assert hidden_states_scale is not None
    return _fp4_moe(
        ids, weights, hidden_states, hidden_states_scale, gemm1_weights, gemm1_weights_scale, gemm2_weights,
        gemm2_weights_scale, (output1_scale_scalar, output1_scale_gate_scalar, output2_scale_scalar),
        num_experts, intermediate_size, local_expert_offset, local_num_experts, output,
    )


def _route(logits: torch.Tensor, top_k: int, routing_method_type: int) -> tuple[torch.Tensor, torch.Tensor]:
    if routing_method_type == RoutingMethodType.Default.value:
        weights, ids = torch.topk(torch.softmax(logits.float(), dim=-1), top_k, dim=-1)
    elif routing_method_type == RoutingMethodType.Renormalize.value:
        picked, ids = torch.topk(logits.float(), top_k, dim=-1)
        weights = torch.softmax(picked, dim=-1)
    else:
        raise NotImplementedError(f"the model covers Default and Renormalize routing, not {routing_method_type}")
    return ids.to(torch.int32), weights.to(torch.bfloat16)


def trtllm_fp4_block_scale_moe(
    routing_logits: torch.Tensor,
    routing_bias: Optional[torch.Tensor],
    hidden_states: torch.Tensor,
    hidden_states_scale: Optional[torch.Tensor],
    gemm1_weights: torch.Tensor,
    gemm1_weights_scale: torch.Tensor,
    gemm1_bias: Optional[torch.Tensor],
    gemm1_alpha: Optional[torch.Tensor],
    gemm1_beta: Optional[torch.Tensor],
    gemm1_clamp_limit: Optional[torch.Tensor],
    gemm2_weights: torch.Tensor,
    gemm2_weights_scale: torch.Tensor,
    gemm2_bias: Optional[torch.Tensor],
    output1_scale_scalar: Optional[torch.Tensor],
    output1_scale_gate_scalar: Optional[torch.Tensor],
    output2_scale_scalar: Optional[torch.Tensor],
    num_experts: int,
    top_k: int,
    n_group: Optional[int],
    topk_group: Optional[int],
    intermediate_size: int,
    local_expert_offset: int,
    local_num_experts: int,
    routed_scaling_factor: Optional[float],
    routing_method_type: int = 0,
    do_finalize: bool = True,
    enable_pdl: Optional[bool] = None,
    activation_type: int = 3,
    per_token_scale: Optional[torch.Tensor] = None,
    output: Optional[torch.Tensor] = None,
    tune_max_num_tokens: int = 8192,
    norm_topk_prob: bool = True,
    routing_replay_out: Optional[torch.Tensor] = None,
    num_fused_shared_experts: Optional[int] = None,
    valid_hidden_size: Optional[int] = None,
    valid_intermediate_size: Optional[int] = None,
    hidden_states_scale_layout: Optional[SfLayout] = None,
    workspace_buffer: Optional[torch.Tensor] = None,
    nvfp4_4over6: object = UNSET,
) -> list[torch.Tensor]:
    """Model of ``trtllm_fp4_block_scale_moe``: routes ``routing_logits`` (Default or Renormalize), then as the routed model."""
    _require(routing_logits.dtype in (torch.float32, torch.bfloat16), f"routing_logits must be float32 or bfloat16, got {routing_logits.dtype}")
    _require(
        routing_logits.dim() == 2 and routing_logits.shape[1] == num_experts,
        f"routing_logits must be [T, {num_experts}], got {tuple(routing_logits.shape)}",
    )
    _unsupported(routing_replay_out=routing_replay_out)
    ids, weights = _route(routing_logits, top_k, routing_method_type)
    return trtllm_fp4_block_scale_routed_moe(
        (ids, weights), routing_bias, hidden_states, hidden_states_scale, gemm1_weights, gemm1_weights_scale,
        gemm1_bias, gemm1_alpha, gemm1_beta, gemm1_clamp_limit, gemm2_weights, gemm2_weights_scale, gemm2_bias,
        output1_scale_scalar, output1_scale_gate_scalar, output2_scale_scalar, num_experts, top_k, n_group,
        topk_group, intermediate_size, local_expert_offset, local_num_experts, routed_scaling_factor,
        routing_method_type, do_finalize, enable_pdl, activation_type, per_token_scale, output, tune_max_num_tokens,
        valid_hidden_size=valid_hidden_size, valid_intermediate_size=valid_intermediate_size,
        num_fused_shared_experts=num_fused_shared_experts, hidden_states_scale_layout=hidden_states_scale_layout,
        workspace_buffer=workspace_buffer, nvfp4_4over6=nvfp4_4over6,
    )
