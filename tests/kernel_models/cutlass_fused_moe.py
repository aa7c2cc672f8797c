"""Pure-PyTorch model of ``flashinfer.fused_moe.cutlass_fused_moe`` for bf16/fp16, FP8 per-tensor and NVFP4 W4A4 experts.

It has the installed function's exact signature (tests/test_kernel_models.py
checks it against flashinfer 0.7.4), refuses what the binding refuses, raises
``NotImplementedError`` for what it does not model, and computes what the
kernel computes. Rules, each from FlashInfer's source:

- Formats (``fused_moe/core.py`` ``cutlass_fused_moe``: NVFP4 is "int64
  fc1_expert_weights and a non-FP8 input"; ``csrc/fused_moe/cutlass_backend/
  flashinfer_cutlass_fused_moe_binding.cu`` ``getQuantParams``): bf16/fp16
  weights of the input's dtype take no ``quant_scales``; NVFP4 takes six:
  ``fc1_act_global`` float32 0-d or ``[local_experts]``, ``fc1_weight_block``
  int32 ``[E, 2I, H / 16 / 4]``, ``fc1_global`` float32 ``[E]``, then the same
  three for FC2 (``[E, H, I / 16 / 4]``). A bf16 input is quantized by the
  kernel with ``fc1_act_global`` (the docstring: "For NVFP4, both quantized and
  non-quantized inputs are supported"). FP8 (E4M3 weights; "For FP8, the input
  must be quantized") takes four: ``fc1_dequant`` float32 ``[E]``, ``fc2_quant``
  0-d or ``[E]``, ``fc2_dequant`` ``[E]``, ``fc1_input_dequant`` 0-d.
- Layout: FC1 rows ``[up; gate]`` (``tests/moe/test_trtllm_cutlass_fused_moe.py``
  ``compute_with_experts``: ``w3_expert, w1_expert = torch.chunk(w31_weight, 2)``),
  weight block scales 128x4-swizzled (the same test's ``convert_swizzled_to_linear``).
- Expert parallelism: the weights hold ``E_local`` experts, rank ``ep_rank`` of
  ``ep_size`` owns global ids ``[ep_rank * E_local, (ep_rank + 1) * E_local)``.
- Numerics: ``silu(gate) * up`` per expert; the output is the routing-weighted
  sum. NVFP4 multiplies each GEMM's accumulator by its alpha and quantizes the
  activation with ``fc2_act_global``; FP8 multiplies FC1's accumulator by
  ``fc1_dequant``, quantizes the activation as ``e4m3(h * fc2_quant)`` and
  multiplies FC2's by ``fc2_dequant``.
- Rounding points (``csrc/fused_moe/cutlass_backend/cutlass_fused_moe_kernels.cuh``):
  GEMM1 writes its (alpha- or dequant-scaled) output in ``UnfusedGemmOutputType``,
  the backbone 16-bit type (``moe_kernels.h``: ``= BackBoneType``, the input's
  dtype for bf16/fp16 experts, ``output_dtype`` for quantized ones), and
  ``doActivationKernel`` reads it back into float; the activation is computed in
  float and written in the backbone type (bf16/fp16 experts: ``arrayConvert``
  into the intermediate buffer) or, for NVFP4, converted to it before the FP4
  quantizer (``quantizePackedFPXValue``: ``static_cast<GemmOutputType>`` into
  the ``PackedVec`` that ``cvt_warp_fp16_to_fp4`` reads); FP8 quantizes the
  float activation directly. Not modelled: GEMM2's own 16-bit output before the
  finalize (unfused path only), and the approximate reciprocals of the FP4 quantizer.
"""

from __future__ import annotations

from typing import Optional

import torch
from flashinfer.tllm_enums import ActivationType

from tests.kernel_models.nvfp4_layouts import decode_packed, dequantize, quantize_blocks, unswizzle

UNSET = object()
"""Stands for FlashInfer's own "read the environment" sentinel default."""


def _require(condition: bool, message: str) -> None:
    if not condition:
        raise ValueError(message)


def _check(name: str, tensor: torch.Tensor, dtype: torch.dtype, shape: tuple[int, ...]) -> None:
    _require(tensor.dtype == dtype, f"{name} must be {dtype}, got {tensor.dtype}")
    _require(tuple(tensor.shape) == shape, f"{name} must have shape {shape}, got {tuple(tensor.shape)}")


