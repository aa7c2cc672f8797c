"""The FlashInfer adapters, end to end on the CPU, against pure-PyTorch models of FlashInfer's kernels.

No machine here runs the FP4 kernels (they need Blackwell), so the adapters'
conversions and calls are proven against models of the kernels' contracts
(``tests/kernel_models``): each model has the installed function's signature
(checked here), refuses what the real launcher refuses, and computes what the
kernel computes. Every call an adapter makes is also bound to the installed
function's ``inspect.signature``, so a signature change in FlashInfer fails
this file.

Tolerances (relative l2 error against the reference backend on the same
canonical weights): both sides compute in float32 and round the output to
bf16, and the FP4 requantization of the activation may round a code the
other way where the two compute a block's values in another order; in-kernel
routing also rounds the routing weights to bf16. Worst over 160 draws of
these shapes: routed TRT-LLM 1.8e-4, CUTLASS NVFP4 1.1e-3, in-kernel routing
3.9e-3; bounds 3e-3 and 1e-2. The CUTLASS kernel writes GEMM1's output (and,
for bf16 and NVFP4 experts, the gated activation) in bf16 before going on
(see its model), which moves the NVFP4 output 2.0e-2 to 4.7e-2 from the
unrounded reference (24 draws); its expected values
(:func:`cutlass_rounded_reference`) round at the same points, leaving up to
4.7e-4.

One more difference is not bounded by a tolerance: where a block of the gated
activation has ``g * amax / 6`` at (or within a few float32 ulps of) an E4M3
rounding midpoint, the block scale rounds to one neighbour or the other
depending on GEMM1's float32 evaluation order (the model accumulates in the
kernel's units, the reference in dequantized ones, and a batched matmul
rounds a row differently from a lone one), and the whole block's FP4 codes
follow it: up to ~10% of that token's output (``MOE_CORE_SEED=1707975378``:
one block at 116 = (112 + 120) / 2, 9.8e-3 of a 37-token batch).
:func:`trtllm_error` leaves out the tokens with such a block; :func:`cutlass_error` those whose FP4 values
tip with GEMM1's float32 output (CUTLASS also rounds it to bf16 first, a second place an ulp decides).
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable
from typing import Any, TypeVar

import attrs
import pytest
import torch

pytest.importorskip("flashinfer", reason="the flashinfer extra is not installed")

from flashinfer import fp4_quantize as real_fp4_quantize
from flashinfer.fused_moe import (
    cutlass_fused_moe as real_cutlass_fused_moe,
    trtllm_fp4_block_scale_moe as real_logits_moe,
    trtllm_fp4_block_scale_routed_moe as real_routed_moe,
)
from flashinfer.tllm_enums import ActivationType, RoutingMethodType, SfLayout

from moe_core import (
    BackendKey,
    DenseMoeWeights,
    ExpertFp8Scales,
    Fp8ExpertWeights,
    Fp8GateUpWeights,
    Fp8MoeWeights,
    GateUpScalePolicy,
    LinearBlockScales,
    MoeRunnerConfig,
    Nvfp4ExpertWeights,
    Nvfp4GateUpWeights,
    Nvfp4MoeWeights,
    RoutingMethod,
    StandardDispatchOutput,
    TopKOutput,
    create_runner,
    select_experts,
)
from moe_core.backends._flashinfer import BackendUnavailableError, FlashinferApiError, require_parameters
from moe_core.backends.flashinfer_cutlass import FLASHINFER_CUTLASS_BF16, FLASHINFER_CUTLASS_FP8, FLASHINFER_CUTLASS_NVFP4
from moe_core.backends.flashinfer_cutlass.kernel import CutlassKernels
from moe_core.backends.flashinfer_cutlass.quant_info import CutlassBf16Weights, CutlassFp8Weights, CutlassNvfp4Weights
from moe_core.backends.flashinfer_cutlass.runner import CutlassRunner
from moe_core.backends.flashinfer_trtllm_fp4 import FLASHINFER_TRTLLM_FP4
from moe_core.backends.flashinfer_trtllm_fp4.kernel import TrtllmFp4Kernels, load_kernels
from moe_core.backends.flashinfer_trtllm_fp4.quant_info import TrtllmFp4Weights
from moe_core.backends.flashinfer_trtllm_fp4.runner import TrtllmFp4Runner
from moe_core.backends.reference import REFERENCE_DENSE, REFERENCE_NVFP4
from moe_core.capability import DeviceSpec, LayerSpec
from moe_core.check import relative_error
from moe_core.formats import DenseRecipe, Fp8Recipe, Nvfp4Recipe
from moe_core.formats.reference import ReferenceRecipe, run_experts
from moe_core.runner import QuantInfo
from moe_core.synthetic import quantize_fp8_layer, quantize_nvfp4_layer, random_dense_layer
from tests.kernel_models import cutlass_fused_moe as cutlass_model
from tests.kernel_models import trtllm_fp4 as trtllm_model
from tests.kernel_models.nvfp4_layouts import unswizzle
from tests.one_scale_layers import fp8_shared_scale, nvfp4_shared_scale

W = TypeVar("W", bound=QuantInfo)

TOLERANCE = 3e-3
"""Relative l2 error of an adapter on its kernel's model against the reference (see the module docstring)."""

