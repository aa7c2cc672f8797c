"""The Triton runner's kept binaries (:mod:`moe_core.backends.triton.launcher`): a repeated forward launches them
directly, with outputs equal bit for bit to Triton's own launches, and goes back through Triton wherever the kept
binary's specialization may not hold (a misaligned or strided caller tensor, another device, the interpreter).

On the CPU the site's logic runs on a stand-in kernel and binary; on CUDA the runner's real forwards do.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping

import pytest
import torch
import triton

from moe_core import MoeRunnerConfig, StandardDispatchOutput, select_experts
from moe_core.backends.triton import launch as launch_module
from moe_core.backends.triton import launcher as launcher_module
from moe_core.backends.triton import plans
from moe_core.backends.triton.configs import KernelConfig
from moe_core.backends.triton.launch import fused_moe
from moe_core.backends.triton.launcher import Grid, Launcher, LaunchSite
from moe_core.backends.triton.quant_info import TritonDenseWeights
from moe_core.formats.dense import ExpertBiases
from moe_core.backends.triton.runner import ForwardMemo, TritonRunner
from moe_core.registry import BoundRunner
from tests.test_triton import bound_forward, make_layer

CUDA = torch.cuda.is_available()


class StandInBinary:
    """What a site reads of a compiled kernel; records its direct launches."""

    function, packed_metadata = "function", "metadata"

    def __init__(self) -> None:
        self.launches: list[tuple[object, ...]] = []

    def _init_handles(self) -> None:
        """Nothing to load."""

    def run(self, *args: object) -> None:
        """A direct launch: grid, stream, function, metadata, launch metadata, two hooks, then every argument."""
        self.launches.append(args)

    def launch_metadata(self, grid: Grid, stream: int, *args: object) -> object:
        """No hook metadata."""
        return None


class StandInKernel:
    """A ``@triton.jit`` function's launch: records what Triton was asked, returns the binary."""

    arg_names = ["x", "n", "BLOCK"]

    def __init__(self, binary: object) -> None:
        self.binary = binary
        self.bound: list[tuple[Grid, tuple[object, ...], dict[str, object]]] = []

    def __getitem__(self, grid: Grid) -> Callable[..., object]:
        def bind(*args: object, **constexprs: object) -> object:
            self.bound.append((grid, args, constexprs))
            return self.binary

        return bind


@pytest.fixture
def stand_in(monkeypatch: pytest.MonkeyPatch) -> StandInKernel:
    """A stand-in kernel whose binary the site takes for a compiled one, on device 0."""
    monkeypatch.setattr(triton.compiler, "CompiledKernel", StandInBinary)
    monkeypatch.setattr(launcher_module, "_current_device", lambda: 0)
    monkeypatch.setattr(launcher_module, "_current_stream", lambda device: 7)
    return StandInKernel(StandInBinary())


DEVICE_0 = (0, 7)
"""Direct launches allowed, on device 0's stream 7."""


def statics(constexprs: Mapping[str, object] | None = None) -> Callable[[], tuple[Grid, Mapping[str, object]]]:
    """The stand-in's grid (3, 2) and constexprs."""
    return lambda: ((3, 2), {"BLOCK": 64, "num_warps": 4} if constexprs is None else constexprs)


def test_a_site_keeps_the_first_binary_and_launches_it_directly(stand_in: StandInKernel) -> None:
    site = LaunchSite()
    x = torch.randn(8)
    site.launch(stand_in, (x, 8), statics(), DEVICE_0)
    assert len(stand_in.bound) == 1 and site.kept
    site.launch(stand_in, (x, 9), statics(), DEVICE_0)
    assert len(stand_in.bound) == 1, "the second launch went through Triton"
    binary = stand_in.binary
    assert isinstance(binary, StandInBinary)
    assert binary.launches == [(3, 2, 1, 7, "function", "metadata", None, triton.knobs.runtime.launch_enter_hook,
                                triton.knobs.runtime.launch_exit_hook, x, 9, 64)]


