"""A dequantize-side scale (ModelOpt's ``input_scale`` convention) where the runner quantizes with a quantize-side one."""

from moe_core import DequantizeGlobalScale
from moe_core.backends.flashinfer_trtllm_fp4.quant_info import TrtllmFp4Weights


def with_input_scale(weights: TrtllmFp4Weights, input_scale: DequantizeGlobalScale) -> TrtllmFp4Weights:
    return TrtllmFp4Weights(
        gemm1_weights=weights.gemm1_weights,
        gemm1_scales=weights.gemm1_scales,
        gemm2_weights=weights.gemm2_weights,
        gemm2_scales=weights.gemm2_scales,
        output1_scale_gate_scalar=weights.output1_scale_gate_scalar,
        output1_scale_scalar=weights.output1_scale_scalar,
        output2_scale_scalar=weights.output2_scale_scalar,
        hidden_states_scale=input_scale,  # expect: [arg-type] Argument "hidden_states_scale" to "TrtllmFp4Weights" has incompatible type "DequantizeGlobalScale"; expected "QuantizeGlobalScale"
    )

