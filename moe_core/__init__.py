"""moe-core: typed backend abstraction for Mixture-of-Experts kernels.

A scheme loads its layer into canonical weights (a :class:`WeightFormat`),
picks a backend by its typed key or among the routes of its format, and runs
``route.bind(config, weights)(dispatch)``, or
``create_runner(key, config).run(dispatch, quant_info)``; mypy checks that
the quant info is the one that backend takes.
"""

from moe_core.block_scales import LinearBlockScales, SwizzledBlockScales
from moe_core.config import Activation, MoeRunnerConfig, RoutingMethod
from moe_core.conversion import AnyConversion, Conversion, Degradation, FormatInfo, WeightFormat
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
from moe_core.moe_weights import (
    DenseMoeWeights,
    Fp8BlockMoeWeights,
    Fp8ChannelMoeWeights,
    Fp8MoeWeights,
    Nvfp4MoeWeights,
    Nvfp4W4A16MoeWeights,
)
from moe_core.nvfp4 import GateUpScalePolicy, Nvfp4Arithmetic, Nvfp4ExpertWeights, Nvfp4GateUpWeights, Nvfp4Tensor
from moe_core.capability import DeviceSpec, LayerSpec, Priority, Support, Tier
from moe_core.registry import (
    BackendChoice,
    BackendEntry,
    BackendKey,
    BackendSelectionError,
    BoundRunner,
    Considered,
    DegradedRoute,
    FormatRoute,
    MoeForward,
    Route,
    Selection,
    candidates,
    choose,
    create_runner,
    discover_backends,
    plugin_errors,
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
    "BackendChoice",
    "BackendEntry",
    "BackendKey",
    "BackendSelectionError",
    "BoundRunner",
    "Considered",
    "Conversion",
    "Degradation",
    "DegradedRoute",
    "DenseMoeWeights",
    "DequantizeGlobalScale",
    "DeviceSpec",
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
    "LayerSpec",
    "LinearBlockScales",
    "MoeForward",
    "MoeRunnerConfig",
    "Nvfp4Arithmetic",
    "Nvfp4ExpertWeights",
    "Nvfp4GateUpWeights",
    "Nvfp4MoeWeights",
    "Nvfp4W4A16MoeWeights",
    "Nvfp4Tensor",
    "Priority",
    "QuantInfo",
    "QuantizeGlobalScale",
    "Route",
    "RoutingMethod",
    "Runner",
    "Selection",
    "StandardDispatchOutput",
    "Support",
    "SwizzledBlockScales",
    "Tier",
    "TopKOutput",
    "WeightFormat",
    "check_run_inputs",
    "check_run_values",
    "candidates",
    "choose",
    "create_runner",
    "discover_backends",
    "plugin_errors",
    "register_backend",
    "registered_backends",
    "select_backend",
    "select_experts",
]
