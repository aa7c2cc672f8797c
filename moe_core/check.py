"""What ``moe-core check`` measures: each format's reference, and every backend against it.

For one random layer (float32 weights whose up halves have their own
scales) and one routed batch, per canonical format:

1. the format's reference backend (its oracle, found by key) against an
   independent float64 MoE written token by token (:mod:`moe_core.float64_moe`),
   with a tolerance: this checks the oracle;
2. for NVFP4 (W4A4 and W4A16), the same reference against the float64 MoE
   of the unquantized layer: the quantization error, reported, not judged;
3. every registered backend that converts from the format, through its own
   registered conversion, against the oracle, with the user's tolerance or
   the format's default (:func:`backend_tolerance`);
4. the same layer with each config field a backend may claim varied, one at
   a time (:func:`config_variants`: every activation and routing method,
   parameterized ones included, a routed scaling factor other than 1, expert
   biases (random ones, in the formats that hold them), and expert
   parallelism), on the first :data:`VARIANT_TOKENS` tokens, untimed:
   the oracle against the float64 MoE of that config, and each backend whose
   ``supports`` takes that config against the oracle (a refusal is a skipped
   row with its reasons), so a backend that ignores a field it claims fails.
   A variant the format cannot hold (a non-gated activation in a format of
   gate and up halves) is one skipped row;
5. the same weights on fresh batches of other token counts
   (:func:`batch_sizes`: one, and more than the run's), untimed.

With ``--checkpoint DIR``, the layer is one MoE layer of a real checkpoint,
loaded through its scheme, and the batch is routed by its own router: the
same rows for the scheme's format, the ``info`` row comparing with the
dequantized weights without activation quantization.

Each row carries the median time per call. A backend that raises, returns
the wrong shape, dtype or device, or misses its tolerance is a FAILED row.
"""

from __future__ import annotations

import functools
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Generic, Protocol, TypeVar, final

import attrs
import torch

from moe_core.backends.reference import (
    REFERENCE_DENSE,
    REFERENCE_FP8,
    REFERENCE_FP8_BLOCK,
    REFERENCE_FP8_CHANNEL,
    REFERENCE_MXFP4,
    REFERENCE_NVFP4,
    REFERENCE_NVFP4_PER_EXPERT,
    REFERENCE_NVFP4_W4A16,
)
from moe_core.capability import DeviceSpec, LayerSpec
from moe_core.config import EXAMPLE_ACTIVATIONS, MoeRunnerConfig, example_routings
from moe_core.conversion import FormatInfo, WeightFormat
from moe_core.dispatch import StandardDispatchOutput, TopKOutput
from moe_core.float64_moe import (
    float64_moe,
    fp8_per_group_round_trips,
    fp8_per_token_round_trips,
    fp8_round_trips,
    nvfp4_expert_round_trips,
    nvfp4_round_trips,
)
from moe_core.formats import DENSE, FP8, FP8_BLOCK_SCALED, FP8_CHANNEL, MXFP4, NVFP4, NVFP4_PER_EXPERT, NVFP4_W4A16
from moe_core.formats.dense import ExpertBiases
from moe_core.formats import (
    DenseMoeWeights,
    Fp8BlockMoeWeights,
    Fp8ChannelMoeWeights,
    Fp8MoeWeights,
    Mxfp4MoeWeights,
    Nvfp4PerExpertMoeWeights,
    Nvfp4MoeWeights,
    Nvfp4W4A16MoeWeights,
    fp8_block_size_refusal,
)
from moe_core.mxfp4 import MXFP4_BLOCK, Mxfp4ExpertWeights
from moe_core.registry import BackendEntry, BackendKey, MoeForward
from moe_core.routing import select_experts
from moe_core.runner import QuantInfo
from moe_core.synthetic import (
    quantize_fp8_block_layer,
    quantize_fp8_channel_layer,
    quantize_fp8_layer,
    quantize_nvfp4_per_expert_layer,
    quantize_nvfp4_layer,
    random_tokens,
)

