"""The Triton runner's own Python per decode call, with every kernel launch stubbed out: what replaying a recorded
forward (``backends/triton/replay.py``) saves, and what a ``BoundRunner`` (what schemes call) adds, side by side in one
process.

No kernel runs, so it measures on a CPU as on a GPU machine (where a direct launch adds about 6 us each, 4-6 per
forward): microseconds per call of a tiny layer (E8 k2 H256 I256, T=1), per format, with the replay and without it
(the memo's replays switched off), and through the layer's ``BoundRunner``. Medians of ``--rounds`` rounds.
``--launch`` (a GPU machine) launches every kernel for real instead: the host time per call issued back to back, in
batches of ``--calls`` that the GPU drains between them.

    python3 benchmarks/host_python.py [--calls 3000] [--rounds 5]
    python3 benchmarks/host_python.py --launch --calls 200 --rounds 9
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable, Sequence

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # the backend binds on a CPU only so; no kernel runs either way

from moe_core import MoeRunnerConfig, MoeForward, StandardDispatchOutput, TopKOutput
from moe_core.backends.triton import TRITON_DENSE, TRITON_FP8, TRITON_FP8_BLOCK
from moe_core.backends.triton import launch as launch_module
from moe_core.backends.triton import launcher as launcher_module
from moe_core.backends.triton.launcher import JitKernel, Launcher, LaunchSite, Statics
from moe_core.backends.triton.quant_info import TritonDenseWeights, TritonFp8BlockWeights, TritonFp8Weights
from moe_core.backends.triton import runner as runner_module
from moe_core.backends.triton.plans import Launches
from moe_core.backends.triton.runner import KeptForward, TritonRunner
from moe_core.registry import BoundRunner
from moe_core.synthetic import quantize_fp8_block_layer, quantize_fp8_channel_layer, random_dense_layer

CONFIG = MoeRunnerConfig(num_experts=8, hidden_size=256, intermediate_size_per_partition=256, top_k=2)


def _no_launch(self: Launcher, name: str, kernel: JitKernel, args: Sequence[object], statics: Statics) -> None:
    """A launcher call that keeps the site, as a real one does, and launches nothing."""
    sites = getattr(self, "_sites")
    if sites is not None and name not in sites:
        sites[name] = LaunchSite()


def _layers(dispatch: StandardDispatchOutput, device: torch.device, seed: int) -> dict[str, MoeForward]:
    """The tiny layer bound to each Triton format's backend."""
    dense, _ = random_dense_layer(CONFIG, 1, torch.bfloat16, device, seed)
    return {
        "dense": TRITON_DENSE.bind(CONFIG, TritonDenseWeights.from_dense(dense)),
        "fp8-dynamic": TRITON_FP8.bind(CONFIG, TritonFp8Weights.from_fp8_channel(quantize_fp8_channel_layer(CONFIG, dense, dispatch))),
        "fp8-block": TRITON_FP8_BLOCK.bind(CONFIG, TritonFp8BlockWeights.from_fp8_block(quantize_fp8_block_layer(CONFIG, dense, dispatch))),
    }


def _us(call: Callable[[], object], calls: int) -> float:
    """Microseconds per call of ``calls`` back-to-back calls (on a GPU, issued while the GPU catches up after)."""
    for _ in range(50):
        call()
    _synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        call()
    issued = time.perf_counter() - start
    _synchronize()
    return issued / calls * 1e6


def _synchronize() -> None:
    """Wait for the GPU where there is one."""
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def _without_replays(launches: Launches) -> KeptForward:
    """A memo entry as before replays: sites, no replays."""
    return KeptForward(launches, {}, None)


def main() -> None:
    """Print the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=3000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--launch", action="store_true", help="launch the kernels (needs a GPU)")
    args = parser.parse_args()
    if args.launch and not torch.cuda.is_available():
        parser.error("--launch needs a GPU")
    device = torch.device("cuda" if args.launch else "cpu")
    if not args.launch:
        setattr(launcher_module.Launcher, "__call__", _no_launch)
        setattr(launch_module, "current_target", lambda: (0, 0))  # the CPU's stream: the kept scratch of stream 0
        setattr(launch_module, "direct_launches", lambda tensors: True)
    _, batch = random_dense_layer(CONFIG, 1, torch.bfloat16, device, 0)
    dispatch = StandardDispatchOutput(
        batch.hidden_states, TopKOutput(batch.topk.topk_ids, batch.topk.topk_weights, num_experts=8, check_values=False)
    )
    print(f"{'format':<12} {'replayed us':>12} {'not replayed us':>16} {'ratio':>6} {'BoundRunner us':>15} {'it adds us':>11}")
    for name, forward in _layers(dispatch, device, 1).items():
        assert isinstance(forward, BoundRunner) and isinstance(forward.runner, TritonRunner)
        runner, weights = forward.runner, forward.quant_info
        plain_runner = TritonRunner(runner.config, runner.plan)
        replayed, plain, bound = [], [], []
        for _ in range(args.rounds):
            replayed.append(_us(lambda: runner.run(dispatch, weights), args.calls))  # noqa: B023
            bound.append(_us(lambda: forward(dispatch), args.calls))  # noqa: B023
            setattr(runner_module, "_kept", _without_replays)
            plain.append(_us(lambda: plain_runner.run(dispatch, weights), args.calls))  # noqa: B023
            setattr(runner_module, "_kept", KEPT)
        r, p, b = statistics.median(replayed), statistics.median(plain), statistics.median(bound)
        print(f"{name:<12} {r:>12.1f} {p:>16.1f} {r / p:>6.2f} {b:>15.1f} {b - r:>11.1f}")


KEPT = runner_module._kept
"""The memo's own entries (with replays)."""

if __name__ == "__main__":
    main()
