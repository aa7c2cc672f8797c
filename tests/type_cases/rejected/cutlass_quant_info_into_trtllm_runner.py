"""CUTLASS quant info handed to the TRT-LLM-gen runner: another kernel's layout, so another type."""

import torch

from moe_core import MoeRunnerConfig, StandardDispatchOutput, create_runner
from moe_core.backends.flashinfer_cutlass.quant_info import CutlassNvfp4Weights
from moe_core.backends.flashinfer_trtllm_fp4 import FLASHINFER_TRTLLM_FP4


def forward(config: MoeRunnerConfig, dispatch: StandardDispatchOutput, cutlass: CutlassNvfp4Weights) -> torch.Tensor:
    return create_runner(FLASHINFER_TRTLLM_FP4, config).run(dispatch, cutlass)  # expect: [arg-type] Argument 2 to "run" of "Runner" has incompatible type "CutlassNvfp4Weights"; expected "TrtllmFp4Weights"
