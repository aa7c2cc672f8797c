"""What the two NVFP4 checkpoint schemes share: the quantization-config check and the canonical weights.

compressed-tensors and ModelOpt store the same numbers (packed E2M1 codes, one
E4M3 scale per 16 elements, one FP32 global scale per projection, one static
FP32 input scale per projection) under other names and with the global
scales in opposite conventions; each scheme is a :class:`Nvfp4CheckpointScheme`
with its names and its convention.
"""

from __future__ import annotations

import abc
from collections.abc import Mapping
from typing import ClassVar, TypeVar

import torch

from moe_core import (
    NVFP4,
    NVFP4_PER_EXPERT,
    ExpertInputScales,
    ExpertQuantizeGlobalScales,
    ExpertScalePolicy,
    FormatRoute,
    LinearBlockScales,
    MoeRunnerConfig,
    Nvfp4PerExpertMoeWeights,
    Nvfp4ExpertWeights,
    Nvfp4GateUpWeights,
    Nvfp4MoeWeights,
    QuantizeGlobalScale,
    QuantInfo,
    WeightFormat,
)
from moe_core.expert_params import ParamLayout, ParamSpec
from moe_core.scheme import ExpertScheme

W = TypeVar("W", bound=QuantInfo)


def _experts(packed: torch.Tensor, scales: torch.Tensor, global_scales: ExpertQuantizeGlobalScales) -> Nvfp4ExpertWeights:
    return Nvfp4ExpertWeights(packed, LinearBlockScales.from_checkpoint(scales), global_scales)


class _Nvfp4Checkpoint(ExpertScheme[W]):
    """An NVFP4 W4A4 checkpoint scheme of either input-scale format: its tensor names and scale convention are the
    subclass's, the canonical weights' format is :meth:`source_format`'s.

    Gate and up keep their own weight global scales (never ``[:, 0]`` of the
    pair). The checkpoint's input scales of w1/w3 (one GEMM input) and of w2,
    one per expert, are kept for every expert of the layer on every rank, so
    that the layer-wide scalars they collapse to under ``input_scale_policy``
    do not depend on the expert placement.
    """

    NAME: ClassVar[str]
    """The scheme's short name."""
    PACKED: ClassVar[str]
    """The packed E2M1 weight's name."""
    BLOCK_SCALES: ClassVar[str]
    """The E4M3 block scales' name."""
    WEIGHT_SCALE: ClassVar[str]
    """The per-projection weight global scale's name."""
    INPUT_SCALE: ClassVar[str]
    """The per-projection static input scale's name."""

    def __init__(
        self,
        config: MoeRunnerConfig,
        device: torch.device = torch.device("cpu"),
        *,
        input_scale_policy: ExpertScalePolicy = ExpertScalePolicy.CONSERVATIVE,
        backend: FormatRoute[W] | str | None = None,
        strict: bool = False,
        activation_dtype: torch.dtype = torch.bfloat16,
    ) -> None:
        """Create the layer's parameters on ``device``; ``backend`` forces a backend fed from this scheme's format (a
        route, or a name), ``strict`` forbids running it as another format (W4A16 where no W4A4 kernel fits)."""
        if not isinstance(input_scale_policy, ExpertScalePolicy):
            raise TypeError(f"input_scale_policy: expected an ExpertScalePolicy, got {input_scale_policy!r}")
        specs = (
            ParamSpec(self.PACKED, torch.uint8, ParamLayout.PACKED_FP4),
            ParamSpec(self.BLOCK_SCALES, torch.float8_e4m3fn, ParamLayout.BLOCK_SCALES),
            ParamSpec(self.WEIGHT_SCALE, torch.float32, ParamLayout.SCALAR),
            ParamSpec(self.INPUT_SCALE, torch.float32, ParamLayout.SCALAR, every_expert=True),
        )
        super().__init__(
            self.NAME,
            self.source_format(),
            specs,
            config,
            device,
            backend=backend,
            strict=strict,
            activation_dtype=activation_dtype,
        )
        self.input_scale_policy = input_scale_policy
        """How several input scales of one GEMM input become one: over the layer's experts for the scalar a kernel
        takes, and over w1's and w3's of one expert."""

    @classmethod
    @abc.abstractmethod
    def source_format(cls) -> WeightFormat[W]:
        """The format of the canonical weights."""

    @staticmethod
    @abc.abstractmethod
    def weight_scales(values: torch.Tensor) -> ExpertQuantizeGlobalScales:
        """Per-expert weight global scales ``[E]`` from checkpoint values in the scheme's convention."""

    @staticmethod
    @abc.abstractmethod
    def input_scale(values: torch.Tensor, *, num_experts: int, policy: ExpertScalePolicy) -> QuantizeGlobalScale:
        """The scalar input scale from the checkpoint's values of all ``num_experts`` experts (per shard), under
        ``policy``."""

    @staticmethod
    @abc.abstractmethod
    def expert_input_scales(values: torch.Tensor, *, policy: ExpertScalePolicy) -> ExpertInputScales:
        """Each expert's own input scale from the checkpoint's values ``[E, shards]``, its shards made one under
        ``policy``."""

    def _experts(self) -> tuple[Nvfp4GateUpWeights, Nvfp4ExpertWeights]:
        params = self.params
        packed, scales = params.gate_up(self.PACKED), params.gate_up(self.BLOCK_SCALES)
        weight_scale = params.gate_up(self.WEIGHT_SCALE)
        w13 = Nvfp4GateUpWeights(
            gate=_experts(packed[:, 0], scales[:, 0], self.weight_scales(weight_scale[:, 0].contiguous())),
            up=_experts(packed[:, 1], scales[:, 1], self.weight_scales(weight_scale[:, 1].contiguous())),
        )
        w2 = _experts(
            params.down(self.PACKED), params.down(self.BLOCK_SCALES), self.weight_scales(params.down(self.WEIGHT_SCALE))
        )
        return w13, w2