W = TypeVar("W", bound=QuantInfo)

VARIANT_TOKENS = 64
"""Tokens of the batch each config variant runs (the run's first ones), each forward called once, untimed. At 4, a
plugin that drops slots of small weight passed the unrenormalized softmax variant with no error (adversarial pass 6,
c13): too few slots to meet one."""

QUANTIZED_ACTIVATIONS_TOLERANCE = 5e-2
"""The default largest relative error of a backend against its format's oracle where the format quantizes the
activations at run time (FP8, NVFP4 W4A4): a code near a rounding boundary may take the other side."""

TF32_TOLERANCE = 5e-3
"""The least default tolerance of the other formats on a CUDA device: float32 activations may run through TF32
tensor cores there."""

FLOAT32_TOLERANCE = 1e-5
"""The least default tolerance of the other formats elsewhere (no TF32 on a CPU: a floor of 5e-3 passed a plugin
that rounds its GEMM inputs to bf16, 3e-3 off: adversarial pass 8, c11)."""


def backend_tolerance(dtype: torch.dtype, quantizes_activations: bool, device: torch.device) -> float:
    """The default largest relative l2 error of a backend against its format's oracle, for outputs in ``dtype`` on
    ``device``: :data:`QUANTIZED_ACTIVATIONS_TOLERANCE` where activations are quantized, else two epsilons of
    ``dtype`` (bf16: 1.6e-2), at least :data:`TF32_TOLERANCE` on CUDA and :data:`FLOAT32_TOLERANCE` elsewhere. A
    flat 5e-2 passed a dense plugin 4e-2 off (pass 6, c13)."""
    if quantizes_activations:
        return QUANTIZED_ACTIVATIONS_TOLERANCE
    return max(2 * torch.finfo(dtype).eps, TF32_TOLERANCE if device.type == "cuda" else FLOAT32_TOLERANCE)


def batch_sizes(tokens: int) -> list[int]:
    """The token counts each format also runs besides the run's ``tokens``, untimed: one (decode), five (a small
    batch: a plugin wrong on 2 to 32 tokens passed, adversarial pass 19, k01) and ``4 * tokens + 1`` (past the run's
    count and any power-of-two chunk: a plugin wrong above 64 tokens passed a 64-token check, pass 6, c29)."""
    return [count for count in (1, 5, 4 * tokens + 1) if count != tokens]

VARIANT_SCALING_FACTOR = 2.5
"""The routed scaling factor of its variant (any value other than 1 that the default config does not have)."""


