"""The TRT-LLM FP4 quant info built with per-expert ``[E]`` input scales where the kernel quantizes with one ``[1]`` scalar."""

from moe_core import ExpertQuantizeGlobalScales
from moe_core.backends.flashinfer_trtllm_fp4.quant_info import Fc1GateScalars


def gate_scalars(gate: ExpertQuantizeGlobalScales, per_expert_inputs: ExpertQuantizeGlobalScales) -> Fc1GateScalars:
    return Fc1GateScalars.from_global_scales(gate=gate, hidden_states=per_expert_inputs)  # expect: [arg-type] Argument "hidden_states" to "from_global_scales" of "Fc1GateScalars" has incompatible type "ExpertQuantizeGlobalScales"; expected "QuantizeGlobalScale"

