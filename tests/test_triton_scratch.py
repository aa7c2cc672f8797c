"""The buffers a decode forward keeps between calls (:mod:`moe_core.backends.triton.scratch`): handed out again per
stream and thread, bounded, never under a CUDA graph capture or at prefill, and never read before the forward writes
them (poisoned between forwards, the outputs stay bit-equal to freshly allocated ones)."""

from __future__ import annotations

import threading

import pytest
import torch

from moe_core.backends.triton import scratch as scratch_module
from moe_core.backends.triton.launch import fused_moe
from moe_core.backends.triton.runner import TritonRunner
from moe_core.backends.triton.scratch import FRESH, KEPT_PAIRS, KeptScratch, forward_scratch
from moe_core.registry import BoundRunner
from tests.test_triton import BLOCK_SHAPES, bound_forward, make_layer

CPU = torch.device("cpu")


def test_a_kept_buffer_is_handed_out_again_by_name_shape_and_dtype() -> None:
    kept = KeptScratch()
    first = kept("inter", (4, 8), torch.float16, CPU)
    assert kept("inter", (4, 8), torch.float16, CPU) is first
    assert kept("down", (4, 8), torch.float16, CPU) is not first
    assert kept("inter", (4, 16), torch.float16, CPU) is not first
    assert kept("inter", (4, 8), torch.float32, CPU) is not first
    assert kept.bytes == 2 * (4 * 8 * 2) + 4 * 16 * 2 + 4 * 8 * 4


def test_kept_bytes_are_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(scratch_module, "KEPT_BYTES", 1024)
    kept = KeptScratch()
    oldest = kept("a", (128,), torch.float32, CPU)  # 512 bytes
    kept("b", (128,), torch.float32, CPU)
    kept("c", (64,), torch.float32, CPU)  # past 1024: the oldest goes
    assert kept.bytes == 768 and kept("a", (128,), torch.float32, CPU) is not oldest
    large = kept("d", (512,), torch.float32, CPU)
    assert kept("d", (512,), torch.float32, CPU) is not large, "a buffer over the bound is never kept"
    assert kept.bytes <= 1024


def test_prefill_and_cuda_graph_captures_allocate_afresh(monkeypatch: pytest.MonkeyPatch) -> None:
    assert forward_scratch(KEPT_PAIRS + 1, 0, CPU) is FRESH
    kept = forward_scratch(KEPT_PAIRS, 5, CPU)
    assert isinstance(kept, KeptScratch) and forward_scratch(1, 5, CPU) is kept
    assert forward_scratch(1, 6, CPU) is not kept, "another stream keeps its own"
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    assert forward_scratch(1, 5, torch.device("cuda")) is FRESH, "a capture's buffers belong to the graph's pool"


def test_each_thread_keeps_its_own() -> None:
    """Triton's interpreter runs a forward's kernels on the calling CPU thread: another thread's forward could run
    between them."""
    mine = forward_scratch(1, 0, CPU)
    theirs: list[object] = []
    thread = threading.Thread(target=lambda: theirs.append(forward_scratch(1, 0, CPU)))
    thread.start()
    thread.join()
    assert theirs and theirs[0] is not mine


@pytest.mark.parametrize("fmt", ["dense", "fp8-static", "fp8-dynamic", "fp8-block"])
def test_decode_forwards_never_read_what_they_did_not_write(gen: torch.Generator, fmt: str) -> None:
    """Half the experts on this rank (the other half's pairs are never written); the kept buffers are poisoned with
    NaN before every forward, which must still equal the same launches on fresh buffers bit for bit."""
    shape = BLOCK_SHAPES[-1]
    config, weights, dispatch = make_layer(gen, shape, torch.float16)
    forward = bound_forward(fmt, config, weights, dispatch)
    assert isinstance(forward, BoundRunner) and isinstance(forward.runner, TritonRunner)
    runner, quant_info = forward.runner, forward.quant_info
    forward(dispatch)
    kept = forward_scratch(1, 0, dispatch.hidden_states.device)
    assert isinstance(kept, KeptScratch) and kept.bytes > 0
    for _ in range(2):
        for buffer in kept._kept.values():
            buffer.view(torch.uint8).fill_(0xFF)  # NaN in every float format, -1 in int32
        _, _, fresh = make_layer(gen, shape, torch.float16)
        out = forward(fresh)
        launches = runner.plan.launches(config, fresh, quant_info)
        own = fused_moe(config, fresh, launches.w13, launches.w2, launches.inputs)  # no memo: fresh buffers
        assert not out.isnan().any()
        torch.testing.assert_close(out, own, rtol=0, atol=0)


def test_threads_calling_one_layer_at_once_get_their_own_outputs(gen: torch.Generator) -> None:
    """Four threads calling a layer at once (adversarial pass 10, c03: under Triton's interpreter three of them died in
    Triton's own ``InterpreterError``, the interpreter patching ``triton.language`` per launch, process-wide): each
    output equals the same forward run alone, bit for bit."""
    config, weights, dispatch = make_layer(gen, BLOCK_SHAPES[-1], torch.float16)
    forward = bound_forward("dense", config, weights, dispatch)
    batches = [make_layer(gen, BLOCK_SHAPES[-1], torch.float16)[2] for _ in range(4)]
    barrier = threading.Barrier(4)
    outputs: dict[int, list[torch.Tensor]] = {}
    errors: list[str] = []

    def work(index: int) -> None:
        barrier.wait()
        try:
            outputs[index] = [forward(batches[index]) for _ in range(2)]
        except Exception as error:  # every failure is reported below, with its thread
            errors.append(f"thread {index}: {type(error).__name__}: {error}")

    threads = [threading.Thread(target=work, args=(index,)) for index in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors
    for index, batch in enumerate(batches):
        alone = forward(batch)
        for out in outputs[index]:
            torch.testing.assert_close(out, alone, rtol=0, atol=0)
