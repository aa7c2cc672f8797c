"""Raw tensors for the TRT-LLM kernel's output scalars: a swapped or mis-built scalar would run and give another layer."""

import torch

from moe_core.backends.flashinfer_trtllm_fp4.quant_info import Fc1UpScalars, TrtllmFp4Weights


def with_scalars(weights: TrtllmFp4Weights, gate: torch.Tensor) -> TrtllmFp4Weights:
    return TrtllmFp4Weights(
        gemm1_weights=weights.gemm1_weights,
        gemm1_scales=weights.gemm1_scales,
        gemm2_weights=weights.gemm2_weights,
        gemm2_scales=weights.gemm2_scales,
        output1_scale_gate_scalar=gate,  # expect: [arg-type] Argument "output1_scale_gate_scalar" to "TrtllmFp4Weights" has incompatible type "Tensor"; expected "Fc1GateScalars"
        output1_scale_scalar=weights.output1_scale_scalar,
        output2_scale_scalar=weights.output2_scale_scalar,
        hidden_states_scale=weights.hidden_states_scale,
    )


def up_from_tensor(values: torch.Tensor) -> Fc1UpScalars:
    return Fc1UpScalars(values)  # expect: [call-arg] Too many arguments for "Fc1UpScalars"
