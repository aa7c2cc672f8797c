"""moe-core: typed backend abstraction for Mixture-of-Experts kernels.

A scheme loads its layer into canonical weights (a :class:`WeightFormat`),
picks a backend by its typed key or among the routes of its format, and runs
``route.bind(config, weights)(dispatch)``, or
``create_runner(key, config).run(dispatch, quant_info)``; mypy checks that
the quant info is the one that backend takes.
"""

from moe_core.block_scales import LinearBlockScales, SwizzledBlockScales
from moe_core.config import Activation, MoeRunnerConfig, RoutingMethod
from moe_core.conversion import AnyConversion, Conversion, FormatInfo, WeightFormat
from moe_core.dispatch import DispatchFormat, DispatchOutput, StandardDispatchOutput, TopKOutput
from moe_core.formats import DENSE, FP8, FP8_BLOCK_SCALED, FP8_CHANNEL, NVFP4, NVFP4_W4A16
from moe_core.fp8 import (
    ExpertFp8Scales,
    Fp8BlockExpertWeights,
    Fp8BlockScales,
    Fp8ChannelExpertWeights,
    Fp8ChannelScales,
    Fp8ExpertWeights,
    Fp8GateUpWeights,
    Fp8TensorScale,
)
from moe_core.global_scales import (
    DequantizeGlobalScale,
    ExpertDequantizeGlobalScales,
    ExpertQuantizeGlobalScales,
    ExpertScalePolicy,
    QuantizeGlobalScale,
)
from moe_core.moe_weights import DenseMoeWeights, Fp8BlockMoeWeights, Fp8ChannelMoeWeights, Fp8MoeWeights, Nvfp4MoeWeights
from moe_core.nvfp4 import GateUpScalePolicy, Nvfp4Arithmetic, Nvfp4ExpertWeights, Nvfp4GateUpWeights, Nvfp4Tensor
from moe_core.registry import (
    Availability,
    BackendChoice,
    BackendEntry,
    BackendKey,
    BackendSelectionError,
    BoundRunner,
    FormatRoute,
    MoeForward,
    Route,
    Selection,
    create_runner,
    load_entry_point_backends,
    register_backend,
    registered_backends,
    select_backend,
)
from moe_core.routing import select_experts
from moe_core.runner import QuantInfo, Runner, check_run_inputs, check_run_values

__all__ = [
    "DENSE",
    "FP8",
    "FP8_BLOCK_SCALED",
    "FP8_CHANNEL",
    "NVFP4",
    "NVFP4_W4A16",
    "Activation",
    "AnyConversion",
    "Availability",
    "BackendChoice",
    "BackendEntry",
    "BackendKey",
    "BackendSelectionError",
    "BoundRunner",
    "Conversion",
    "DenseMoeWeights",
    "DequantizeGlobalScale",
    "DispatchFormat",
    "DispatchOutput",
    "ExpertDequantizeGlobalScales",
    "ExpertFp8Scales",
    "ExpertQuantizeGlobalScales",
    "ExpertScalePolicy",
    "FormatInfo",
    "Fp8BlockExpertWeights",
    "Fp8BlockMoeWeights",
    "Fp8BlockScales",
    "Fp8ChannelExpertWeights",
    "Fp8ChannelMoeWeights",
    "Fp8ChannelScales",
    "Fp8ExpertWeights",
    "Fp8GateUpWeights",
    "Fp8MoeWeights",
    "Fp8TensorScale",
    "FormatRoute",
    "GateUpScalePolicy",
    "LinearBlockScales",
    "MoeForward",
    "MoeRunnerConfig",
    "Nvfp4Arithmetic",
    "Nvfp4ExpertWeights",
    "Nvfp4GateUpWeights",
    "Nvfp4MoeWeights",
    "Nvfp4Tensor",
    "QuantInfo",
    "QuantizeGlobalScale",
    "Route",
    "RoutingMethod",
    "Runner",
    "Selection",
    "StandardDispatchOutput",
    "SwizzledBlockScales",
    "TopKOutput",
    "WeightFormat",
    "check_run_inputs",
    "check_run_values",
    "create_runner",
    "load_entry_point_backends",
    "register_backend",
    "registered_backends",
    "select_backend",
    "select_experts",
]