class Nvfp4CheckpointScheme(_Nvfp4Checkpoint[Nvfp4MoeWeights]):
    """An NVFP4 W4A4 checkpoint scheme whose GEMM inputs are quantized with one scalar each (what the FP4 kernels take),
    collapsed from the experts' values under ``input_scale_policy``."""

    @classmethod
    def source_format(cls) -> WeightFormat[Nvfp4MoeWeights]:
        """NVFP4 W4A4 with one input scale per GEMM."""
        return NVFP4

    def canonical_weights(self) -> Nvfp4MoeWeights:
        """Canonical NVFP4 weights from the loaded parameters: each GEMM input's scalar over every expert of the layer."""
        w13, w2 = self._experts()
        params, policy, experts = self.params, self.input_scale_policy, self.config.num_experts
        return Nvfp4MoeWeights(
            w13=w13,
            w2=w2,
            w13_input_scale=self.input_scale(params.gate_up(self.INPUT_SCALE), num_experts=experts, policy=policy),
            w2_input_scale=self.input_scale(params.down(self.INPUT_SCALE), num_experts=experts, policy=policy),
        )


class Nvfp4PerExpertCheckpointScheme(_Nvfp4Checkpoint[Nvfp4PerExpertMoeWeights]):
    """An NVFP4 W4A4 checkpoint scheme whose GEMM inputs are quantized per expert, each with the scale calibrated on
    that expert's own inputs (an expert far below the others keeps its inputs); one-scalar kernels run it through the
    format's named degradation, with scalars derived from every expert of the layer."""

    @classmethod
    def source_format(cls) -> WeightFormat[Nvfp4PerExpertMoeWeights]:
        """NVFP4 W4A4 with one input scale per expert."""
        return NVFP4_PER_EXPERT

    def canonical_weights(self) -> Nvfp4PerExpertMoeWeights:
        """Canonical per-expert NVFP4 weights: this rank's experts, every expert's own input scales (the weights derive
        the layer-wide scalars from them)."""
        w13, w2 = self._experts()
        params, policy = self.params, self.input_scale_policy

        def every(values: torch.Tensor) -> ExpertInputScales:
            shards = values.reshape(values.shape[0], -1).contiguous()
            return self.expert_input_scales(shards, policy=policy)

        return Nvfp4PerExpertMoeWeights(
            w13=w13,
            w2=w2,
            w13_input_scales=every(params.gate_up(self.INPUT_SCALE)),
            w2_input_scales=every(params.down(self.INPUT_SCALE)),
            local_expert_offset=self.config.local_expert_offset,
            policy=policy,
        )


def nvfp4_group_problem(group: Mapping[str, object]) -> str | None:
    """Why a quantization config group is not NVFP4 W4A4 (4-bit float, groups of 16, both weights and inputs)."""
    for role in ("weights", "input_activations"):
        args = group.get(role)
        if not isinstance(args, Mapping):
            return f"{role}: not quantized (NVFP4 W4A4 quantizes both weights and input activations)"
        found = (args.get("num_bits"), args.get("type"), args.get("group_size"))
        if found != (4, "float", 16):
            return f"{role}: num_bits/type/group_size are {found}, NVFP4 is (4, 'float', 16)"
    return None
