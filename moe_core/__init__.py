"""moe-core: typed backend abstraction for Mixture-of-Experts kernels.

A scheme loads its layer into canonical weights (a :class:`WeightFormat`),
picks a backend by its typed key or among the routes of its format, and runs
``route.bind(config, weights)(dispatch)``, or
``create_runner(key, config).run(dispatch, quant_info)``; mypy checks that
the quant info is the one that backend takes.

Importing the package loads none of its modules: each public name is imported
from the module defining it on first access (PEP 562), so that ``moe-core
--help`` answers without loading torch.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    # What mypy sees; keep in step with _MODULES (tests/test_public_api.py compares them).
    from moe_core.block_scales import LinearBlockScales as LinearBlockScales
    from moe_core.block_scales import SwizzledBlockScales as SwizzledBlockScales
    from moe_core.capability import DeviceSpec as DeviceSpec
    from moe_core.capability import LayerSpec as LayerSpec
    from moe_core.capability import Priority as Priority
    from moe_core.capability import Support as Support
    from moe_core.capability import Tier as Tier
    from moe_core.config import Activation as Activation
    from moe_core.config import MoeRunnerConfig as MoeRunnerConfig
    from moe_core.config import RoutingMethod as RoutingMethod
    from moe_core.config import ClampedSwiglu as ClampedSwiglu
    from moe_core.config import ExpertActivation as ExpertActivation
    from moe_core.config import GateClamp as GateClamp
    from moe_core.config import GroupedTopK as GroupedTopK
    from moe_core.config import GroupScore as GroupScore
    from moe_core.config import LimitedSwiglu as LimitedSwiglu
    from moe_core.config import Llama4Sigmoid as Llama4Sigmoid
    from moe_core.config import RoutedWeights as RoutedWeights
    from moe_core.config import Routing as Routing
    from moe_core.config import Scoring as Scoring
    from moe_core.config import SigmoidTopK as SigmoidTopK
    from moe_core.config import SparseMixer as SparseMixer
    from moe_core.conversion import AnyConversion as AnyConversion
    from moe_core.conversion import Conversion as Conversion
    from moe_core.conversion import Degradation as Degradation
    from moe_core.conversion import FormatInfo as FormatInfo
    from moe_core.conversion import WeightFormat as WeightFormat
    from moe_core.dispatch import DispatchFormat as DispatchFormat
    from moe_core.dispatch import DispatchOutput as DispatchOutput
    from moe_core.dispatch import StandardDispatchOutput as StandardDispatchOutput
    from moe_core.dispatch import TopKOutput as TopKOutput
    from moe_core.formats import DENSE as DENSE
    from moe_core.formats import DenseMoeWeights as DenseMoeWeights
    from moe_core.formats import FP8 as FP8
    from moe_core.formats import FP8_BLOCK_SCALED as FP8_BLOCK_SCALED
    from moe_core.formats import FP8_CHANNEL as FP8_CHANNEL
    from moe_core.formats import Fp8BlockMoeWeights as Fp8BlockMoeWeights
    from moe_core.formats import Fp8ChannelMoeWeights as Fp8ChannelMoeWeights
    from moe_core.formats import Fp8MoeWeights as Fp8MoeWeights
    from moe_core.formats import MXFP4 as MXFP4
    from moe_core.formats import Mxfp4MoeWeights as Mxfp4MoeWeights
    from moe_core.formats import NVFP4 as NVFP4
    from moe_core.formats import NVFP4_PER_EXPERT as NVFP4_PER_EXPERT
    from moe_core.formats import NVFP4_W4A16 as NVFP4_W4A16
    from moe_core.formats import Nvfp4PerExpertMoeWeights as Nvfp4PerExpertMoeWeights
    from moe_core.formats import Nvfp4MoeWeights as Nvfp4MoeWeights
    from moe_core.formats import Nvfp4W4A16MoeWeights as Nvfp4W4A16MoeWeights
    from moe_core.fp8 import ExpertFp8Scales as ExpertFp8Scales
    from moe_core.fp8 import Fp8BlockExpertWeights as Fp8BlockExpertWeights
    from moe_core.fp8 import Fp8BlockScales as Fp8BlockScales
    from moe_core.fp8 import Fp8ChannelExpertWeights as Fp8ChannelExpertWeights
    from moe_core.fp8 import Fp8ChannelScales as Fp8ChannelScales
    from moe_core.fp8 import Fp8ExpertWeights as Fp8ExpertWeights
    from moe_core.fp8 import Fp8GateUpWeights as Fp8GateUpWeights
    from moe_core.fp8 import Fp8TensorScale as Fp8TensorScale
    from moe_core.global_scales import DequantizeGlobalScale as DequantizeGlobalScale
    from moe_core.global_scales import ExpertDequantizeGlobalScales as ExpertDequantizeGlobalScales
    from moe_core.global_scales import ExpertInputScales as ExpertInputScales
    from moe_core.global_scales import ExpertQuantizeGlobalScales as ExpertQuantizeGlobalScales
    from moe_core.global_scales import ExpertScalePolicy as ExpertScalePolicy
    from moe_core.global_scales import QuantizeGlobalScale as QuantizeGlobalScale
    from moe_core.layer import MoeLayer as MoeLayer
    from moe_core.layer import SharedExpert as SharedExpert
    from moe_core.layer import dense_layer as dense_layer
    from moe_core.mxfp4 import E8M0Scales as E8M0Scales
    from moe_core.mxfp4 import Mxfp4ExpertWeights as Mxfp4ExpertWeights
    from moe_core.nvfp4 import GateUpScalePolicy as GateUpScalePolicy
    from moe_core.nvfp4 import Nvfp4Arithmetic as Nvfp4Arithmetic
    from moe_core.nvfp4 import Nvfp4ExpertWeights as Nvfp4ExpertWeights
    from moe_core.nvfp4 import Nvfp4GateUpWeights as Nvfp4GateUpWeights
    from moe_core.nvfp4 import Nvfp4Tensor as Nvfp4Tensor
    from moe_core.registry import BackendChoice as BackendChoice
    from moe_core.registry import BackendEntry as BackendEntry
    from moe_core.registry import BackendKey as BackendKey
    from moe_core.registry import BackendSelectionError as BackendSelectionError
    from moe_core.registry import BoundRunner as BoundRunner
    from moe_core.registry import Considered as Considered
    from moe_core.registry import DegradedRoute as DegradedRoute
    from moe_core.registry import FormatRoute as FormatRoute
    from moe_core.registry import MoeForward as MoeForward
    from moe_core.registry import Route as Route
    from moe_core.registry import Selection as Selection
    from moe_core.registry import candidates as candidates
    from moe_core.registry import choose as choose
    from moe_core.registry import create_runner as create_runner
    from moe_core.registry import discover_backends as discover_backends
    from moe_core.registry import plugin_errors as plugin_errors
    from moe_core.registry import register_backend as register_backend
    from moe_core.registry import registered_backends as registered_backends
    from moe_core.registry import select_backend as select_backend
    from moe_core.routing import Router as Router
    from moe_core.routing import route as route
    from moe_core.routing import select_experts as select_experts
    from moe_core.runner import QuantInfo as QuantInfo
    from moe_core.runner import Runner as Runner
    from moe_core.runner import check_run_inputs as check_run_inputs
    from moe_core.runner import check_run_values as check_run_values

_MODULES: dict[str, tuple[str, ...]] = {
    "moe_core.block_scales": ("LinearBlockScales", "SwizzledBlockScales"),
    "moe_core.capability": ("DeviceSpec", "LayerSpec", "Priority", "Support", "Tier"),
    "moe_core.config": (
        "Activation",
        "ClampedSwiglu",
        "ExpertActivation",
        "GateClamp",
        "GroupScore",
        "GroupedTopK",
        "LimitedSwiglu",
        "Llama4Sigmoid",
        "MoeRunnerConfig",
        "RoutedWeights",
        "Routing",
        "RoutingMethod",
        "Scoring",
        "SigmoidTopK",
        "SparseMixer",
    ),
    "moe_core.conversion": ("AnyConversion", "Conversion", "Degradation", "FormatInfo", "WeightFormat"),
    "moe_core.dispatch": ("DispatchFormat", "DispatchOutput", "StandardDispatchOutput", "TopKOutput"),
    "moe_core.formats": (
        "DENSE",
        "DenseMoeWeights",
        "FP8",
        "FP8_BLOCK_SCALED",
        "FP8_CHANNEL",
        "Fp8BlockMoeWeights",
        "Fp8ChannelMoeWeights",
        "Fp8MoeWeights",
        "MXFP4",
        "Mxfp4MoeWeights",
        "NVFP4",
        "NVFP4_PER_EXPERT",
        "NVFP4_W4A16",
        "Nvfp4PerExpertMoeWeights",
        "Nvfp4MoeWeights",
        "Nvfp4W4A16MoeWeights",
    ),
    "moe_core.fp8": (
        "ExpertFp8Scales",
        "Fp8BlockExpertWeights",
        "Fp8BlockScales",
        "Fp8ChannelExpertWeights",
        "Fp8ChannelScales",
        "Fp8ExpertWeights",
        "Fp8GateUpWeights",
        "Fp8TensorScale",
    ),
    "moe_core.global_scales": (
        "DequantizeGlobalScale",
        "ExpertDequantizeGlobalScales",
        "ExpertInputScales",
        "ExpertQuantizeGlobalScales",
        "ExpertScalePolicy",
        "QuantizeGlobalScale",
    ),
    "moe_core.mxfp4": ("E8M0Scales", "Mxfp4ExpertWeights"),
    "moe_core.nvfp4": (
        "GateUpScalePolicy",
        "Nvfp4Arithmetic",
        "Nvfp4ExpertWeights",
        "Nvfp4GateUpWeights",
        "Nvfp4Tensor",
    ),
    "moe_core.registry": (
        "BackendChoice",
        "BackendEntry",
        "BackendKey",
        "BackendSelectionError",
        "BoundRunner",
        "Considered",
        "DegradedRoute",
        "FormatRoute",
        "MoeForward",
        "Route",
        "Selection",
        "candidates",
        "choose",
        "create_runner",
        "discover_backends",
        "plugin_errors",
        "register_backend",
        "registered_backends",
        "select_backend",
    ),
    "moe_core.layer": ("MoeLayer", "SharedExpert", "dense_layer"),
    "moe_core.routing": ("Router", "route", "select_experts"),
    "moe_core.runner": ("QuantInfo", "Runner", "check_run_inputs", "check_run_values"),
}
"""The module defining each public name, which ``__getattr__`` imports on the name's first access."""