def config_variants(config: MoeRunnerConfig) -> list[tuple[str, MoeRunnerConfig]]:
    """``config`` with each field a backend may claim varied, one at a time, named for the table (no spaces: a
    table cell never breaks inside a word).

    Every activation and every routing method other than the config's, with
    parameters (:data:`~moe_core.config.EXAMPLE_ACTIVATIONS`,
    :func:`~moe_core.config.example_routings`: a new one is checked without
    an edit here), top-k 1 and top-k of every expert (other than the
    config's), a routed scaling factor other than the config's, expert
    biases where the config has none (and none where it has some), and
    expert parallelism (the last half of the experts local, and a slice from
    an odd offset: a plugin taking its experts to be the last ones passed the
    last half alone, adversarial pass 19, k01; one wrong at odd offsets passed
    an even one, pass 21, a06) where all experts are local.
    A value the config's own validation refuses for these sizes is left out.
    """
    factor = VARIANT_SCALING_FACTOR if config.routed_scaling_factor != VARIANT_SCALING_FACTOR else 1.0
    top_ks = sorted({1, config.num_experts} - {config.top_k})
    changes: list[tuple[str, Callable[[], MoeRunnerConfig]]] = [
        *((f"activation={a.value}", functools.partial(attrs.evolve, config, activation=a))
          for a in EXAMPLE_ACTIVATIONS if a != config.activation),
        *((f"routing={r.value}", functools.partial(attrs.evolve, config, routing_method=r))
          for r in example_routings(config.num_experts, config.top_k) if r != config.routing_method),
        *((f"top_k={top_k}", functools.partial(attrs.evolve, config, top_k=top_k)) for top_k in top_ks),
        (f"routed_scaling_factor={factor:g}", functools.partial(attrs.evolve, config, routed_scaling_factor=factor)),
        (f"expert_biases={not config.expert_biases}",
         functools.partial(attrs.evolve, config, expert_biases=not config.expert_biases)),
    ]
    if config.num_local_experts == config.num_experts > 1:
        experts = config.num_experts
        slices = {(experts - experts // 2, experts // 2), (1, max(1, experts // 2))}
        for offset, local in sorted(slices, reverse=True):
            if offset + local <= experts:
                changes.append((
                    f"local_experts={offset}-{offset + local - 1}/{experts}",
                    functools.partial(attrs.evolve, config, num_local_experts=local, local_expert_offset=offset),
                ))
    variants = []
    for name, change in changes:
        try:
            variants.append((name, change()))
        except (TypeError, ValueError):
            continue
    return variants


def _variant_layer(
    run: CheckRun, variant: MoeRunnerConfig
) -> tuple[DenseMoeWeights, StandardDispatchOutput] | str:
    """The run's layer and first tokens as ``variant`` sees them, or why there is none.

    Its local experts' weights (w13's gate half alone for a non-gated
    activation; biases as the variant says: the run's, none, or random ones
    from the run's seed) and the batch routed again by ``variant``'s method
    from the run's router logits.
    """
    config, source, dispatch = run.config, run.source, run.dispatch
    first = variant.local_expert_offset - config.local_expert_offset
    if first < 0 or first + variant.num_local_experts > config.num_local_experts:
        return "the run's weights do not hold these local experts"
    experts = slice(first, first + variant.num_local_experts)
    w13 = source.w13[experts]
    if not variant.activation.gated:
        w13 = w13[:, : variant.intermediate_size_per_partition]
    biases = None
    if variant.expert_biases:
        biases = _random_biases(run, source.w13.shape[0]) if source.biases is None else source.biases
        biases = ExpertBiases(w13=biases.w13[experts, : w13.shape[1]], w2=biases.w2[experts])
    tokens = min(VARIANT_TOKENS, dispatch.topk.num_tokens)
    logits = dispatch.topk.router_logits
    if logits is None:
        if variant.routing_method is not config.routing_method or variant.top_k != config.top_k:
            return "the batch has no router logits to route again"
        topk = TopKOutput(dispatch.topk.topk_ids[:tokens], dispatch.topk.topk_weights[:tokens], num_experts=variant.num_experts)
    else:
        topk = select_experts(logits[:tokens], variant, score_correction_bias=None)
    weights = DenseMoeWeights(w13=w13, w2=source.w2[experts], biases=biases)
    return weights, StandardDispatchOutput(dispatch.hidden_states[:tokens], topk)


def _edited_after_routing(dispatch: StandardDispatchOutput, config: MoeRunnerConfig) -> StandardDispatchOutput | None:
    """The batch with every slot moved to the next expert, its router logits kept and ``from_router_logits=False``
    (an engine's expert remap): a backend computes the top-k it is given, and one routing again from the attached
    logits passed every other row (adversarial pass 19, k01). None where the batch has no logits or the layer's
    experts are not all local (the moved slots would leave the rank)."""
    topk = dispatch.topk
    if topk.router_logits is None or config.num_local_experts != config.num_experts or config.num_experts < 2:
        return None
    moved = (topk.topk_ids.long() + 1) % config.num_experts
    edited = TopKOutput(
        moved.to(topk.topk_ids.dtype), topk.topk_weights, topk.router_logits, num_experts=topk.num_experts,
        from_router_logits=False,
    )
    return StandardDispatchOutput(dispatch.hidden_states, edited)


def _fresh_batch(run: CheckRun, tokens: int) -> StandardDispatchOutput:
    """``tokens`` new tokens, drawn from the run's seed like its own (of their dtype and device), routed by the run's
    config from new router logits."""
    hidden = run.dispatch.hidden_states
    gen = torch.Generator().manual_seed(run.seed + tokens)
    x, logits = random_tokens(run.config, tokens, hidden.dtype, hidden.device, gen)
    return StandardDispatchOutput(x, select_experts(logits, run.config, score_correction_bias=None))


def _random_biases(run: CheckRun, experts: int) -> ExpertBiases:
    """Biases for every expert of the run's layer (N(0, 0.25), as large as the GEMMs' outputs' spread), from its seed."""
    gen = torch.Generator().manual_seed(run.seed)
    rows, hidden = run.source.w13.shape[1], run.config.hidden_size
    device = run.source.w13.device
    return ExpertBiases(
        w13=(torch.randn(experts, rows, generator=gen) * 0.5).to(device),
        w2=(torch.randn(experts, hidden, generator=gen) * 0.5).to(device),
    )


QUANTIZATION_TIES = 1e-2
"""The least oracle tolerance of a format that quantizes activations at run time: the reference rounds in float32,
the float64 MoE in float64, and an input within an ulp of a rounding midpoint takes the other code in one of them
(float32 outputs of the FP8 and NVFP4 oracles measured 2e-4 to 7e-3: adversarial pass 7, c08)."""


def oracle_tolerance(dtype: torch.dtype, quantizes_activations: bool = False) -> float:
    """Largest relative l2 error of a reference backend against the float64 MoE, for outputs in ``dtype``.

    The references compute in float32 and round the output to the
    activations' dtype: one epsilon of it (bf16: 7.8e-3, fp16: 9.8e-4),
    and no less than 1e-5 for float32 accumulation; where the format
    quantizes activations, no less than :data:`QUANTIZATION_TIES`.
    """
    least = QUANTIZATION_TIES if quantizes_activations else 1e-5
    return max(least, torch.finfo(dtype).eps)


@final
@attrs.frozen
class Timing:
    """Wall time per call of one backend, in ms, after warm-up."""

    median: float
    low: float
    high: float
    calls: int


@final
@attrs.frozen
class CheckRow:
    """One line of the check's table."""

    format: str
    backend: str
    compared_with: str
    rel_err: float | None
    max_abs_err: float | None
    tolerance: float | None
    timing: Timing | None
    verdict: str
    """``ok``, ``info`` (measured, not judged), ``skipped: ...`` or ``FAILED: ...``."""

    @property
    def failed(self) -> bool:
        """True for a FAILED row."""
        return self.verdict.startswith("FAILED")


def time_forward(forward: MoeForward, dispatch: StandardDispatchOutput, min_calls: int) -> tuple[torch.Tensor, Timing]:
    """The output and the time per call: two warm-up calls, then at least ``min_calls`` and 0.2 s of calls."""
    device = dispatch.hidden_states.device

    def synchronize() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    out = forward(dispatch)
    forward(dispatch)
    times: list[float] = []
    while len(times) < min_calls or sum(times) < 200.0:
        synchronize()
        start = time.perf_counter()
        out = forward(dispatch)
        synchronize()
        times.append((time.perf_counter() - start) * 1e3)
    return out, Timing(statistics.median(times), min(times), max(times), len(times))


def _forward(forward: MoeForward, dispatch: StandardDispatchOutput, min_calls: int | None) -> tuple[torch.Tensor, Timing | None]:
    """:func:`time_forward`, or with ``min_calls`` None one untimed call."""
    if min_calls is None:
        return forward(dispatch), None
    return time_forward(forward, dispatch, min_calls)


def relative_error(actual: torch.Tensor, expected: torch.Tensor) -> float:
    """``||actual - expected|| / ||expected||`` in float64 (the first of :func:`errors`)."""
    return errors(actual, expected)[0]


def errors(actual: torch.Tensor, expected: torch.Tensor) -> tuple[float, float]:
    """Relative l2 error and max abs error of ``actual`` against ``expected``, in float64.

    Against an all-zero ``expected`` the relative error is 0 where ``actual``
    is all zero too and infinite otherwise (never NaN: a verdict must say
    whether the two agree).
    """
    diff = actual.detach().cpu().double() - expected.cpu().double()
    norm, worst = float(expected.cpu().double().norm()), float(diff.abs().max())
    if norm == 0:
        return (0.0 if worst == 0 else float("inf")), worst
    return float(diff.norm()) / norm, worst


@final
@attrs.frozen(eq=False)
class CheckRun:
    """One ``moe-core check`` invocation: the layer, the batch, the backends and the user's settings."""

    config: MoeRunnerConfig
    source: DenseMoeWeights
    """The float32 layer every format's weights are built from (random, or a checkpoint's, dequantized)."""
    dispatch: StandardDispatchOutput
    backends: Sequence[BackendEntry]
    tolerance: float | None
    """The largest relative error a backend may have against its format's oracle; None: each format's default
    (:func:`backend_tolerance`)."""
    min_calls: int
    progress: Callable[[str], None]
    """Where progress lines go (stderr in the CLI)."""
    seed: int = attrs.field(default=0, kw_only=True)
    """The run's seed (the CLI's ``--seed``): the expert-bias variant draws its biases from it."""


@final
@attrs.frozen(eq=False)
class FormatCheck(Generic[W]):
    """How to check one canonical format: its oracle, how to build its weights, its independent computation."""

    format: WeightFormat[W]
    oracle: BackendKey[W]
    build: Callable[[MoeRunnerConfig, DenseMoeWeights, StandardDispatchOutput], W]
    """The format's weights from the random float32 layer."""
    independent: Callable[[MoeRunnerConfig, StandardDispatchOutput, W], torch.Tensor]
    """The float64 output the oracle must reproduce."""
    independent_name: str
    refusal: Callable[[MoeRunnerConfig], str | None] = lambda config: None
    """Why the format cannot hold a layer of this config's sizes, or ``None`` (most formats hold any)."""
    holds_biases: bool = attrs.field(default=False, kw_only=True)
    """The format's weights carry per-expert biases (dense, MXFP4): its expert-bias variant runs."""
    quantizes_activations: bool = attrs.field(default=False, kw_only=True)
    """The format quantizes the activations at run time (FP8, NVFP4 W4A4): its default tolerance is wider."""

    def tolerance(self, run: CheckRun) -> float:
        """The run's tolerance, or this format's default for the run's dtype."""
        if run.tolerance is not None:
            return run.tolerance
        hidden = run.dispatch.hidden_states
        return backend_tolerance(hidden.dtype, self.quantizes_activations, hidden.device)

    def rows(self, run: CheckRun) -> list[CheckRow]:
        """Rows for weights of this format built from the run's random float32 layer (see :meth:`rows_for`).

        A layer shape the format cannot hold (:attr:`refusal`: block-scaled FP8
        needs sizes that are multiples of 128) gives one skipped row with the
        reason; any other failure to build the weights is raised.
        """
        refusal = self.refusal(run.config)
        if refusal is not None:
            return [CheckRow(self.format.name, self.oracle.name, "-", None, None, None, None, f"skipped: {refusal}")]
        weights = self.build(run.config, run.source, run.dispatch)
        unquantized = None if run.source is weights else run.source
        rows = self.rows_for(run, weights, unquantized, "float64 MoE, unquantized weights")
        for name, variant in config_variants(run.config):
            rows += self.variant_rows(run, name, variant, weights)
        for tokens in batch_sizes(run.dispatch.topk.num_tokens):
            batch_run = attrs.evolve(run, dispatch=_fresh_batch(run, tokens))
            rows += self.rows_for(batch_run, weights, label=f"{self.format.name}[tokens={tokens}]", timed=False)
        edited = _edited_after_routing(run.dispatch, run.config)
        if edited is not None:
            label = f"{self.format.name}[topk=edited_after_routing]"
            rows += self.rows_for(attrs.evolve(run, dispatch=edited), weights, label=label, timed=False)
        return rows

    def variant_rows(self, run: CheckRun, name: str, variant: MoeRunnerConfig, weights: W | None = None) -> list[CheckRow]:
        """The oracle's and the backends' rows, untimed, for the run's layer under ``variant`` (named ``name``).

        ``weights``, the run's own in this format, are reused where the
        variant has the same local experts and weight shapes; otherwise they
        are built again. Only backends that take the run's own config are
        tried (the others' rows already say why not). Where the format cannot
        hold that layer (its sizes, or its weights' shape for the variant's
        activation), one skipped row says why.
        """
        label = f"{self.format.name}[{name}]"

        def skipped(reason: str) -> list[CheckRow]:
            return [CheckRow(label, self.oracle.name, "-", None, None, None, None, f"skipped: {reason}")]

        refusal = self.refusal(variant)
        if refusal is not None:
            return skipped(refusal)
        if variant.expert_biases and not self.holds_biases:
            return skipped(f"the {self.format.name} weights hold no expert biases")
        layer = _variant_layer(run, variant)
        if isinstance(layer, str):
            return skipped(layer)
        source, dispatch = layer
        config = run.config
        same_experts = (variant.num_local_experts, variant.local_expert_offset) == (config.num_local_experts, config.local_expert_offset)
        rebuild = variant.activation.gated != config.activation.gated or variant.expert_biases != config.expert_biases
        if weights is None or not same_experts or rebuild:
            try:
                weights = self.build(variant, source, dispatch)
            except (TypeError, ValueError) as error:
                return skipped(f"the {self.format.name} format cannot hold this layer: {error}")
        device = DeviceSpec.of(run.dispatch.hidden_states.device)
        base = LayerSpec(run.config, self.format, run.dispatch.hidden_states.dtype)
        running = [backend for backend in run.backends if backend.supports(device, base).ok]
        variant_run = attrs.evolve(run, config=variant, source=source, dispatch=dispatch, backends=running)
        return self.rows_for(variant_run, weights, label=label, timed=False)

    def rows_for(
        self,
        run: CheckRun,
        weights: object,
        unquantized: DenseMoeWeights | None = None,
        unquantized_name: str = "",
        *,
        label: str | None = None,
        timed: bool = True,
    ) -> list[CheckRow]:
        """The oracle's rows on ``weights``, then one row per backend converting from this format.

        With ``unquantized``, an ``info`` row gives the oracle's error against
        the float64 MoE of those dense weights (named ``unquantized_name``).
        ``label`` names the rows (the format's name by default); untimed rows
        call each forward once, and a backend's refusal is a skipped row.
        """
        name, config, dispatch = label or self.format.name, run.config, run.dispatch
        typed = self.format.narrow(weights)
        run.progress(f"{name}: running the reference {self.oracle.name}")
        expected, timing = _forward(self.oracle.bind(config, typed), dispatch, run.min_calls if timed else None)
        rel, worst = errors(expected, self.independent(config, dispatch, typed))
        limit = oracle_tolerance(dispatch.hidden_states.dtype, self.quantizes_activations)
        verdict = "ok" if rel <= limit else f"FAILED: error above {limit:g}"
        rows = [CheckRow(name, self.oracle.name, self.independent_name, rel, worst, limit, timing, verdict)]
        if unquantized is not None:
            rel, worst = errors(expected, float64_moe(config, dispatch, unquantized.w13, unquantized.w2, biases=unquantized.biases))
            rows.append(CheckRow(name, self.oracle.name, unquantized_name, rel, worst, None, None, "info"))
        for backend in run.backends:
            if backend.name == self.oracle.name or not backend.converts_from(self.format):
                continue
            rows.append(self._backend_row(backend, run, typed, expected, name, timed))
        return rows

    def _backend_row(
        self, backend: BackendEntry, run: CheckRun, weights: W, expected: torch.Tensor, label: str, timed: bool
    ) -> CheckRow:
        tolerance = self.tolerance(run)

        def row(verdict: str, rel: float | None = None, worst: float | None = None, timing: Timing | None = None) -> CheckRow:
            return CheckRow(label, backend.name, self.oracle.name, rel, worst, tolerance, timing, verdict)

        dispatch = run.dispatch
        layer = LayerSpec(run.config, self.format, dispatch.hidden_states.dtype)
        support = backend.supports(DeviceSpec.of(dispatch.hidden_states.device), layer)
        if not support.ok:
            prefix = "FAILED" if support.broken else "unsupported" if timed else "skipped"
            return row(f"{prefix}: {support.describe()}")
        run.progress(f"{label}: running {backend.name}")
        try:
            forward = backend.route(self.format).bind(run.config, weights)
            out, timing = _forward(forward, dispatch, run.min_calls if timed else None)
        except Exception as error:  # a backend may fail in any way (its output's shape and dtype included): report it
            return row(f"FAILED: {type(error).__name__}: {error}")
        rel, worst = errors(out, expected)
        verdict = "ok" if rel <= tolerance else f"FAILED: error above {tolerance:g}"
        return row(verdict, rel, worst, timing)


class _Check(Protocol):
    """A :class:`FormatCheck` with its weights type hidden, so checks of several formats share one tuple."""

    @property
    def format(self) -> FormatInfo: ...

    def rows(self, run: CheckRun) -> list[CheckRow]: ...

    def rows_for(
        self,
        run: CheckRun,
        weights: object,
        unquantized: DenseMoeWeights | None = ...,
        unquantized_name: str = ...,
        *,
        label: str | None = ...,
        timed: bool = ...,
    ) -> list[CheckRow]: ...


def _dense_weights(config: MoeRunnerConfig, source: DenseMoeWeights, dispatch: StandardDispatchOutput) -> DenseMoeWeights:
    return source


def _dense_float64(config: MoeRunnerConfig, dispatch: StandardDispatchOutput, weights: DenseMoeWeights) -> torch.Tensor:
    return float64_moe(config, dispatch, weights.w13, weights.w2, biases=weights.biases)


def _nvfp4_float64(config: MoeRunnerConfig, dispatch: StandardDispatchOutput, weights: Nvfp4MoeWeights) -> torch.Tensor:
    return float64_moe(config, dispatch, weights.w13.dequantize(), weights.w2.dequantize(), nvfp4_round_trips(weights))


def _nvfp4_per_expert_float64(
    config: MoeRunnerConfig, dispatch: StandardDispatchOutput, weights: Nvfp4PerExpertMoeWeights
) -> torch.Tensor:
    return float64_moe(config, dispatch, weights.w13.dequantize(), weights.w2.dequantize(), nvfp4_expert_round_trips(weights))


def _fp8_float64(config: MoeRunnerConfig, dispatch: StandardDispatchOutput, weights: Fp8MoeWeights) -> torch.Tensor:
    return float64_moe(config, dispatch, weights.w13.dequantize(), weights.w2.dequantize(), fp8_round_trips(weights))


def _fp8_channel_float64(
    config: MoeRunnerConfig, dispatch: StandardDispatchOutput, weights: Fp8ChannelMoeWeights
) -> torch.Tensor:
    return float64_moe(config, dispatch, weights.w13.dequantize(), weights.w2.dequantize(), fp8_per_token_round_trips())


def _fp8_block_float64(config: MoeRunnerConfig, dispatch: StandardDispatchOutput, weights: Fp8BlockMoeWeights) -> torch.Tensor:
    return float64_moe(config, dispatch, weights.w13.dequantize(), weights.w2.dequantize(), fp8_per_group_round_trips())


def _w4a16_weights(config: MoeRunnerConfig, source: DenseMoeWeights, dispatch: StandardDispatchOutput) -> Nvfp4W4A16MoeWeights:
    return quantize_nvfp4_layer(config, source, dispatch).without_activation_quantization()


def _w4a16_float64(config: MoeRunnerConfig, dispatch: StandardDispatchOutput, weights: Nvfp4W4A16MoeWeights) -> torch.Tensor:
    return float64_moe(config, dispatch, weights.w13.dequantize(), weights.w2.dequantize())


def _mxfp4_weights(config: MoeRunnerConfig, source: DenseMoeWeights, dispatch: StandardDispatchOutput) -> Mxfp4MoeWeights:
    return Mxfp4MoeWeights(
        w13=Mxfp4ExpertWeights.quantize(source.w13), w2=Mxfp4ExpertWeights.quantize(source.w2), biases=source.biases
    )


def _mxfp4_float64(config: MoeRunnerConfig, dispatch: StandardDispatchOutput, weights: Mxfp4MoeWeights) -> torch.Tensor:
    return float64_moe(config, dispatch, weights.w13.dequantize(), weights.w2.dequantize(), biases=weights.biases)


def _mxfp4_size_refusal(config: MoeRunnerConfig) -> str | None:
    sizes = (config.hidden_size, config.intermediate_size_per_partition)
    if any(size % MXFP4_BLOCK for size in sizes):
        return f"Mxfp4MoeWeights: expected hidden and intermediate sizes that are multiples of {MXFP4_BLOCK}, got {sizes}"
    return None


FORMAT_CHECKS: tuple[_Check, ...] = (
    FormatCheck(DENSE, REFERENCE_DENSE, _dense_weights, _dense_float64, "float64 MoE", holds_biases=True),
    FormatCheck(NVFP4, REFERENCE_NVFP4, quantize_nvfp4_layer, _nvfp4_float64, "float64 W4A4 MoE", quantizes_activations=True),
    FormatCheck(
        NVFP4_PER_EXPERT, REFERENCE_NVFP4_PER_EXPERT, quantize_nvfp4_per_expert_layer, _nvfp4_per_expert_float64,
        "float64 per-expert W4A4 MoE", quantizes_activations=True,
    ),
    FormatCheck(NVFP4_W4A16, REFERENCE_NVFP4_W4A16, _w4a16_weights, _w4a16_float64, "float64 MoE, dequantized"),
    FormatCheck(FP8, REFERENCE_FP8, quantize_fp8_layer, _fp8_float64, "float64 W8A8 MoE", quantizes_activations=True),
    FormatCheck(
        FP8_CHANNEL, REFERENCE_FP8_CHANNEL, quantize_fp8_channel_layer, _fp8_channel_float64, "float64 W8A8 per-token MoE",
        quantizes_activations=True,
    ),
    FormatCheck(
        FP8_BLOCK_SCALED, REFERENCE_FP8_BLOCK, quantize_fp8_block_layer, _fp8_block_float64, "float64 W8A8 1x128-group MoE",
        lambda config: fp8_block_size_refusal(config.hidden_size, config.intermediate_size_per_partition),
        quantizes_activations=True,
    ),
    FormatCheck(
        MXFP4, REFERENCE_MXFP4, _mxfp4_weights, _mxfp4_float64, "float64 MoE, dequantized", _mxfp4_size_refusal,
        holds_biases=True,
    ),
)
"""The formats ``moe-core check`` knows how to check; a new format adds one entry."""


def unchecked_formats(backends: Sequence[BackendEntry]) -> list[CheckRow]:
    """A skipped row for each format a backend converts from that no check covers."""
    known = {id(check.format) for check in FORMAT_CHECKS}
    return [
        CheckRow(fmt.name, backend.name, "-", None, None, None, None, f"skipped: no check for the {fmt.name} format")
        for backend in backends
        for fmt in backend.formats
        if id(fmt) not in known
    ]