ROUTING_TOLERANCE = 1e-2
"""The same where the kernel routes (bf16 routing weights)."""

BF16_ROUNDING_POINTS = 5e-3
"""The CUTLASS NVFP4 model's distance from the unrounded reference must exceed this: its bf16 GEMM1 output and
activation tip FP4 codes of the activation (measured 2.0e-2 to 4.7e-2 on random layers of these shapes)."""

MISTAKE = 0.3
"""An injected mistake must move the output at least this far from the reference."""

CPU = torch.device("cpu")

SHAPES = [
    # (tokens, experts, top_k, hidden, inter, local experts, offset)
    (1, 4, 1, 128, 128, 4, 0),
    (37, 8, 2, 256, 128, 8, 0),
    (19, 16, 8, 128, 256, 8, 8),
    (64, 8, 4, 256, 128, 4, 0),
]


def _signature_rows(function: Callable[..., object]) -> list[tuple[str, str, object]]:
    """Each parameter's name, kind and default, non-literal defaults by type name."""
    rows = []
    for parameter in inspect.signature(function).parameters.values():
        default = parameter.default
        if default is not inspect.Parameter.empty and not isinstance(default, (bool, int, float, str, type(None))):
            default = "non-literal default"
        rows.append((parameter.name, parameter.kind.name, default))
    return rows


@pytest.mark.parametrize(
    ("model", "real"),
    [
        (trtllm_model.trtllm_fp4_block_scale_routed_moe, real_routed_moe),
        (trtllm_model.trtllm_fp4_block_scale_moe, real_logits_moe),
        (trtllm_model.fp4_quantize, real_fp4_quantize),
        (cutlass_model.cutlass_fused_moe, real_cutlass_fused_moe),
    ],
    ids=lambda f: getattr(f, "__name__", "?"),
)
def test_model_has_the_installed_signature(model: Callable[..., object], real: Callable[..., object]) -> None:
    assert _signature_rows(model) == _signature_rows(real)


@attrs.define
class Recorder:
    """Wraps a model; binds each call to the real function's signature first (a drift raises TypeError here)."""

    model: Callable[..., Any]
    real: Callable[..., object]
    calls: list[inspect.BoundArguments] = attrs.field(factory=list)

    def __call__(self, *args: object, **kwargs: object) -> Any:
        self.calls.append(inspect.signature(self.real).bind(*args, **kwargs))
        return self.model(*args, **kwargs)


def trtllm_model_kernels() -> TrtllmFp4Kernels:
    """The real kernels' enums and optional keywords, with the models in place of the functions, each recorded."""
    real = load_kernels()
    return attrs.evolve(
        real,
        quantize=Recorder(trtllm_model.fp4_quantize, real_fp4_quantize),
        routed_moe=Recorder(trtllm_model.trtllm_fp4_block_scale_routed_moe, real_routed_moe),
        logits_moe=Recorder(trtllm_model.trtllm_fp4_block_scale_moe, real_logits_moe),
    )


def cutlass_model_kernels() -> CutlassKernels:
    """The CUTLASS model, recorded, with the release's SwiGLU member."""
    return CutlassKernels(fused_moe=Recorder(cutlass_model.cutlass_fused_moe, real_cutlass_fused_moe), swiglu=ActivationType.Swiglu)


def layer(
    shape: tuple[int, int, int, int, int, int, int], gen: torch.Generator, routing: RoutingMethod = RoutingMethod.TOPK_RENORMALIZE
) -> tuple[MoeRunnerConfig, DenseMoeWeights, Nvfp4MoeWeights, StandardDispatchOutput]:
    tokens, experts, top_k, hidden, inter, local, offset = shape
    config = MoeRunnerConfig(
        num_experts=experts, hidden_size=hidden, intermediate_size_per_partition=inter, top_k=top_k,
        num_local_experts=local, local_expert_offset=offset, routing_method=routing,
    )
    seed = int(torch.randint(0, 2**31, (1,), generator=gen))
    dense, dispatch = random_dense_layer(config, tokens, torch.bfloat16, CPU, seed)
    return config, dense, quantize_nvfp4_layer(config, dense, dispatch), without_logits(dispatch)


def without_logits(dispatch: StandardDispatchOutput) -> StandardDispatchOutput:
    """The same batch and routing without its router logits, so the TRT-LLM runner takes the routed kernel."""
    topk = dispatch.topk
    return StandardDispatchOutput(dispatch.hidden_states, TopKOutput(topk.topk_ids, topk.topk_weights, num_experts=topk.num_experts))


def nvfp4_reference(config: MoeRunnerConfig, weights: Nvfp4MoeWeights, dispatch: StandardDispatchOutput) -> torch.Tensor:
    return create_runner(REFERENCE_NVFP4, config).run(dispatch, weights)


