"""One whole MoE layer: hidden states in, output out (router, routing, routed experts, shared expert).

Built once: the weights go through backend selection (by capability, or by
name) and the chosen backend's conversion; the forward is then router
logits -> :func:`~moe_core.routing.route` (the fused routing kernel on CUDA) -> the bound runner -> plus the
shared expert, with nothing re-inferred.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import final

import attrs
import torch
import torch.nn.functional as F

from moe_core._checks import (
    FLOAT_DTYPES,
    record_built,
    reduce_rebuilt,
    require_dtype,
    require_finite,
    require_ndim,
    require_same_device,
    require_shape,
    require_tensor,
    require_unwritten_since_built,
)
from moe_core._compile import run_eagerly
from moe_core.capability import DeviceSpec, LayerSpec
from moe_core.config import ACTIVATION_TYPES, ExpertActivation, MoeRunnerConfig, config_differences
from moe_core.dispatch import StandardDispatchOutput, TopKOutput
from moe_core.formats.dense import DENSE, DenseMoeWeights
from moe_core.registry import BoundRunner, MoeForward, choose
from moe_core.routing import Router, check_router, route, routing_summary


@final
@attrs.frozen(eq=False, kw_only=True)
class SharedExpert:
    """An always-on MLP beside the routed experts, added once per token (DeepSeek-V3, GLM4-MoE, Qwen2-MoE, Llama 4).

    Computed in the hidden states' dtype, as the models' own dense MLPs are;
    with ``gate`` (Qwen2-MoE) its output is scaled by ``sigmoid(x @ gate.T)``.
    """

    w13: torch.Tensor
    """``[2 * I, H]`` gate rows then up rows (``[I, H]`` for a non-gated activation)."""
    w2: torch.Tensor
    """``[H, I]``."""
    activation: ExpertActivation
    """No default: a model's shared expert may compute another activation than its routed ones (Step 3.7 limits
    them apart), and a default would silently stand in for the one it has."""
    gate: torch.Tensor | None = None
    """``[1, H]``."""

    def __attrs_post_init__(self) -> None:
        activation: object = self.activation  # typed, but a caller's Any reaches here unchecked
        if not isinstance(activation, ACTIVATION_TYPES):
            names = " or ".join(kind.__name__ for kind in ACTIVATION_TYPES)
            raise TypeError(f"SharedExpert.activation: expected an {names}, got {activation!r}")
        require_tensor("SharedExpert.w13", self.w13)
        require_tensor("SharedExpert.w2", self.w2)
        require_ndim("SharedExpert.w13", self.w13, 2, "[rows, hidden_size]")
        require_ndim("SharedExpert.w2", self.w2, 2, "[hidden_size, intermediate_size]")
        hidden, inter = (int(d) for d in self.w2.shape)
        rows = 2 * inter if self.activation.gated else inter
        require_shape("SharedExpert.w13", self.w13, (rows, hidden), f"[{rows} rows for {self.activation.value}, H]")
        tensors = [("w13", self.w13), ("w2", self.w2)]
        if self.gate is not None:
            require_tensor("SharedExpert.gate", self.gate)
            require_shape("SharedExpert.gate", self.gate, (1, hidden), "[1, hidden_size]")
            tensors.append(("gate", self.gate))
        for name, tensor in tensors:
            require_dtype(f"SharedExpert.{name}", tensor, (self.w13.dtype,) if name != "w13" else FLOAT_DTYPES)
            require_finite(f"SharedExpert.{name}", tensor)
            record_built(self, name, tensor)
        require_same_device(tensors)

    @classmethod
    def from_projections(
        cls,
        *,
        gate: torch.Tensor,
        up: torch.Tensor,
        down: torch.Tensor,
        activation: ExpertActivation,
        output_gate: torch.Tensor | None = None,
    ) -> SharedExpert:
        """A gated MLP from its three projections by role, as checkpoints store them (``gate_proj`` and ``up_proj``
        ``[I, H]``, ``down_proj`` ``[H, I]``; Qwen2-MoE's ``shared_expert_gate`` ``[1, H]`` as ``output_gate``):
        fused here in ``w13``'s order, gate rows first, so that no caller concatenates them (up first ran 0.61 off,
        silently)."""
        if isinstance(activation, ACTIVATION_TYPES) and not activation.gated:
            raise ValueError(f"activation: {activation.value} is not gated: build SharedExpert(w13=up, ...) directly")
        for name, tensor in (("gate", gate), ("up", up)):
            require_tensor(f"SharedExpert.from_projections: {name}", tensor)
            require_ndim(f"SharedExpert.from_projections: {name}", tensor, 2, "[intermediate_size, hidden_size]")
        if gate.shape != up.shape:
            raise ValueError(
                f"SharedExpert.from_projections: up: expected shape {tuple(gate.shape)} like gate, got {tuple(up.shape)}"
            )
        return cls(w13=torch.cat((gate, up)), w2=down, activation=activation, gate=output_gate)

    def __reduce__(self) -> tuple[Callable[..., object], tuple[object, ...]]:
        """Copies and pickles are built through the constructor (checked, their tensors recorded); one written in place
        since it was built is refused, as its call would be."""
        return reduce_rebuilt(self, "SharedExpert")

    def __call__(self, hidden_states: torch.Tensor) -> torch.Tensor:
        """``[T, H]`` output of ``hidden_states [T, H]`` (of the weights' dtype); ``RuntimeError`` if one of its tensors
        was written in place since it was built."""
        require_unwritten_since_built("SharedExpert", self)
        if hidden_states.dtype != self.w13.dtype:
            raise TypeError(
                f"SharedExpert: hidden_states are {hidden_states.dtype}, its weights {self.w13.dtype}: build it in the "
                "hidden states' dtype (the models' own dense MLPs compute in it)"
            )
        if hidden_states.device != self.w13.device:  # a meta expert would add uninitialized values to a CPU batch
            raise ValueError(f"SharedExpert: hidden_states on {hidden_states.device}, its weights on {self.w13.device}")
        out = F.linear(self.activation.apply(F.linear(hidden_states, self.w13)), self.w2)
        if self.gate is None:
            return out
        return torch.sigmoid(F.linear(hidden_states, self.gate)) * out


@final
@attrs.frozen(eq=False, kw_only=True)
class MoeLayer:
    """A built MoE layer: ``layer(hidden_states [T, H]) -> [T, H]``; ``backend`` says what runs the routed experts."""

    config: MoeRunnerConfig
    router: Router
    experts: MoeForward
    backend: str
    """The selection's summary: the backend chosen, and those passed over with why."""
    shared_expert: SharedExpert | None = None
    fused_routing: bool | None = None
    """As :func:`~moe_core.routing.route` takes it: None routes with the fused Triton kernel where it applies (on
    CUDA), True requires it, False always takes ``select_experts``."""

    def __attrs_post_init__(self) -> None:
        if self.fused_routing is not None and not isinstance(self.fused_routing, bool):
            raise TypeError(f"MoeLayer.fused_routing: expected True, False or None, got {self.fused_routing!r}")
        if self.config.num_local_experts != self.config.num_experts:
            raise ValueError(
                f"MoeLayer.config: a layer routes and combines every token in one process, so it holds every expert, "
                f"got num_local_experts={self.config.num_local_experts} of {self.config.num_experts} (offset "
                f"{self.config.local_expert_offset}): tokens routed elsewhere would get nothing; split a layer over "
                "ranks with moe_core.distributed (ExpertParallelMoe)"
            )
        check_router(self.router, self.config)
        if self.shared_expert is not None:
            self._check_shared_expert(self.shared_expert)
        if not isinstance(self.experts, BoundRunner):
            raise TypeError(
                f"MoeLayer.experts: expected the bound forward a route or backend key binds (BoundRunner), got "
                f"{type(self.experts).__name__}: the layer checks the config the experts were bound for against its "
                "own, which another callable does not carry"
            )
        differ = config_differences(self.config, self.experts.runner.config, "experts'")
        if differ:
            raise ValueError(f"MoeLayer.config: the experts were bound for another layer: {'; '.join(differ)}")

    def _check_shared_expert(self, shared: object) -> None:
        """A :class:`SharedExpert` (a module of the model computes without its gate or checks), of the layer's
        hidden size, beside the router."""
        if not isinstance(shared, SharedExpert):
            raise TypeError(
                f"MoeLayer.shared_expert: expected a SharedExpert, got {type(shared).__name__} (build one from the "
                "MLP's weights: a model's own module may gate its output, which a plain call would drop)"
            )
        if shared.w2.shape[0] != self.config.hidden_size:
            raise ValueError(
                f"MoeLayer.shared_expert: its w2 has {shared.w2.shape[0]} rows, the layer's hidden size is "
                f"{self.config.hidden_size}"
            )
        require_same_device([("router.weight", self.router.weight), ("shared_expert.w13", shared.w13)])

    @property
    def routing(self) -> str:
        """What routes the layer's tokens: the fused Triton kernel (on CUDA), or ``select_experts`` and why."""
        return routing_summary(self.config, self.router.weight.device, fused=self.fused_routing)

    @run_eagerly
    def forward(self, hidden_states: torch.Tensor) -> tuple[torch.Tensor, TopKOutput]:
        """The output and the routing that produced it (for blocks that also return weights or logits); run eagerly
        under ``torch.compile`` (a graph break)."""
        topk = route(hidden_states, self.router, self.config, fused=self.fused_routing)
        # the layer's own routing: its values were checked as the top-k was built (or are the fused kernel's, by
        # construction), and its weights are the method's; the runner need not read them back again
        own = topk if not topk.check_values else TopKOutput(
            topk.topk_ids, topk.topk_weights, topk.router_logits, num_experts=topk.num_experts, check_values=False,
            from_router_logits=True,
        )
        out = self.experts(StandardDispatchOutput(hidden_states, own))
        if self.shared_expert is not None:
            out = out + self.shared_expert(hidden_states)
        return out, topk

    def __call__(self, hidden_states: torch.Tensor) -> torch.Tensor:
        """The ``[T, H]`` output."""
        return self.forward(hidden_states)[0]


def dense_layer(
    config: MoeRunnerConfig,
    router: Router,
    weights: DenseMoeWeights,
    *,
    dtype: torch.dtype,
    device: DeviceSpec | torch.device | None = None,
    backend: str | None = None,
    shared_expert: SharedExpert | None = None,
) -> MoeLayer:
    """A layer of unquantized experts, its backend chosen for ``dtype`` hidden states on ``device`` (default: where
    the weights are), by name when ``backend`` is given; the weights are converted for it once, here."""
    if config.expert_biases != (weights.biases is not None):
        raise ValueError(
            f"config.expert_biases: expected {weights.biases is not None} for weights "
            f"{'with' if weights.biases is not None else 'without'} biases, got {config.expert_biases}"
        )
    if config.activation.gated != weights.gated:
        raise ValueError(
            f"weights: w13 has {weights.w13.shape[1]} rows, which {config.activation.value} "
            f"({'gated' if config.activation.gated else 'not gated'}) does not take"
        )
    selection = choose(DENSE, weights.device if device is None else device, LayerSpec(config, DENSE, dtype), name=backend)
    return MoeLayer(
        config=config,
        router=router,
        experts=selection.chosen.bind(config, weights),
        backend=selection.summary(),
        shared_expert=shared_expert,
    )
