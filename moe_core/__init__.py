"""moe-core: typed backend abstraction for Mixture-of-Experts kernels.

A scheme builds its quant info once after loading, picks a backend by its
typed key, and runs ``create_runner(key, config).run(dispatch, quant_info)``;
mypy checks that the quant info is the one that backend takes.
"""

from moe_core.block_scales import LinearBlockScales, SwizzledBlockScales
from moe_core.config import Activation, MoeRunnerConfig, RoutingMethod
from moe_core.dispatch import DispatchFormat, DispatchOutput, StandardDispatchOutput, TopKOutput
from moe_core.global_scales import (
    DequantizeGlobalScale,
    ExpertDequantizeGlobalScales,
    ExpertQuantizeGlobalScales,
    ExpertScalePolicy,
    QuantizeGlobalScale,
)
from moe_core.moe_weights import DenseMoeWeights, Nvfp4MoeWeights
from moe_core.nvfp4 import Nvfp4ExpertWeights, Nvfp4Tensor
from moe_core.registry import (
    Availability,
    BackendEntry,
    BackendKey,
    BoundRunner,
    MoeForward,
    create_runner,
    load_entry_point_backends,
    register_backend,
    registered_backends,
)
from moe_core.routing import select_experts
from moe_core.runner import QuantInfo, Runner, check_expert_ids, check_run_inputs

__all__ = [
    "Activation",
    "Availability",
    "BackendEntry",
    "BackendKey",
    "BoundRunner",
    "DenseMoeWeights",
    "DequantizeGlobalScale",
    "DispatchFormat",
    "DispatchOutput",
    "ExpertDequantizeGlobalScales",
    "ExpertQuantizeGlobalScales",
    "ExpertScalePolicy",
    "LinearBlockScales",
    "MoeForward",
    "MoeRunnerConfig",
    "Nvfp4ExpertWeights",
    "Nvfp4MoeWeights",
    "Nvfp4Tensor",
    "QuantInfo",
    "QuantizeGlobalScale",
    "Runner",
    "RoutingMethod",
    "StandardDispatchOutput",
    "SwizzledBlockScales",
    "TopKOutput",
    "check_expert_ids",
    "check_run_inputs",
    "create_runner",
    "load_entry_point_backends",
    "register_backend",
    "registered_backends",
    "select_experts",
]
