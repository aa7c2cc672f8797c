"""FlashInfer's per-expert kernel scalars built positionally from a raw tensor: no positional spelling reaches a scale's tensor."""

import torch

from moe_core.backends.flashinfer_cutlass.quant_info import CutlassActivationScales, CutlassAlphas, CutlassFp8Dequant
from moe_core.backends.flashinfer_trtllm_fp4.quant_info import Fc1GateScalars, Fc1UpScalars, Fc2OutputScalars


def build(t: torch.Tensor) -> None:
    Fc1GateScalars(t)  # expect: [call-arg] Too many arguments for "Fc1GateScalars"
    Fc1UpScalars(t)  # expect: [call-arg] Too many arguments for "Fc1UpScalars"
    Fc2OutputScalars(t)  # expect: [call-arg] Too many arguments for "Fc2OutputScalars"
    CutlassAlphas(t)  # expect: [call-arg] Too many arguments for "CutlassAlphas"
    CutlassActivationScales(t)  # expect: [call-arg] Too many arguments for "CutlassActivationScales"
    CutlassFp8Dequant(t)  # expect: [call-arg] Too many arguments for "CutlassFp8Dequant"