def scale_tie_tokens(config: MoeRunnerConfig, weights: Nvfp4MoeWeights, dispatch: StandardDispatchOutput) -> torch.Tensor:
    """bool ``[T]``: tokens with a gated-activation block whose E4M3 scale input ``g * amax / 6`` lies within a relative
    ``4 * H * 2**-24`` of an E4M3 rounding boundary, in the reference's arithmetic.

    Two float32 evaluations of GEMM1 (an ``H``-term dot product each for gate and up, then a few scalar roundings)
    differ by at most about ``2 * H * 2**-24`` relative where the terms do not cancel, which they do not at a
    block's largest element; twice that is the margin. Such a block's scale (and so its codes) is either neighbour:
    both are right. Decided from the reference alone, so a mistake in the code under test cannot hide here; 1 to 2
    blocks in 1e3 qualify at H = 256, half that at H = 128.
    """
    recipe, gs = Nvfp4Recipe(), weights.w2_input_scale.value.reshape(())
    margin = 4 * config.hidden_size * 2.0**-24
    hidden, ids = dispatch.hidden_states, dispatch.topk.topk_ids
    tied = torch.zeros(hidden.shape[0], dtype=torch.bool, device=hidden.device)
    for local in range(config.num_local_experts):
        tokens = torch.nonzero(ids == config.local_expert_offset + local, as_tuple=True)[0]
        if tokens.numel() == 0:
            continue
        x = recipe.quantize_input(weights, local, hidden[tokens].float())
        h = config.activation.apply(x @ recipe.gate_up(weights, local).T)
        pre = gs * (h.reshape(h.shape[0], -1, 16).abs().amax(-1) / 6.0)
        low, high = ((pre * f).clamp(max=448.0).to(torch.float8_e4m3fn).float() for f in (1 - margin, 1 + margin))
        tied[tokens[(low != high).any(-1)]] = True
    return tied


