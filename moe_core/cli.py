"""The ``moe-core`` command: list backends, and check them on a random NVFP4 layer.

``moe-core info`` prints every registered backend with its availability on a
device; ``moe-core check`` builds a random NVFP4 MoE layer, runs it through
each available backend and prints its error against the reference and its
time per call; it exits 1 if a backend fails or misses the tolerance.
Backends are found through the ``moe_core.backends`` entry-point group, so
installed third-party backends show up too.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Sequence

import torch

from moe_core.config import MoeRunnerConfig
from moe_core.dispatch import StandardDispatchOutput
from moe_core.registry import ENTRY_POINT_GROUP, MoeForward, load_entry_point_backends, registered_backends
from moe_core.synthetic import random_nvfp4_layer

REFERENCE_BACKEND = "reference-nvfp4"
"""The backend every other one is compared with."""


def format_table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """A plain-text table with left-aligned columns."""
    widths = [max(len(str(cell)) for cell in column) for column in zip(headers, *rows)]

    def line(cells: Sequence[str]) -> str:
        return "  ".join(str(cell).ljust(width) for cell, width in zip(cells, widths)).rstrip()

    rule = "  ".join("-" * width for width in widths)
    return "\n".join([line(headers), rule, *(line(row) for row in rows)])


def _device(text: str) -> torch.device:
    try:
        return torch.device(text)
    except RuntimeError as error:
        raise argparse.ArgumentTypeError(f"not a torch device: {text!r} ({error})") from None


def _positive(text: str) -> int:
    value = int(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    return value


def _progress(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _info(device: torch.device, plugin_errors: dict[str, str]) -> int:
    rows = []
    for backend in registered_backends():
        availability = backend.availability(device)
        rows.append(
            [
                backend.name,
                "yes" if availability.ok else "no",
                "; ".join(availability.reasons) or "-",
                backend.description,
            ]
        )
    print(f"moe-core backends on {device} (torch {torch.__version__})")
    print(format_table(["backend", "available", "reasons", "description"], rows))
    for name, error in plugin_errors.items():
        print(f"entry point {name!r} ({ENTRY_POINT_GROUP}) failed to load: {error}")
    return 0


def _time_per_call(forward: MoeForward, dispatch: StandardDispatchOutput, iters: int) -> tuple[torch.Tensor, float]:
    """The output and the median wall time of ``iters`` calls after one warm-up, in ms."""
    device = dispatch.hidden_states.device
    out = forward(dispatch)
    times = []
    for _ in range(iters):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        start = time.perf_counter()
        out = forward(dispatch)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        times.append((time.perf_counter() - start) * 1e3)
    return out, statistics.median(times)


def _check(args: argparse.Namespace) -> int:
    config = MoeRunnerConfig(
        num_experts=args.experts,
        hidden_size=args.hidden,
        intermediate_size_per_partition=args.intermediate,
        top_k=args.top_k,
    )
    backends = registered_backends()
    reference = next((backend for backend in backends if backend.name == REFERENCE_BACKEND), None)
    if reference is None:
        raise ValueError(f"the reference backend {REFERENCE_BACKEND!r} is not registered; is moe-core installed?")
    verdict = reference.availability(args.device)
    if not verdict.ok:
        raise ValueError(f"the reference backend cannot run on {args.device}: {'; '.join(verdict.reasons)}")
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[args.dtype]
    _progress(
        f"building a random NVFP4 layer: {args.tokens} tokens, {args.experts} experts (top {args.top_k}), "
        f"hidden {args.hidden}, intermediate {args.intermediate}, {args.dtype} activations, seed {args.seed}"
    )
    weights, dispatch = random_nvfp4_layer(config, args.tokens, dtype, args.device, args.seed)

    results: dict[str, tuple[torch.Tensor, float]] = {}
    notes: dict[str, str] = {}
    for backend in backends:
        availability = backend.availability(args.device)
        if not availability.ok:
            notes[backend.name] = "unavailable: " + "; ".join(availability.reasons)
            continue
        _progress(f"running {backend.name}")
        try:
            forward = backend.bind_nvfp4(config, weights)
            if forward is None:
                notes[backend.name] = "skipped: runs no NVFP4"
                continue
            results[backend.name] = _time_per_call(forward, dispatch, args.iters)
        except Exception as error:  # a backend may fail in any way: report it, check the rest
            notes[backend.name] = f"FAILED: {type(error).__name__}: {error}"

    if REFERENCE_BACKEND not in results:
        raise ValueError(f"the reference backend did not run: {notes[REFERENCE_BACKEND]}")
    expected = results[REFERENCE_BACKEND][0].double()
    rows = []
    failed = [name for name, note in notes.items() if note.startswith("FAILED")]
    for backend in backends:
        if backend.name not in results:
            rows.append([backend.name, "-", "-", "-", notes[backend.name]])
            continue
        out, ms = results[backend.name]
        diff = out.double() - expected
        rel = float(diff.norm() / expected.norm())
        if backend.name == REFERENCE_BACKEND:
            note = "reference"
        elif rel <= args.tolerance:
            note = "ok"
        else:
            note = f"FAILED: error above {args.tolerance:g}"
            failed.append(backend.name)
        rows.append([backend.name, f"{rel:.2e}", f"{float(diff.abs().max()):.2e}", f"{ms:.3f}", note])
    print(f"moe-core check on {args.device}: error vs {REFERENCE_BACKEND}, median of {args.iters} calls")
    print(format_table(["backend", "rel l2 err", "max abs err", "ms/call", "note"], rows))
    return 1 if failed else 0


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``moe-core`` and ``python -m moe_core``."""
    parser = argparse.ArgumentParser(prog="moe-core", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    info = commands.add_parser("info", help="list registered backends and their availability")
    info.add_argument("--device", type=_device, default=torch.device("cpu"), help="device to ask about (cpu)")
    check = commands.add_parser("check", help="run a random NVFP4 MoE layer through every available backend")
    check.add_argument("--device", type=_device, default=torch.device("cpu"), help="device to run on (cpu)")
    check.add_argument("--tokens", type=_positive, default=64, help="tokens in the batch (64)")
    check.add_argument("--experts", type=_positive, default=8, help="number of experts (8)")
    check.add_argument("--top-k", type=_positive, default=2, help="experts per token (2)")
    check.add_argument("--hidden", type=_positive, default=256, help="hidden size, a multiple of 16 (256)")
    check.add_argument("--intermediate", type=_positive, default=512, help="intermediate size, a multiple of 16 (512)")
    check.add_argument("--dtype", choices=("bf16", "fp16", "fp32"), default="bf16", help="activation dtype (bf16)")
    check.add_argument("--seed", type=int, default=0, help="random seed (0)")
    check.add_argument("--iters", type=_positive, default=5, help="timed calls per backend (5)")
    check.add_argument(
        "--tolerance", type=float, default=5e-2, help="largest relative l2 error vs the reference that passes (5e-2)"
    )
    args = parser.parse_args(argv)
    plugin_errors = {name: error for name, error in load_entry_point_backends().items() if error is not None}
    for name, error in plugin_errors.items():
        _progress(f"warning: backend entry point {name!r} failed to load: {error}")
    if args.command == "info":
        return _info(args.device, plugin_errors)
    try:
        return _check(args)
    except (ValueError, TypeError) as error:
        print(f"moe-core check: {error}", file=sys.stderr)
        return 2