def test_a_launch_that_may_not_be_direct_goes_through_triton(stand_in: StandInKernel) -> None:
    site, x = LaunchSite(), torch.randn(8)
    site.launch(stand_in, (x, 8), statics(), None)
    assert not site.kept, "a binary bound for a misaligned caller tensor is not kept"
    site.launch(stand_in, (x, 8), statics(), DEVICE_0)
    site.launch(stand_in, (x, 8), statics(), None)
    assert len(stand_in.bound) == 3 and site.kept


def test_another_device_goes_through_triton(stand_in: StandInKernel) -> None:
    site, x = LaunchSite(), torch.randn(8)
    site.launch(stand_in, (x, 8), statics(), DEVICE_0)
    site.launch(stand_in, (x, 8), statics(), (1, 7))
    assert len(stand_in.bound) == 2


def test_a_binary_whose_constexprs_are_not_the_trailing_parameters_is_not_kept(stand_in: StandInKernel) -> None:
    site, x = LaunchSite(), torch.randn(8)
    site.launch(stand_in, (x, 8), statics({"OTHER": 1}), DEVICE_0)
    assert not site.kept
    positional = LaunchSite()
    positional.launch(stand_in, (x, 8, 64), statics({}), DEVICE_0)
    positional.launch(stand_in, (x, 8, 64), statics({}), DEVICE_0)
    assert positional.kept and len(stand_in.bound) == 2, "every parameter passed positionally: nothing to append"
    binary = stand_in.binary
    assert isinstance(binary, StandInBinary) and binary.launches[0][-3:] == (x, 8, 64)


def test_what_is_not_a_compiled_kernel_is_not_kept() -> None:
    site = LaunchSite()
    site.launch(StandInKernel(None), (torch.randn(8), 8), statics(), DEVICE_0)  # the interpreter returns no binary
    assert not site.kept


def test_a_launcher_without_sites_binds_every_launch(stand_in: StandInKernel) -> None:
    x = torch.randn(8)
    for _ in range(3):
        Launcher()("k", stand_in, (x, 8), statics())
    assert len(stand_in.bound) == 3
    sites: dict[str, LaunchSite] = {}
    for _ in range(3):
        Launcher(sites, direct=True)("k", stand_in, (x, 8), statics())
    assert len(stand_in.bound) == 4 and list(sites) == ["k"]


def test_the_memo_keys_forwards_by_tokens_and_dtypes_and_forgets_the_oldest() -> None:
    memo = ForwardMemo()
    config = MoeRunnerConfig(num_experts=4, hidden_size=8, intermediate_size_per_partition=8, top_k=2)
    weights = TritonDenseWeights(w13=torch.randn(4, 16, 8).half(), w2=torch.randn(4, 8, 8).half())
    tiles = KernelConfig(block_m=16, block_n=32, block_k=32)
    planned: list[int] = []

    def dispatch(tokens: int, dtype: torch.dtype = torch.float32) -> StandardDispatchOutput:
        return StandardDispatchOutput(torch.randn(tokens, 8, dtype=dtype), select_experts(torch.randn(tokens, 4), config))

    def plan(tokens: int) -> Callable[[], plans.Launches]:
        def make() -> plans.Launches:
            planned.append(tokens)
            return plans.Launches(*plans.dense_gemms(weights, tiles, tiles))

        return make

    first = memo.forward(weights, dispatch(3), plan(3))
    assert memo.forward(weights, dispatch(3), plan(3)) is first and planned == [3]
    memo.forward(weights, dispatch(3, torch.float16), plan(3))
    assert planned == [3, 3], "another hidden dtype is another forward"
    for tokens in range(4, 4 + ForwardMemo.LIMIT):
        memo.forward(weights, dispatch(tokens), plan(tokens))
    memo.forward(weights, dispatch(3), plan(3))
    assert planned[-1] == 3 and len(planned) == 3 + ForwardMemo.LIMIT, "the oldest key was forgotten"
    assert copy.deepcopy(memo).sites(weights) == [], "a copy starts empty"
    before = len(planned)
    object.__setattr__(weights, "w13", torch.randn(4, 16, 8).half())  # replaced behind the frozen field
    memo.forward(weights, dispatch(3), plan(3))
    assert len(planned) == before + 1, "a quant info whose tensors were replaced is planned afresh"
    weights.w2.mul_(2.0)  # written in place (adversarial pass 8, c01: a scale's own check never ran again)
    memo.forward(weights, dispatch(3), plan(3))
    assert len(planned) == before + 2, "a quant info whose tensors were written is planned afresh"
    biases = ExpertBiases(w13=torch.randn(4, 16).half(), w2=torch.randn(4, 8).half())
    object.__setattr__(weights, "biases", biases)  # another structure below (pass 8, c13: a raw AttributeError)
    memo.forward(weights, dispatch(3), plan(3))
    assert len(planned) == before + 3
    object.__setattr__(weights, "biases", None)  # the chains below biases are gone: planned afresh, not raised
    memo.forward(weights, dispatch(3), plan(3))
    assert len(planned) == before + 4
    weights.w2.data = torch.randn(4, 8, 8).half()  # other memory (pass 8, c12): the kept binaries' alignment may not hold
    memo.forward(weights, dispatch(3), plan(3))
    assert len(planned) == before + 5