def trtllm_error(out: torch.Tensor, config: MoeRunnerConfig, weights: Nvfp4MoeWeights, dispatch: StandardDispatchOutput) -> float:
    """:func:`relative_error` against ``reference-nvfp4`` over the tokens without an activation scale at a tie
    (:func:`scale_tie_tokens`; a single token or up to half of them may be left out, 0.0 where none is left)."""
    tied = scale_tie_tokens(config, weights, dispatch)
    assert int(tied.sum()) <= max(1, tied.numel() // 2), f"{int(tied.sum())} of {tied.numel()} tokens at a scale tie"
    if bool(tied.all()):
        return 0.0
    return relative_error(out[~tied], nvfp4_reference(config, weights, dispatch)[~tied])


def cutlass_rounded_reference(
    recipe: ReferenceRecipe[W], config: MoeRunnerConfig, weights: W, dispatch: StandardDispatchOutput, *, activation_in_bf16: bool
) -> torch.Tensor:
    """A reference forward (``recipe``: the format's weights and input quantization, moe_core's numerics, not the
    model's) with the CUTLASS kernel's bf16 rounding points: GEMM1's output, and with ``activation_in_bf16`` the gated
    activation (bf16 and NVFP4 experts; FP8 quantizes it from float)."""

    def mlp(expert: int, x: torch.Tensor) -> torch.Tensor:
        acc1 = (recipe.quantize_input(weights, expert, x) @ recipe.gate_up(weights, expert).T).to(torch.bfloat16).float()
        h = config.activation.apply(acc1)
        if activation_in_bf16:
            h = h.to(torch.bfloat16).float()
        return recipe.quantize_hidden(weights, expert, h) @ recipe.down(weights, expert).T

    return run_experts(config, dispatch, weights, mlp)


def cutlass_nvfp4_reference(config: MoeRunnerConfig, weights: Nvfp4MoeWeights, dispatch: StandardDispatchOutput) -> torch.Tensor:
    """``reference-nvfp4`` with the CUTLASS kernel's two bf16 rounding points."""
    return cutlass_rounded_reference(Nvfp4Recipe(), config, weights, dispatch, activation_in_bf16=True)


def cutlass_tie_tokens(config: MoeRunnerConfig, weights: Nvfp4MoeWeights, dispatch: StandardDispatchOutput) -> torch.Tensor:
    """bool ``[T]``: tokens whose GEMM2-input FP4 values, in :func:`cutlass_nvfp4_reference`'s arithmetic, change when
    GEMM1's float32 output moves by a relative ``4 * H * 2**-24`` (the margin of :func:`scale_tie_tokens`).

    CUTLASS rounds GEMM1's output and the activation to bf16 before quantizing: a float32 result an ulp or two
    from a bf16 midpoint rounds either way, and where that bf16 ulp tips an FP4 code or a block scale, either
    neighbour is right. Decided from the reference alone (GEMM1 scaled by ``1 -+ margin`` and quantized as the
    reference does), so a mistake in the code under test cannot hide here; a quarter to half of the tokens qualify.
    """
    recipe, margin = Nvfp4Recipe(), 4 * config.hidden_size * 2.0**-24
    hidden, ids = dispatch.hidden_states, dispatch.topk.topk_ids
    tied = torch.zeros(hidden.shape[0], dtype=torch.bool, device=hidden.device)
    for local in range(config.num_local_experts):
        tokens = torch.nonzero(ids == config.local_expert_offset + local, as_tuple=True)[0]
        if tokens.numel() == 0:
            continue
        acc1 = recipe.quantize_input(weights, local, hidden[tokens].float()) @ recipe.gate_up(weights, local).T
        quantized = [
            recipe.quantize_hidden(
                weights, local, config.activation.apply((acc1 * f).to(torch.bfloat16).float()).to(torch.bfloat16).float()
            )
            for f in (1 - margin, 1.0, 1 + margin)
        ]
        moved = ((quantized[0] != quantized[1]) | (quantized[2] != quantized[1])).any(dim=1)
        tied[tokens[moved]] = True
    return tied


def cutlass_error(out: torch.Tensor, config: MoeRunnerConfig, weights: Nvfp4MoeWeights, dispatch: StandardDispatchOutput) -> float:
    """:func:`relative_error` against :func:`cutlass_nvfp4_reference` over the tokens without a rounding tie
    (:func:`cutlass_tie_tokens`; a token at top-8 has eight experts' blocks to tie in, so up to three quarters of
    them, or one, may be left out)."""
    tied = cutlass_tie_tokens(config, weights, dispatch)
    assert int(tied.sum()) <= max(1, 3 * tied.numel() // 4), f"{int(tied.sum())} of {tied.numel()} tokens at a rounding tie"
    if bool(tied.all()):
        return 0.0
    return relative_error(out[~tied], cutlass_nvfp4_reference(config, weights, dispatch)[~tied])


LAYER_128 = MoeRunnerConfig(num_experts=8, hidden_size=128, intermediate_size_per_partition=128, top_k=2)


def expect_refusal(key: BackendKey[Any], cpu_reasons: str) -> None:
    """``create_runner`` raises with the backend's reasons for the current device (``cpu_reasons`` on the CPU)."""
    device = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else CPU
    reasons = key.supports(DeviceSpec.of(device), LayerSpec(LAYER_128, key.formats[0])).describe() if device.type == "cuda" else cpu_reasons
    with pytest.raises(BackendUnavailableError, match=re.escape(f"{key.name} cannot run on {device}: {reasons}")):
        create_runner(key, LAYER_128)


class TestTrtllmFp4:
    """``flashinfer-trtllm-fp4``: the conversion and runner on the kernels' models, against ``reference-nvfp4``."""

    @pytest.mark.parametrize("shape", SHAPES, ids=str)
    def test_routed_matches_reference(self, shape: tuple[int, int, int, int, int, int, int], gen: torch.Generator) -> None:
        config, _, weights, dispatch = layer(shape, gen)
        kernels = trtllm_model_kernels()
        out = TrtllmFp4Runner(config, kernels=kernels).run(dispatch, TrtllmFp4Weights.from_nvfp4(weights))
        assert out.dtype == dispatch.hidden_states.dtype and out.shape == dispatch.hidden_states.shape
        assert trtllm_error(out, config, weights, dispatch) < TOLERANCE
        assert isinstance(kernels.routed_moe, Recorder) and len(kernels.routed_moe.calls) == 1
        if "hidden_states_scale_layout" in inspect.signature(real_routed_moe).parameters:  # 0.7 declares the layout
            assert kernels.routed_moe.calls[0].arguments["hidden_states_scale_layout"] == SfLayout.layout_linear

    @pytest.mark.parametrize("routing", list(RoutingMethod), ids=lambda r: r.value)
    @pytest.mark.parametrize("shape", SHAPES[1:3], ids=str)
    def test_kernel_routing_matches_reference(
        self, shape: tuple[int, int, int, int, int, int, int], routing: RoutingMethod, gen: torch.Generator
    ) -> None:
        config, _, weights, routed = layer(shape, gen, routing)
        dispatch = StandardDispatchOutput(routed.hidden_states, select_experts(torch.randn(routed.topk.num_tokens, config.num_experts, generator=gen), config))
        kernels = trtllm_model_kernels()
        out = TrtllmFp4Runner(config, kernels=kernels).run(dispatch, TrtllmFp4Weights.from_nvfp4(weights))
        assert isinstance(kernels.logits_moe, Recorder) and len(kernels.logits_moe.calls) == 1
        expected_method = {RoutingMethod.SOFTMAX_TOPK: RoutingMethodType.Default, RoutingMethod.TOPK_RENORMALIZE: RoutingMethodType.Renormalize}
        assert kernels.logits_moe.calls[0].arguments["routing_method_type"] == expected_method[routing].value
        assert trtllm_error(out, config, weights, dispatch) < ROUTING_TOLERANCE

    def test_a_top_k_edited_after_routing_runs_as_given(self, gen: torch.Generator) -> None:
        """A top-k that carries router logits but is not select_experts' own of them (an engine's remap, a capacity
        drop): the kernel runs its ids and weights, never routing again from the logits."""
        config, _, weights, routed = layer((37, 8, 2, 256, 128, 8, 0), gen)
        other = select_experts(torch.randn(37, 8, generator=gen), config)
        assert not torch.equal(other.topk_ids, routed.topk.topk_ids)
        edited = TopKOutput(routed.topk.topk_ids, routed.topk.topk_weights, other.router_logits, num_experts=8,
                            from_router_logits=False)
        dispatch = StandardDispatchOutput(routed.hidden_states, edited)
        kernels = trtllm_model_kernels()
        out = TrtllmFp4Runner(config, kernels=kernels).run(dispatch, TrtllmFp4Weights.from_nvfp4(weights))
        assert isinstance(kernels.routed_moe, Recorder) and len(kernels.routed_moe.calls) == 1
        assert isinstance(kernels.logits_moe, Recorder) and not kernels.logits_moe.calls
        assert trtllm_error(out, config, weights, dispatch) < TOLERANCE

    @pytest.mark.parametrize("top_k", range(1, 9))
    def test_every_top_k(self, top_k: int, gen: torch.Generator) -> None:
        config, _, weights, dispatch = layer((13, 8, top_k, 128, 128, 8, 0), gen)
        out = TrtllmFp4Runner(config, kernels=trtllm_model_kernels()).run(dispatch, TrtllmFp4Weights.from_nvfp4(weights))
        assert trtllm_error(out, config, weights, dispatch) < TOLERANCE

    def test_differing_gate_and_up_scales_stay_exact(self, gen: torch.Generator) -> None:
        config, _, weights, dispatch = layer((37, 8, 2, 256, 128, 8, 0), gen)
        assert not torch.equal(weights.w13.gate.global_scales.value, weights.w13.up.global_scales.value)
        out = TrtllmFp4Runner(config, kernels=trtllm_model_kernels()).run(dispatch, TrtllmFp4Weights.from_nvfp4(weights))
        assert trtllm_error(out, config, weights, dispatch) < TOLERANCE

    def test_wrong_fc1_half_order_is_caught(self, gen: torch.Generator) -> None:
        config, _, weights, dispatch = layer((37, 8, 2, 256, 128, 8, 0), gen)
        swapped = attrs.evolve(weights, w13=Nvfp4GateUpWeights(gate=weights.w13.up, up=weights.w13.gate))
        out = TrtllmFp4Runner(config, kernels=trtllm_model_kernels()).run(dispatch, TrtllmFp4Weights.from_nvfp4(swapped))
        assert relative_error(out, nvfp4_reference(config, weights, dispatch)) > MISTAKE

    @pytest.mark.parametrize("logits", [False, True], ids=["routed", "kernel-routed"])
    def test_routed_scaling_factor_goes_inside_the_kernel(self, logits: bool, gen: torch.Generator) -> None:
        """Folded into FC2's output scalar (the kernel ignores its own ``routed_scaling_factor`` for these routing
        methods): the output matches the reference with the factor, and nothing is multiplied after the kernel."""
        config, _, weights, routed = layer((37, 8, 2, 256, 128, 8, 0), gen)
        config = attrs.evolve(config, routed_scaling_factor=2.5)
        dispatch = StandardDispatchOutput(routed.hidden_states, select_experts(torch.randn(37, 8, generator=gen), config)) if logits else routed
        kernels = trtllm_model_kernels()
        quant_info = TrtllmFp4Weights.from_nvfp4(weights)
        out = TrtllmFp4Runner(config, kernels=kernels).run(dispatch, quant_info)
        assert trtllm_error(out, config, weights, dispatch) < (ROUTING_TOLERANCE if logits else TOLERANCE)
        recorder = kernels.logits_moe if logits else kernels.routed_moe
        assert isinstance(recorder, Recorder) and len(recorder.calls) == 1
        call = recorder.calls[0]
        assert call.arguments["routed_scaling_factor"] is None
        assert torch.equal(call.arguments["output2_scale_scalar"], quant_info.output2_scale_scalar.value * 2.5)
        call.arguments["output"] = None
        kernel_out = (trtllm_model.trtllm_fp4_block_scale_moe if logits else trtllm_model.trtllm_fp4_block_scale_routed_moe)(*call.args, **call.kwargs)[0]
        assert torch.equal(kernel_out, out), "the kernel's output is the result: nothing multiplied after it"

    def test_the_kernels_own_routed_scaling_factor_is_ignored_for_renormalize(self, gen: torch.Generator) -> None:
        """Why the runner folds the factor: passed as the kernel's argument, Renormalize routing drops it."""
        _, _, _, call = self._recorded_call(gen, 37)
        unscaled = trtllm_model.trtllm_fp4_block_scale_routed_moe(*call.args, **call.kwargs)[0]
        call.arguments["routed_scaling_factor"] = 2.5
        call.arguments["output"] = None
        assert torch.equal(trtllm_model.trtllm_fp4_block_scale_routed_moe(*call.args, **call.kwargs)[0], unscaled)

    def test_per_expert_input_scale_is_refused(self) -> None:
        per_expert = torch.full((8,), 100.0)
        with pytest.raises(ValueError, match="global_scale must be one float32 value, got torch.float32 \\(8,\\)"):
            trtllm_model.fp4_quantize(torch.randn(4, 128, dtype=torch.bfloat16), per_expert, 16, False, False)

    def _recorded_call(self, gen: torch.Generator, tokens: int) -> tuple[MoeRunnerConfig, Nvfp4MoeWeights, StandardDispatchOutput, inspect.BoundArguments]:
        config, _, weights, dispatch = layer((tokens, 8, 2, 256, 128, 8, 0), gen)
        kernels = trtllm_model_kernels()
        TrtllmFp4Runner(config, kernels=kernels).run(dispatch, TrtllmFp4Weights.from_nvfp4(weights))
        assert isinstance(kernels.routed_moe, Recorder)
        return config, weights, dispatch, kernels.routed_moe.calls[0]

    def test_swizzled_activation_scales_are_refused(self, gen: torch.Generator) -> None:
        if "hidden_states_scale_layout" not in inspect.signature(real_routed_moe).parameters:
            pytest.skip("this flashinfer release takes no hidden_states_scale_layout")
        _, _, _, call = self._recorded_call(gen, 37)
        call.arguments["hidden_states_scale_layout"] = SfLayout.layout_128x4
        with pytest.raises(NotImplementedError, match="linear layout only"):
            trtllm_model.trtllm_fp4_block_scale_routed_moe(*call.args, **call.kwargs)
        call.arguments["hidden_states_scale_layout"] = SfLayout.layout_linear
        linear = call.arguments["hidden_states_scale"]
        padded = torch.zeros((128, linear.shape[1]), dtype=torch.uint8)
        padded[:37] = linear.view(torch.uint8)
        call.arguments["hidden_states_scale"] = padded.view(torch.float8_e4m3fn)
        with pytest.raises(ValueError, match="hidden_states_scale must hold \\[37, 16\\] linear scales"):
            trtllm_model.trtllm_fp4_block_scale_routed_moe(*call.args, **call.kwargs)

    def test_swizzled_scales_declared_linear_give_garbage(self, gen: torch.Generator) -> None:
        """At 128 tokens a 128x4-swizzled buffer has the linear size: only the declared layout tells them apart."""
        config, weights, dispatch, call = self._recorded_call(gen, 128)
        linear = call.arguments["hidden_states_scale"]
        call.arguments["hidden_states_scale"] = LinearBlockScales.from_checkpoint(linear).swizzle()._tiles
        out = trtllm_model.trtllm_fp4_block_scale_routed_moe(*call.args, **call.kwargs)[0]
        assert relative_error(out, nvfp4_reference(config, weights, dispatch)) > MISTAKE

    def test_output_scalars_in_the_wrong_slots_are_caught(self, gen: torch.Generator) -> None:
        config, weights, dispatch, call = self._recorded_call(gen, 37)
        gate, up = call.arguments["output1_scale_gate_scalar"], call.arguments["output1_scale_scalar"]
        call.arguments["output1_scale_gate_scalar"], call.arguments["output1_scale_scalar"] = up, gate
        out = trtllm_model.trtllm_fp4_block_scale_routed_moe(*call.args, **call.kwargs)[0]
        assert relative_error(out, nvfp4_reference(config, weights, dispatch)) > MISTAKE

    def test_create_runner_says_why_not_here(self) -> None:
        expect_refusal(FLASHINFER_TRTLLM_FP4, "needs a CUDA GPU of SM100 or SM103, not cpu; no TRT-LLM-gen cubins")

    def test_unaligned_sizes_are_refused(self, gen: torch.Generator) -> None:
        config, _, weights, _ = layer((4, 4, 2, 128, 64, 4, 0), gen)
        with pytest.raises(ValueError, match="intermediate_size must be a multiple of 128, got 64"):
            TrtllmFp4Weights.from_nvfp4(weights)
        with pytest.raises(ValueError, match="intermediate_size_per_partition must be a multiple of 128, got 64"):
            TrtllmFp4Runner(config, kernels=trtllm_model_kernels())


class TestCutlass:
    """``flashinfer-cutlass-bf16`` and ``-nvfp4``: conversions and runner on the kernel's model, against the references."""

    @pytest.mark.parametrize("shape", SHAPES, ids=str)
    def test_bf16_matches_reference(self, shape: tuple[int, int, int, int, int, int, int], gen: torch.Generator) -> None:
        config, dense, _, dispatch = layer(shape, gen)
        kernels = cutlass_model_kernels()
        out = CutlassRunner[CutlassBf16Weights](config, kernels=kernels).run(dispatch, CutlassBf16Weights.from_dense(dense))
        rounded = DenseMoeWeights(w13=dense.w13.to(torch.bfloat16), w2=dense.w2.to(torch.bfloat16))
        expected = cutlass_rounded_reference(DenseRecipe(), config, rounded, dispatch, activation_in_bf16=True)
        assert relative_error(out, expected) < TOLERANCE
        assert isinstance(kernels.fused_moe, Recorder) and kernels.fused_moe.calls[0].arguments["ep_rank"] == shape[6] // shape[5]

    @pytest.mark.parametrize("shape", SHAPES, ids=str)
    def test_nvfp4_matches_reference(self, shape: tuple[int, int, int, int, int, int, int], gen: torch.Generator) -> None:
        config, _, weights, dispatch = layer(shape, gen)
        out = CutlassRunner[CutlassNvfp4Weights](config, kernels=cutlass_model_kernels()).run(
            dispatch, CutlassNvfp4Weights.from_nvfp4_rescaled(weights)
        )
        assert cutlass_error(out, config, nvfp4_shared_scale(weights), dispatch) < TOLERANCE

    @pytest.mark.parametrize("shape", SHAPES[1:], ids=str)
    def test_nvfp4_rounds_gemm1_and_the_activation_to_bf16(
        self, shape: tuple[int, int, int, int, int, int, int], gen: torch.Generator
    ) -> None:
        """The two bf16 rounding points are in the model: without them the reference is far off (the activation's FP4
        codes tip), with them it agrees to :data:`TOLERANCE`."""
        config, _, weights, dispatch = layer(shape, gen)
        out = CutlassRunner[CutlassNvfp4Weights](config, kernels=cutlass_model_kernels()).run(
            dispatch, CutlassNvfp4Weights.from_nvfp4_rescaled(weights)
        )
        shared = nvfp4_shared_scale(weights)
        assert cutlass_error(out, config, shared, dispatch) < TOLERANCE
        assert relative_error(out, nvfp4_reference(config, shared, dispatch)) > BF16_ROUNDING_POINTS

    @pytest.mark.parametrize("shape", SHAPES, ids=str)
    def test_fp8_matches_reference(self, shape: tuple[int, int, int, int, int, int, int], gen: torch.Generator) -> None:
        config, dense, _, dispatch = layer(shape, gen)
        weights = quantize_fp8_layer(config, dense, dispatch)
        kernels = cutlass_model_kernels()
        out = CutlassRunner[CutlassFp8Weights](config, kernels=kernels).run(dispatch, CutlassFp8Weights.from_fp8(weights))
        expected = cutlass_rounded_reference(Fp8Recipe(), config, fp8_shared_scale(weights), dispatch, activation_in_bf16=False)
        assert relative_error(out, expected) < TOLERANCE
        assert isinstance(kernels.fused_moe, Recorder)
        assert kernels.fused_moe.calls[0].arguments["input"].dtype == torch.float8_e4m3fn

    def test_nvfp4_equal_scales_are_exact_without_rescaling(self, gen: torch.Generator) -> None:
        config, _, weights, dispatch = layer((37, 8, 2, 256, 128, 8, 0), gen)
        equal = nvfp4_shared_scale(weights)
        quant_info = CutlassNvfp4Weights.from_nvfp4(equal, gate_up=GateUpScalePolicy.REQUIRE_EQUAL)
        out = CutlassRunner[CutlassNvfp4Weights](config, kernels=cutlass_model_kernels()).run(dispatch, quant_info)
        assert cutlass_error(out, config, equal, dispatch) < TOLERANCE
        with pytest.raises(ValueError, match="gate and up global scales differ"):
            CutlassNvfp4Weights.from_nvfp4(weights, gate_up=GateUpScalePolicy.REQUIRE_EQUAL)

    def test_a_top_k_edited_after_routing_runs_as_given(self, gen: torch.Generator) -> None:
        """A top-k that carries router logits but is not select_experts' own of them (an engine's remap, a capacity
        drop): the kernel runs its ids and weights, never routing again from the logits."""
        config, _, weights, routed = layer((37, 8, 2, 256, 128, 8, 0), gen)
        other = select_experts(torch.randn(37, 8, generator=gen), config)
        assert not torch.equal(other.topk_ids, routed.topk.topk_ids)
        edited = TopKOutput(routed.topk.topk_ids, routed.topk.topk_weights, other.router_logits, num_experts=8,
                            from_router_logits=False)
        dispatch = StandardDispatchOutput(routed.hidden_states, edited)
        kernels = trtllm_model_kernels()
        out = TrtllmFp4Runner(config, kernels=kernels).run(dispatch, TrtllmFp4Weights.from_nvfp4(weights))
        assert isinstance(kernels.routed_moe, Recorder) and len(kernels.routed_moe.calls) == 1
        assert isinstance(kernels.logits_moe, Recorder) and not kernels.logits_moe.calls
        assert trtllm_error(out, config, weights, dispatch) < TOLERANCE

    @pytest.mark.parametrize("top_k", range(1, 9))
    def test_every_top_k(self, top_k: int, gen: torch.Generator) -> None:
        config, _, weights, dispatch = layer((13, 8, top_k, 128, 128, 8, 0), gen)
        out = CutlassRunner[CutlassNvfp4Weights](config, kernels=cutlass_model_kernels()).run(
            dispatch, CutlassNvfp4Weights.from_nvfp4_rescaled(weights)
        )
        assert cutlass_error(out, config, nvfp4_shared_scale(weights), dispatch) < TOLERANCE

    def test_wrong_fc1_half_order_is_caught(self, gen: torch.Generator) -> None:
        config, dense, _, dispatch = layer((37, 8, 2, 256, 128, 8, 0), gen)
        gate, up = dense.w13.chunk(2, dim=1)
        swapped = DenseMoeWeights(w13=torch.cat((up, gate), dim=1), w2=dense.w2)
        out = CutlassRunner[CutlassBf16Weights](config, kernels=cutlass_model_kernels()).run(dispatch, CutlassBf16Weights.from_dense(swapped))
        assert relative_error(out, create_runner(REFERENCE_DENSE, config).run(dispatch, dense)) > MISTAKE

    def _recorded_nvfp4_call(self, gen: torch.Generator) -> tuple[MoeRunnerConfig, Nvfp4MoeWeights, StandardDispatchOutput, inspect.BoundArguments]:
        config, _, weights, dispatch = layer((37, 8, 2, 256, 128, 8, 0), gen)
        kernels = cutlass_model_kernels()
        CutlassRunner[CutlassNvfp4Weights](config, kernels=kernels).run(dispatch, CutlassNvfp4Weights.from_nvfp4_rescaled(weights))
        assert isinstance(kernels.fused_moe, Recorder)
        return config, nvfp4_shared_scale(weights), dispatch, kernels.fused_moe.calls[0]

    def test_one_element_input_scale_is_refused(self, gen: torch.Generator) -> None:
        """The kernel takes a 0-d scalar or one per expert: a ``[1]`` tensor (our scale's storage) is neither."""
        _, _, _, call = self._recorded_nvfp4_call(gen)
        call.arguments["quant_scales"][0] = call.arguments["quant_scales"][0].reshape(1)
        with pytest.raises(ValueError, match="fc1 act global must be scalar or \\(num_experts_on_rank,\\) = \\(8,\\), got \\(1,\\)"):
            cutlass_model.cutlass_fused_moe(*call.args, **call.kwargs)

    def test_linear_weight_scales_give_garbage(self, gen: torch.Generator) -> None:
        config, weights, dispatch, call = self._recorded_nvfp4_call(gen)
        swizzled = call.arguments["quant_scales"][1]
        rows, blocks = swizzled.shape[1], swizzled.shape[2] * 4
        call.arguments["quant_scales"][1] = unswizzle(swizzled.view(torch.uint8), rows, blocks).contiguous().view(torch.int32)
        out = cutlass_model.cutlass_fused_moe(*call.args, **call.kwargs)
        assert relative_error(out, cutlass_nvfp4_reference(config, weights, dispatch)) > MISTAKE

    def test_uneven_expert_slices_are_refused(self) -> None:
        config = MoeRunnerConfig(num_experts=8, hidden_size=128, intermediate_size_per_partition=128, top_k=2, num_local_experts=3, local_expert_offset=2)
        with pytest.raises(ValueError, match="local experts \\[2, 5\\) of 8 are not one of 8/3 equal slices"):
            CutlassRunner[CutlassBf16Weights](config, kernels=cutlass_model_kernels())
        for key in (FLASHINFER_CUTLASS_NVFP4, FLASHINFER_CUTLASS_BF16, FLASHINFER_CUTLASS_FP8):  # refused at selection
            reasons = key.supports(DeviceSpec.parse("sm100+flashinfer"), LayerSpec(config, key.formats[0])).reasons
            assert any("are not one of 8/3 equal slices" in reason for reason in reasons), reasons

    def test_create_runner_says_why_not_here(self) -> None:
        expect_refusal(FLASHINFER_CUTLASS_NVFP4, "needs a CUDA GPU of SM100 or SM103 or SM110 or SM120 or SM121, not cpu")
        for key in (FLASHINFER_CUTLASS_BF16, FLASHINFER_CUTLASS_FP8):
            if torch.cuda.is_available():
                verdict = key.supports(DeviceSpec.of(torch.device("cuda")), LayerSpec(LAYER_128, key.formats[0]))
                assert verdict.ok == (torch.cuda.get_device_capability() >= (9, 0))
            else:
                expect_refusal(key, "needs a CUDA GPU of SM90 or later, not cpu")


def test_a_missing_keyword_names_the_installed_version() -> None:
    def older(input: torch.Tensor, token_selected_experts: torch.Tensor, ep_size: int = 1) -> None:
        """A release without ``output`` and ``activation_type``."""

    with pytest.raises(FlashinferApiError, match=r"older of the installed flashinfer 0\.\d+\.\d+\S* takes no output, activation_type; moe-core's adapter supports flashinfer-python>=0\.6\.18,<0\.8"):
        require_parameters(older, "older", ("ep_size", "output", "activation_type"))
