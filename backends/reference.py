"""The pure-PyTorch reference backend: the oracle for every other backend, one key per format.

Each key runs :class:`~moe_core.formats.reference.ReferenceRunner`, the one
generic reference forward (one expert at a time, float32 arithmetic, any
device torch runs on), with its format kit's recipe: how that format's
weights dequantize and how each GEMM input is quantized (see each kit's
``reference.py``). Each takes its format's canonical weights as they are (an
identity conversion) and checks every value it is given.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import torch

from moe_core.capability import DeviceSpec, LayerSpec, Priority, Support, Tier
from moe_core.config import MoeRunnerConfig
from moe_core.conversion import Conversion
from moe_core.formats import (
    DENSE,
    FP8,
    FP8_BLOCK_SCALED,
    FP8_CHANNEL,
    MXFP4,
    NVFP4,
    NVFP4_PER_EXPERT,
    NVFP4_W4A16,
    DenseMoeWeights,
    DenseRecipe,
    Fp8BlockMoeWeights,
    Fp8BlockRecipe,
    Fp8ChannelMoeWeights,
    Fp8ChannelRecipe,
    Fp8MoeWeights,
    Fp8Recipe,
    Mxfp4MoeWeights,
    Mxfp4Recipe,
    Nvfp4PerExpertMoeWeights,
    Nvfp4PerExpertRecipe,
    Nvfp4MoeWeights,
    Nvfp4Recipe,
    Nvfp4W4A16MoeWeights,
    Nvfp4W4A16Recipe,
)
from moe_core.formats.reference import ReferenceRecipe, ReferenceRunner
from moe_core.registry import BackendKey, register_backend
from moe_core.runner import QuantInfo, Runner

W = TypeVar("W", bound=QuantInfo)


def reference_device_support(device: DeviceSpec) -> Support:
    """Wherever torch can allocate a tensor that holds data."""
    if device.kind == "meta":
        return Support.no("meta tensors hold no values to compute with")
    if device.kind == "cuda" and device.capability is None:
        return Support.no("torch sees no CUDA device")
    if device.live and device.kind not in ("cpu", "cuda"):
        try:
            torch.empty(1, device=device.kind)
        except (RuntimeError, AssertionError) as error:
            return Support.no(f"torch cannot allocate on {device.kind}: {error}")
    return Support.yes()


def reference_supports(device: DeviceSpec, layer: LayerSpec) -> Support:
    """Any layer where torch computes (every activation and routing method: it computes them from the config, and
    takes any top-k); non-gated experts only in the dense format, expert biases in the formats whose weights hold
    them (dense, MXFP4)."""
    reasons = []
    if layer.format is not DENSE:
        if layer.config.expert_biases and layer.format is not MXFP4:
            reasons.append(f"the {layer.format.name} weights hold no expert biases")
        if not layer.config.activation.gated:
            reasons.append(f"the {layer.format.name} weights are gated (w13 [E, 2I, H]), not {layer.config.activation.value}")
    return reference_device_support(device).combine(Support.of(reasons))


ORACLE = Priority(Tier.ORACLE)
"""Every reference ranks last: it is the truth kernels are checked against, not what an engine serves with."""


def _as_is(weights: W) -> W:
    return weights


def _runner(recipe: ReferenceRecipe[W]) -> Callable[[MoeRunnerConfig], Runner[W]]:
    """The factory of a format's oracle: the generic reference forward with the kit's recipe."""

    def runner(config: MoeRunnerConfig) -> Runner[W]:
        return ReferenceRunner(config, recipe)

    return runner


REFERENCE_DENSE: BackendKey[DenseMoeWeights] = register_backend(
    "reference-dense",
    description="PyTorch, unquantized weights, float32 math",
    factory=_runner(DenseRecipe()),
    supports=reference_supports,
    priority=ORACLE,
    conversions=[Conversion(DENSE, _as_is)],
)
"""The oracle of the dense format."""

REFERENCE_NVFP4: BackendKey[Nvfp4MoeWeights] = register_backend(
    "reference-nvfp4",
    description="PyTorch, NVFP4 W4A4 (FP4 activations), float32 math",
    factory=_runner(Nvfp4Recipe()),
    supports=reference_supports,
    priority=ORACLE,
    conversions=[Conversion(NVFP4, _as_is)],
)
"""The oracle of the NVFP4 format."""

REFERENCE_NVFP4_PER_EXPERT: BackendKey[Nvfp4PerExpertMoeWeights] = register_backend(
    "reference-nvfp4-per-expert",
    description="PyTorch, NVFP4 W4A4, each expert's inputs quantized with its own scale, float32 math",
    factory=_runner(Nvfp4PerExpertRecipe()),
    supports=reference_supports,
    priority=ORACLE,
    conversions=[Conversion(NVFP4_PER_EXPERT, _as_is)],
)
"""The oracle of the per-expert NVFP4 format."""

REFERENCE_FP8: BackendKey[Fp8MoeWeights] = register_backend(
    "reference-fp8",
    description="PyTorch, FP8 W8A8 (static per-tensor scales), float32 math",
    factory=_runner(Fp8Recipe()),
    supports=reference_supports,
    priority=ORACLE,
    conversions=[Conversion(FP8, _as_is)],
)
"""The oracle of the FP8 format."""

REFERENCE_FP8_CHANNEL: BackendKey[Fp8ChannelMoeWeights] = register_backend(
    "reference-fp8-channel",
    description="PyTorch, FP8 W8A8 (per-channel weights, dynamic per-token activations), float32 math",
    factory=_runner(Fp8ChannelRecipe()),
    supports=reference_supports,
    priority=ORACLE,
    conversions=[Conversion(FP8_CHANNEL, _as_is)],
)
"""The oracle of the per-channel FP8 format."""

REFERENCE_FP8_BLOCK: BackendKey[Fp8BlockMoeWeights] = register_backend(
    "reference-fp8-block",
    description="PyTorch, FP8 W8A8 (128x128 block weights, dynamic 1x128 activation groups), float32 math",
    factory=_runner(Fp8BlockRecipe()),
    supports=reference_supports,
    priority=ORACLE,
    conversions=[Conversion(FP8_BLOCK_SCALED, _as_is)],
)
"""The oracle of the block-scaled FP8 format."""

REFERENCE_NVFP4_W4A16: BackendKey[Nvfp4W4A16MoeWeights] = register_backend(
    "reference-nvfp4-w4a16",
    description="PyTorch, NVFP4 weights with unquantized activations (W4A16), float32 math",
    factory=_runner(Nvfp4W4A16Recipe()),
    supports=reference_supports,
    priority=ORACLE,
    conversions=[Conversion(NVFP4_W4A16, _as_is)],
)
"""The oracle of the NVFP4 W4A16 format."""

REFERENCE_MXFP4: BackendKey[Mxfp4MoeWeights] = register_backend(
    "reference-mxfp4",
    description="PyTorch, MXFP4 weights with unquantized activations (W4A16), expert biases, float32 math",
    factory=_runner(Mxfp4Recipe()),
    supports=reference_supports,
    priority=ORACLE,
    conversions=[Conversion(MXFP4, _as_is)],
)
"""The oracle of the MXFP4 format."""