GPU_SHAPE = (37, 8, 2, 1024, 512, 8, 0)
"""A layer the block-scaled format takes too (H and I multiples of 128)."""


@pytest.mark.skipif(not CUDA, reason="the kept binaries are CUDA kernels")
@pytest.mark.parametrize("fmt", ["dense", "fp8-static", "fp8-dynamic", "fp8-block", "nvfp4-w4a16", "nvfp4-w4a16-dequantized"])
@pytest.mark.parametrize("tokens", [1, 37, 2100], ids=lambda t: f"T{t}")  # 4200 pairs: the three-launch sort
def test_direct_launches_equal_tritons_own(
    gen: torch.Generator, fmt: str, tokens: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    if fmt == "nvfp4-w4a16-dequantized":
        monkeypatch.setattr(plans, "nvfp4_dequantizes", lambda *_: True)
    shape = (tokens, *GPU_SHAPE[1:])
    config, weights, dispatch = make_layer(gen, shape, torch.bfloat16)
    forward = bound_forward(fmt.removesuffix("-dequantized"), config, weights, dispatch)
    assert isinstance(forward, BoundRunner) and isinstance(forward.runner, TritonRunner)
    runner, quant_info = forward.runner, forward.quant_info
    forward(dispatch)
    for _ in range(3):
        _, _, fresh = make_layer(gen, shape, torch.bfloat16)
        direct = forward(fresh)
        launches = runner.plan.launches(config, fresh, quant_info)
        own = fused_moe(config, fresh, launches.w13, launches.w2, launches.inputs)  # no sites: Triton binds each
        torch.testing.assert_close(direct, own, rtol=0, atol=0)
    sites = runner.memo.sites(quant_info)
    assert sites and all(site.kept for site in sites)


@pytest.mark.skipif(not CUDA, reason="the kept binaries are CUDA kernels")
@pytest.mark.parametrize("layout", ["misaligned", "row-of-a-wider-buffer"])
def test_caller_tensors_the_binaries_were_not_specialized_for_go_through_triton(
    gen: torch.Generator, layout: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    config, weights, dispatch = make_layer(gen, (1, *GPU_SHAPE[1:]), torch.bfloat16)
    forward = bound_forward("dense", config, weights, dispatch)
    expected = forward(dispatch)
    forward(dispatch)
    x = dispatch.hidden_states
    if layout == "misaligned":
        odd = torch.empty(x.numel() + 1, dtype=x.dtype, device=x.device)[1:].view_as(x)
    else:
        odd = torch.empty(1, x.shape[1] + 8, dtype=x.dtype, device=x.device)[:, : x.shape[1]]
    odd.copy_(x)
    verdicts: list[bool] = []
    real = launcher_module.direct_launches

    def spy(tensors: tuple[torch.Tensor, ...]) -> bool:
        verdicts.append(real(tensors))
        return verdicts[-1]

    monkeypatch.setattr(launch_module, "direct_launches", spy)
    out = forward(StandardDispatchOutput(odd, dispatch.topk))
    assert verdicts == ([False] if layout == "misaligned" else []), "the stride check comes first"
    torch.testing.assert_close(out, expected, rtol=0, atol=0)
    assert forward(dispatch).equal(expected) and verdicts[-1] is True
