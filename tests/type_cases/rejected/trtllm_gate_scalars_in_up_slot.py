"""The gate's output scalars in the up slot: both are per-expert float32 ``[E]``, told apart only by their types."""

from moe_core.backends.flashinfer_trtllm_fp4.quant_info import TrtllmFp4Weights


def swapped(weights: TrtllmFp4Weights) -> TrtllmFp4Weights:
    return TrtllmFp4Weights(
        gemm1_weights=weights.gemm1_weights,
        gemm1_scales=weights.gemm1_scales,
        gemm2_weights=weights.gemm2_weights,
        gemm2_scales=weights.gemm2_scales,
        output1_scale_gate_scalar=weights.output1_scale_gate_scalar,
        output1_scale_scalar=weights.output1_scale_gate_scalar,  # expect: [arg-type] Argument "output1_scale_scalar" to "TrtllmFp4Weights" has incompatible type "Fc1GateScalars"; expected "Fc1UpScalars"
        output2_scale_scalar=weights.output2_scale_scalar,
        hidden_states_scale=weights.hidden_states_scale,
    )
