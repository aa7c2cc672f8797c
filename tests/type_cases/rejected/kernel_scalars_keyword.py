"""FlashInfer's per-expert kernel scalars built from a raw tensor by the field's name: the field is not an ``__init__`` argument."""

import torch

from moe_core.backends.flashinfer_cutlass.quant_info import CutlassActivationScales, CutlassAlphas, CutlassFp8Dequant
from moe_core.backends.flashinfer_trtllm_fp4.quant_info import Fc1GateScalars, Fc1UpScalars, Fc2OutputScalars


def build(t: torch.Tensor) -> None:
    Fc1GateScalars(value=t)  # expect: [call-arg] Unexpected keyword argument "value" for "Fc1GateScalars"
    Fc1UpScalars(value=t)  # expect: [call-arg] Unexpected keyword argument "value" for "Fc1UpScalars"
    Fc2OutputScalars(value=t)  # expect: [call-arg] Unexpected keyword argument "value" for "Fc2OutputScalars"
    CutlassAlphas(value=t)  # expect: [call-arg] Unexpected keyword argument "value" for "CutlassAlphas"
    CutlassActivationScales(value=t)  # expect: [call-arg] Unexpected keyword argument "value" for "CutlassActivationScales"
    CutlassFp8Dequant(value=t)  # expect: [call-arg] Unexpected keyword argument "value" for "CutlassFp8Dequant"
