"""Decode forwards replayed (:mod:`moe_core.backends.triton.replay`): a memo key's first kept forward is recorded and
its launches repeated with each call's tensors, bit-equal to a forward launched afresh; a forward whose launches do not
say all it did (another torch operation, a buffer of its own) is never recorded, and a replay whose kept buffers were
dropped records again. On the CPU the launches run under Triton's interpreter."""

from __future__ import annotations

import gc
import weakref

import pytest
import torch

from moe_core import MoeRunnerConfig
from moe_core.backends.triton import launch as launch_module
from moe_core.backends.triton import plans
from moe_core.backends.triton.launch import Fp8Inputs, Gemm, fused_moe
from moe_core.backends.triton.launcher import THROUGH_TRITON, KernelLauncher, current_target
from moe_core.backends.triton.replay import RECORDINGS, Inputs, Replay
from moe_core.backends.triton.runner import TritonRunner
from moe_core.backends.triton.scratch import FRESH, KeptScratch, Scratch, forward_scratch
from moe_core.registry import BoundRunner
from moe_core.runner import QuantInfo
from tests.test_triton import BLOCK_SHAPES, CUDA, DEVICE, bound_forward, make_layer

SHAPE = (16, 64, 8, 2048, 768, 32, 16) if CUDA else BLOCK_SHAPES[-1]
"""A decode batch (its pairs within what a forward keeps buffers for) of experts split over ranks (half of them here,
from an offset): the replay keeps the expert offset too. On a GPU, Qwen3-30B's sizes: the suite's largest block shape
was a prefill, which keeps nothing and so is never recorded."""

DTYPE = torch.bfloat16 if CUDA else torch.float16

FORMATS = ["dense", "fp8-static", "fp8-dynamic", "fp8-block", "nvfp4-w4a16"]


def _python_forwards(monkeypatch: pytest.MonkeyPatch, extra: str | None = None) -> list[int]:
    """Count the memo's forwards that ran their Python (recorded, or not replayable) rather than a replay (those with
    nothing kept, launched through Triton, are not counted); with ``extra``,
    each such forward also makes one torch operation a replay would skip (``fill``) or hands a kernel a buffer of its
    own (``own-buffer``)."""
    calls: list[int] = []
    real = launch_module._forward

    def counted(
        config: MoeRunnerConfig, inputs: Inputs, w13: Gemm, w2: Gemm, fp8: Fp8Inputs, launcher: KernelLauncher,
        buffers: Scratch,
    ) -> torch.Tensor:
        if launcher is THROUGH_TRITON:
            return real(config, inputs, w13, w2, fp8, launcher, buffers)
        calls.append(1)
        if extra == "fill":
            buffers("inter", (inputs[1].numel(), w13.n), inputs[0].dtype, inputs[0].device).fill_(0.0)
        if extra == "own-buffer":
            return real(config, inputs, w13, w2, fp8, launcher, lambda *a: buffers(*a) if a[0] != "down" else FRESH(*a))
        return real(config, inputs, w13, w2, fp8, launcher, buffers)

    monkeypatch.setattr(launch_module, "_forward", counted)
    return calls


def _bound(gen: torch.Generator, fmt: str) -> tuple[BoundRunner[QuantInfo], TritonRunner[QuantInfo]]:
    """A random layer of ``fmt`` bound to the Triton runner, and that runner."""
    config, weights, dispatch = make_layer(gen, SHAPE, DTYPE)
    forward = bound_forward(fmt, config, weights, dispatch)
    assert isinstance(forward, BoundRunner) and isinstance(forward.runner, TritonRunner)
    return forward, forward.runner