_MODULE_OF = {name: module for module, names in _MODULES.items() for name in names}

__all__ = [
    "Activation",
    "AnyConversion",
    "BackendChoice",
    "BackendEntry",
    "BackendKey",
    "BackendSelectionError",
    "BoundRunner",
    "ClampedSwiglu",
    "Considered",
    "Conversion",
    "DENSE",
    "Degradation",
    "DegradedRoute",
    "DenseMoeWeights",
    "DequantizeGlobalScale",
    "DeviceSpec",
    "DispatchFormat",
    "DispatchOutput",
    "E8M0Scales",
    "ExpertActivation",
    "ExpertDequantizeGlobalScales",
    "ExpertFp8Scales",
    "ExpertInputScales",
    "ExpertQuantizeGlobalScales",
    "ExpertScalePolicy",
    "FP8",
    "FP8_BLOCK_SCALED",
    "FP8_CHANNEL",
    "FormatInfo",
    "FormatRoute",
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
    "GateClamp",
    "GateUpScalePolicy",
    "GroupScore",
    "GroupedTopK",
    "LayerSpec",
    "LimitedSwiglu",
    "LinearBlockScales",
    "Llama4Sigmoid",
    "MXFP4",
    "MoeForward",
    "MoeLayer",
    "MoeRunnerConfig",
    "Mxfp4ExpertWeights",
    "Mxfp4MoeWeights",
    "NVFP4",
    "NVFP4_PER_EXPERT",
    "NVFP4_W4A16",
    "Nvfp4Arithmetic",
    "Nvfp4PerExpertMoeWeights",
    "Nvfp4ExpertWeights",
    "Nvfp4GateUpWeights",
    "Nvfp4MoeWeights",
    "Nvfp4Tensor",
    "Nvfp4W4A16MoeWeights",
    "Priority",
    "QuantInfo",
    "QuantizeGlobalScale",
    "Route",
    "RoutedWeights",
    "Router",
    "Routing",
    "RoutingMethod",
    "Runner",
    "Scoring",
    "Selection",
    "SharedExpert",
    "SigmoidTopK",
    "SparseMixer",
    "StandardDispatchOutput",
    "Support",
    "SwizzledBlockScales",
    "Tier",
    "TopKOutput",
    "WeightFormat",
    "candidates",
    "check_run_inputs",
    "check_run_values",
    "choose",
    "create_runner",
    "dense_layer",
    "discover_backends",
    "plugin_errors",
    "register_backend",
    "registered_backends",
    "route",
    "select_backend",
    "select_experts",
]

# Defined only at run time: mypy reads a module-level __getattr__ as "any other name exists, typed as its
# return type", which would let `from moe_core import Typo` pass; it sees the TYPE_CHECKING imports instead.
if not TYPE_CHECKING:

    def __getattr__(name: str) -> object:
        """Import the module defining ``name`` on its first access, and keep the value for later ones."""
        module = _MODULE_OF.get(name)
        if module is None:
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
        value = getattr(import_module(module), name)
        globals()[name] = value
        return value

    def __dir__() -> list[str]:
        """The module's names, the public ones not imported yet included."""
        return sorted({*globals(), *__all__})
