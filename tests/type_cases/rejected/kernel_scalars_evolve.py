"""FlashInfer's per-expert kernel scalars given another raw tensor by ``attrs.evolve``, by the field's name or its private alias."""

import attrs
import torch

from moe_core.backends.flashinfer_cutlass.quant_info import CutlassActivationScales, CutlassAlphas, CutlassFp8Dequant
from moe_core.backends.flashinfer_trtllm_fp4.quant_info import Fc1GateScalars, Fc1UpScalars, Fc2OutputScalars


def rebuild(
    t: torch.Tensor,
    fc1_gate_scalars: Fc1GateScalars,
    fc1_up_scalars: Fc1UpScalars,
    fc2_output_scalars: Fc2OutputScalars,
    cutlass_alphas: CutlassAlphas,
    cutlass_activation_scales: CutlassActivationScales,
    cutlass_fp8_dequant: CutlassFp8Dequant,
) -> None:
    attrs.evolve(fc1_gate_scalars, value=t)  # expect: [call-arg] Unexpected keyword argument "value" for "evolve" of "Fc1GateScalars"
    attrs.evolve(fc1_gate_scalars, _value=t)  # expect: [call-arg] Unexpected keyword argument "_value" for "evolve" of "Fc1GateScalars"
    attrs.evolve(fc1_up_scalars, value=t)  # expect: [call-arg] Unexpected keyword argument "value" for "evolve" of "Fc1UpScalars"
    attrs.evolve(fc1_up_scalars, _value=t)  # expect: [call-arg] Unexpected keyword argument "_value" for "evolve" of "Fc1UpScalars"
    attrs.evolve(fc2_output_scalars, value=t)  # expect: [call-arg] Unexpected keyword argument "value" for "evolve" of "Fc2OutputScalars"
    attrs.evolve(fc2_output_scalars, _value=t)  # expect: [call-arg] Unexpected keyword argument "_value" for "evolve" of "Fc2OutputScalars"
    attrs.evolve(cutlass_alphas, value=t)  # expect: [call-arg] Unexpected keyword argument "value" for "evolve" of "CutlassAlphas"
    attrs.evolve(cutlass_alphas, _value=t)  # expect: [call-arg] Unexpected keyword argument "_value" for "evolve" of "CutlassAlphas"
    attrs.evolve(cutlass_activation_scales, value=t)  # expect: [call-arg] Unexpected keyword argument "value" for "evolve" of "CutlassActivationScales"
    attrs.evolve(cutlass_activation_scales, _value=t)  # expect: [call-arg] Unexpected keyword argument "_value" for "evolve" of "CutlassActivationScales"
    attrs.evolve(cutlass_fp8_dequant, value=t)  # expect: [call-arg] Unexpected keyword argument "value" for "evolve" of "CutlassFp8Dequant"
    attrs.evolve(cutlass_fp8_dequant, _value=t)  # expect: [call-arg] Unexpected keyword argument "_value" for "evolve" of "CutlassFp8Dequant"
