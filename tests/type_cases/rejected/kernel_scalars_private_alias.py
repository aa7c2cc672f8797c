"""FlashInfer's per-expert kernel scalars built through attrs' private alias (``_value=``), which once passed mypy and every run-time check."""

import torch

from moe_core.backends.flashinfer_cutlass.quant_info import CutlassActivationScales, CutlassAlphas, CutlassFp8Dequant
from moe_core.backends.flashinfer_trtllm_fp4.quant_info import Fc1GateScalars, Fc1UpScalars, Fc2OutputScalars


def build(t: torch.Tensor) -> None:
    Fc1GateScalars(_value=t)  # expect: [call-arg] Unexpected keyword argument "_value" for "Fc1GateScalars"
    Fc1UpScalars(_value=t)  # expect: [call-arg] Unexpected keyword argument "_value" for "Fc1UpScalars"
    Fc2OutputScalars(_value=t)  # expect: [call-arg] Unexpected keyword argument "_value" for "Fc2OutputScalars"
    CutlassAlphas(_value=t)  # expect: [call-arg] Unexpected keyword argument "_value" for "CutlassAlphas"
    CutlassActivationScales(_value=t)  # expect: [call-arg] Unexpected keyword argument "_value" for "CutlassActivationScales"
    CutlassFp8Dequant(_value=t)  # expect: [call-arg] Unexpected keyword argument "_value" for "CutlassFp8Dequant"