def _per_expert(name: str, scale: torch.Tensor, experts: int) -> torch.Tensor:
    """A 0-d or ``[experts]`` float32 input scale, as ``[experts]``."""
    _require(scale.dtype == torch.float32, f"{name} must be float32, got {scale.dtype}")
    _require(scale.dim() <= 1, f"{name} must be a scalar or 1-D tensor")
    _require(
        scale.dim() == 0 or scale.shape[0] == experts,
        f"{name} must be scalar or (num_experts_on_rank,) = ({experts},), got {tuple(scale.shape)}",
    )
    return scale.float().expand(experts) if scale.dim() == 0 else scale.float()


def _nvfp4_weights(name: str, weights: torch.Tensor, blocks: torch.Tensor, shape: tuple[int, int, int]) -> torch.Tensor:
    experts, rows, cols = shape
    _check(name, weights, torch.int64, (experts, rows, cols // 16))
    _check(f"{name} block scales", blocks, torch.int32, (experts, rows, cols // 16 // 4))
    scales = unswizzle(blocks.contiguous().view(torch.uint8), rows, cols // 16)
    return dequantize(decode_packed(weights.contiguous().view(torch.uint8)), scales)


def cutlass_fused_moe(
    input: torch.Tensor,
    token_selected_experts: torch.Tensor,
    token_final_scales: torch.Tensor,
    fc1_expert_weights: torch.Tensor,
    fc2_expert_weights: torch.Tensor,
    output_dtype: torch.dtype,
    quant_scales: list[torch.Tensor],
    fc1_expert_biases: Optional[torch.Tensor] = None,
    fc2_expert_biases: Optional[torch.Tensor] = None,
    input_sf: Optional[torch.Tensor] = None,
    swiglu_alpha: Optional[torch.Tensor] = None,
    swiglu_beta: Optional[torch.Tensor] = None,
    swiglu_limit: Optional[torch.Tensor] = None,
    tp_size: int = 1,
    tp_rank: int = 0,
    ep_size: int = 1,
    ep_rank: int = 0,
    cluster_size: int = 1,
    cluster_rank: int = 0,
    output: Optional[torch.Tensor] = None,
    enable_alltoall: bool = False,
    use_deepseek_fp8_block_scale: bool = False,
    use_w4_group_scaling: bool = False,
    use_mxfp8_act_scaling: bool = False,
    min_latency_mode: bool = False,
    use_packed_weights: bool = False,
    use_wfp4afp8_humming: bool = False,
    tune_max_num_tokens: int = 8192,
    enable_pdl: Optional[bool] = None,
    activation_type: ActivationType = ActivationType.Swiglu,
    swizzled_input_sf: bool = True,
    use_fused_finalize: Optional[bool] = None,
    profile_ids: Optional[list[int]] = None,
    workspace_buffer: Optional[torch.Tensor] = None,
    *,
    clamped_relu2_limit: Optional[torch.Tensor] = None,
    situ_beta: Optional[torch.Tensor] = None,
    situ_linear_beta: Optional[torch.Tensor] = None,
    backend: str = "cutlass",
    nvfp4_4over6: object = UNSET,
) -> torch.Tensor:
    """The model: bf16/fp16 or NVFP4 (bf16/fp16 input) experts, SwiGLU, no TP, biases or extras."""
    extras = (fc1_expert_biases, fc2_expert_biases, input_sf, swiglu_alpha, swiglu_beta, swiglu_limit, clamped_relu2_limit, situ_beta, situ_linear_beta)
    if any(extra is not None for extra in extras) or tp_size != 1 or cluster_size != 1 or enable_alltoall or min_latency_mode:
        raise NotImplementedError("the model covers plain SwiGLU experts without biases, TP, clusters or all-to-all")
    if use_deepseek_fp8_block_scale or use_w4_group_scaling or use_mxfp8_act_scaling or use_packed_weights or use_wfp4afp8_humming:
        raise NotImplementedError("the model covers bf16/fp16, FP8 per-tensor and NVFP4 only")
    if activation_type != ActivationType.Swiglu:
        raise NotImplementedError(f"the model covers SwiGLU only, not {activation_type}")
    fp8 = fc1_expert_weights.dtype == torch.float8_e4m3fn
    allowed = (torch.float8_e4m3fn,) if fp8 else (torch.bfloat16, torch.float16)
    _require(input.dtype in allowed, f"input must be {' or '.join(map(str, allowed))} for these weights, got {input.dtype}")
    tokens, hidden = input.shape
    ids, weights = token_selected_experts, token_final_scales
    _require(ids.dtype == torch.int32 and ids.dim() == 2 and ids.shape[0] == tokens, "token_selected_experts must be int32 [T, top_k]")
    _check("token_final_scales", weights, torch.float32, tuple(ids.shape))
    experts = int(fc1_expert_weights.shape[0])
    _require(0 <= ep_rank < ep_size, f"ep_rank {ep_rank} must be below ep_size {ep_size}")
    nvfp4 = fc1_expert_weights.dtype == torch.int64
    if nvfp4:
        _require(quant_scales is not None and len(quant_scales) == 6, "Expecting 6 quant scales for nvfp4 quantization")
        fc1_act, fc1_blocks, fc1_alpha, fc2_act, fc2_blocks, fc2_alpha = quant_scales
        inter = int(fc1_expert_weights.shape[1]) // 2
        w1 = _nvfp4_weights("fc1_expert_weights", fc1_expert_weights, fc1_blocks, (experts, 2 * inter, hidden))
        w2 = _nvfp4_weights("fc2_expert_weights", fc2_expert_weights, fc2_blocks, (experts, hidden, inter))
        a1, a2 = _per_expert("fc1 act global", fc1_act, experts), _per_expert("fc2 act global", fc2_act, experts)
        _check("fc1 global", fc1_alpha, torch.float32, (experts,))
        _check("fc2 global", fc2_alpha, torch.float32, (experts,))
    elif fp8:
        _require(quant_scales is not None and len(quant_scales) == 4, "Expecting 4 quant scales for fp8 quantization")
        fc1_dequant, fc2_quant, fc2_dequant, fc1_input_dequant = quant_scales
        inter = int(fc1_expert_weights.shape[1]) // 2
        _check("fc1_expert_weights", fc1_expert_weights, torch.float8_e4m3fn, (experts, 2 * inter, hidden))
        _check("fc2_expert_weights", fc2_expert_weights, torch.float8_e4m3fn, (experts, hidden, inter))
        _check("fc1_dequant", fc1_dequant, torch.float32, (experts,))
        _check("fc2_dequant", fc2_dequant, torch.float32, (experts,))
        _check("fc1_input_dequant", fc1_input_dequant, torch.float32, ())
        fc2_quant_per_expert = _per_expert("fc2 quant", fc2_quant, experts)
    else:
        _require(quant_scales is None or len(quant_scales) == 0, "unquantized experts take no quant_scales")
        _require(fc1_expert_weights.dtype == input.dtype, f"fc1_expert_weights must be {input.dtype} like input, got {fc1_expert_weights.dtype}")
        inter = int(fc1_expert_weights.shape[1]) // 2
        _check("fc1_expert_weights", fc1_expert_weights, input.dtype, (experts, 2 * inter, hidden))
        _check("fc2_expert_weights", fc2_expert_weights, input.dtype, (experts, hidden, inter))
    if output is not None:
        _check("output", output, output_dtype, (tokens, hidden))

    backbone = output_dtype if nvfp4 or fp8 else input.dtype  # the 16-bit type GEMM1's output and the activation are written in
    result = torch.zeros((tokens, hidden), dtype=torch.float32, device=input.device)
    for local in range(experts):
        rows, slots = torch.nonzero(ids == ep_rank * experts + local, as_tuple=True)
        if rows.numel() == 0:
            continue
        x = input[rows]
        if nvfp4:
            x_values, x_scales = quantize_blocks(x, a1[local])
            acc1 = ((dequantize(x_values, x_scales) @ w1[local].T) * fc1_alpha[local]).to(backbone).float()
            h = (torch.nn.functional.silu(acc1[:, inter:]) * acc1[:, :inter]).to(backbone)
            h_values, h_scales = quantize_blocks(h, a2[local])
            y = (dequantize(h_values, h_scales) @ w2[local].T) * fc2_alpha[local]
        elif fp8:
            acc1 = ((x.float() @ fc1_expert_weights[local].float().T) * fc1_dequant[local]).to(backbone).float()
            h = torch.nn.functional.silu(acc1[:, inter:]) * acc1[:, :inter]
            h_codes = (h * fc2_quant_per_expert[local]).clamp(-448.0, 448.0).to(torch.float8_e4m3fn)
            y = (h_codes.float() @ fc2_expert_weights[local].float().T) * fc2_dequant[local]
        else:
            acc1 = (x.float() @ fc1_expert_weights[local].float().T).to(backbone).float()
            h = (torch.nn.functional.silu(acc1[:, inter:]) * acc1[:, :inter]).to(backbone)
            y = h.float() @ fc2_expert_weights[local].float().T
        result.index_add_(0, rows, y * weights[rows, slots].unsqueeze(-1))
    out = result.to(output_dtype)
    if output is None:
        return out
    output.copy_(out)
    return output