def _afresh(gen: torch.Generator, forward: BoundRunner[QuantInfo], runner: TritonRunner[QuantInfo]) -> tuple[torch.Tensor, torch.Tensor]:
    """The bound forward of a fresh random batch, and the same launches with nothing kept (Triton binds each,
    fresh buffers)."""
    _, _, batch = make_layer(gen, SHAPE, DTYPE)
    launches = runner.plan.launches(runner.config, batch, forward.quant_info)
    own = fused_moe(runner.config, batch, launches.w13, launches.w2, launches.inputs)
    return forward(batch), own


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_decode_forward_is_recorded_once_and_replayed_bit_for_bit(
    gen: torch.Generator, fmt: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    forward, runner = _bound(gen, fmt)
    calls = _python_forwards(monkeypatch)
    for _ in range(3):
        out, own = _afresh(gen, forward, runner)
        torch.testing.assert_close(out, own, rtol=0, atol=0)
    assert len(calls) == 1, "recorded by the first forward, replayed by the next two"
    replays = runner.memo.replays(forward.quant_info)
    assert len(replays) == 1 and isinstance(replays[0], Replay)


@pytest.mark.parametrize("extra", ["fill", "own-buffer"])
def test_a_forward_whose_launches_do_not_say_all_it_did_is_never_replayed(
    gen: torch.Generator, extra: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A torch operation besides allocations and views (a replay would skip it), or a buffer the forward allocated
    for itself alone (a replay would hold it, or read another forward's): the forward runs as itself every time."""
    forward, runner = _bound(gen, "dense")
    calls = _python_forwards(monkeypatch, extra)
    for _ in range(3):
        out, own = _afresh(gen, forward, runner)
        torch.testing.assert_close(out, own, rtol=0, atol=0)
    assert len(calls) == 3 and runner.memo.replays(forward.quant_info) == [None]


def test_a_workspace_forward_is_never_replayed(gen: torch.Generator, monkeypatch: pytest.MonkeyPatch) -> None:
    """NVFP4 expanded into a 16-bit workspace first: the workspace is the forward's own (its kernel's launch is not
    the forward's launcher's either), so nothing is recorded."""
    monkeypatch.setattr(plans, "nvfp4_dequantizes", lambda *_: True)
    forward, runner = _bound(gen, "nvfp4-w4a16")
    calls = _python_forwards(monkeypatch)
    for _ in range(2):
        out, own = _afresh(gen, forward, runner)
        torch.testing.assert_close(out, own, rtol=0, atol=0)
    assert len(calls) == 2 and runner.memo.replays(forward.quant_info) == [None]


def test_a_replay_whose_kept_buffers_were_dropped_records_again(gen: torch.Generator, monkeypatch: pytest.MonkeyPatch) -> None:
    forward, runner = _bound(gen, "fp8-dynamic")
    calls = _python_forwards(monkeypatch)
    _afresh(gen, forward, runner)
    kept = forward_scratch(1, current_target()[1], DEVICE)  # the current stream's, this thread's
    assert isinstance(kept, KeptScratch)
    kept._kept.clear()  # what the bound on kept bytes does to the oldest buffers
    gc.collect()
    out, own = _afresh(gen, forward, runner)
    torch.testing.assert_close(out, own, rtol=0, atol=0)
    assert len(calls) == 2, "recorded again"
    out, own = _afresh(gen, forward, runner)
    torch.testing.assert_close(out, own, rtol=0, atol=0)
    assert len(calls) == 2, "and replayed"


def test_a_replay_holds_none_of_the_callers_tensors(gen: torch.Generator) -> None:
    forward, runner = _bound(gen, "dense")
    config, weights, batch = make_layer(gen, SHAPE, DTYPE)
    forward(batch)
    forward(batch)
    refs = [weakref.ref(t) for t in (batch.hidden_states, batch.topk.topk_ids, batch.topk.topk_weights)]
    del batch
    gc.collect()
    assert all(ref() is None for ref in refs)


def test_a_forward_whose_buffers_keep_being_dropped_stops_recording(gen: torch.Generator, monkeypatch: pytest.MonkeyPatch) -> None:
    """Decode forwards of many shapes over the kept bytes drop each other's buffers; recording every call would cost
    more than the forward, so after RECORDINGS recordings the forward runs as itself (adversarial pass 17's note)."""
    forward, runner = _bound(gen, "dense")
    calls = _python_forwards(monkeypatch)
    kept = forward_scratch(1, current_target()[1], DEVICE)  # the current stream's, this thread's
    assert isinstance(kept, KeptScratch)
    for _ in range(RECORDINGS + 2):
        out, own = _afresh(gen, forward, runner)
        torch.testing.assert_close(out, own, rtol=0, atol=0)
        kept._kept.clear()
        gc.collect()
    assert len(calls) == RECORDINGS + 2 and runner.memo.replays(forward.quant_info) == [None]
    out, own = _afresh(gen, forward, runner)
    torch.testing.assert_close(out, own, rtol=0, atol=0)
