"""The ``moe-core`` command: list backends, and check them on a random MoE layer.

``moe-core info`` prints every registered backend with its availability on a
device and the formats it converts from; it exits 1 when a plugin failed to
load or its availability check raised. ``moe-core check`` is described in
:mod:`moe_core.check`; it exits 1 when any row failed. Backends are found
through the ``moe_core.backends`` entry-point group, so installed
third-party backends show up too.
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Sequence

import torch

from moe_core.backends.reference import reference_availability
from moe_core.check import FORMAT_CHECKS, CheckRow, CheckRun, unchecked_formats
from moe_core.check import __doc__ as CHECK_DOC
from moe_core.config import MoeRunnerConfig
from moe_core.registry import ENTRY_POINT_GROUP, load_entry_point_backends, registered_backends
from moe_core.synthetic import random_dense_layer

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


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
        raise argparse.ArgumentTypeError(f"expected a torch device, got {text!r} ({error})") from None


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    return value


def _multiple_of_16(text: str) -> int:
    value = _positive_int(text)
    if value % 16:
        raise argparse.ArgumentTypeError(f"expected a positive multiple of 16 (NVFP4 blocks), got {value}")
    return value


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}") from None
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"expected a finite number > 0, got {text!r}")
    return value


def _progress(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _info(device: torch.device, plugin_errors: dict[str, str]) -> int:
    rows = []
    broken = False
    for backend in registered_backends():
        availability = backend.availability(device)
        broken = broken or availability.broken
        status = "broken" if availability.broken else "yes" if availability.ok else "no"
        formats = ", ".join(fmt.name for fmt in backend.formats) or "-"
        rows.append([backend.name, status, formats, "; ".join(availability.reasons) or "-", backend.description])
    print(f"moe-core backends on {device} (torch {torch.__version__})")
    print(format_table(["backend", "available", "formats", "reasons", "description"], rows))
    for name, error in plugin_errors.items():
        print(f"entry point {name!r} ({ENTRY_POINT_GROUP}) failed to load: {error}")
    return 1 if plugin_errors or broken else 0


def _number(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def _check(args: argparse.Namespace, plugin_errors: dict[str, str]) -> int:
    config = MoeRunnerConfig(
        num_experts=args.experts,
        hidden_size=args.hidden,
        intermediate_size_per_partition=args.intermediate,
        top_k=args.top_k,
    )
    _progress(
        f"moe-core check on {args.device}: random layer of {args.experts} experts (top {args.top_k}), "
        f"hidden {args.hidden}, intermediate {args.intermediate}; {args.tokens} tokens of {args.dtype}; seed {args.seed}"
    )
    source, dispatch = random_dense_layer(config, args.tokens, DTYPES[args.dtype], args.device, args.seed)
    backends = registered_backends()
    rows: list[CheckRow] = []
    run = CheckRun(config, source, dispatch, backends, args.tolerance, args.iters, _progress)
    for check in FORMAT_CHECKS:
        rows += check.rows(run)
    rows += unchecked_formats(backends)
    rows += [
        CheckRow("-", f"entry point {name}", "-", None, None, None, None, f"FAILED: did not load: {error}")
        for name, error in plugin_errors.items()
    ]
    print(
        f"moe-core check on {args.device} (torch {torch.__version__}): {args.experts} experts, top {args.top_k}, "
        f"hidden {args.hidden}, intermediate {args.intermediate}, {args.tokens} tokens of {args.dtype}, seed {args.seed}"
    )
    print("rel err: ||out - expected|| / ||expected||; ms/call: median wall time after two warm-up calls, and its range")
    table = [
        [
            row.format,
            row.backend,
            row.compared_with,
            _number(row.rel_err, ".2e"),
            _number(row.max_abs_err, ".2e"),
            _number(row.tolerance, ".2g"),
            "-" if row.timing is None else f"{row.timing.median:.3f}",
            "-" if row.timing is None else f"{row.timing.low:.3f}-{row.timing.high:.3f} ({row.timing.calls})",
            row.verdict,
        ]
        for row in rows
    ]
    headers = ["format", "backend", "compared with", "rel err", "max abs err", "limit", "ms/call", "range (calls)", "verdict"]
    print(format_table(headers, table))
    return 1 if any(row.failed for row in rows) else 0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="moe-core", description=(__doc__ or "").splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    info = commands.add_parser("info", help="list registered backends, their formats and availability")
    info.add_argument("--device", type=_device, default=torch.device("cpu"), help="device to ask about (cpu)")
    check = commands.add_parser(
        "check",
        help="check the references and every available backend on a random MoE layer",
        description=CHECK_DOC,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    check.add_argument("--device", type=_device, default=torch.device("cpu"), help="device to run on (cpu)")
    check.add_argument("--tokens", type=_positive_int, default=64, help="tokens in the batch (64)")
    check.add_argument("--experts", type=_positive_int, default=8, help="number of experts (8)")
    check.add_argument("--top-k", type=_positive_int, default=2, help="experts per token, at most --experts (2)")
    check.add_argument("--hidden", type=_multiple_of_16, default=256, help="hidden size, a multiple of 16 (256)")
    check.add_argument(
        "--intermediate", type=_multiple_of_16, default=512, help="intermediate size, a multiple of 16 (512)"
    )
    check.add_argument("--dtype", choices=tuple(DTYPES), default="bf16", help="activation dtype (bf16)")
    check.add_argument("--seed", type=int, default=0, help="random seed (0)")
    check.add_argument("--iters", type=_positive_int, default=5, help="fewest timed calls per backend (5)")
    check.add_argument(
        "--tolerance",
        type=_positive_float,
        default=5e-2,
        help="largest relative l2 error of a backend against its format's reference that passes (5e-2)",
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``moe-core`` and ``python -m moe_core``."""
    parser = _parser()
    args = parser.parse_args(argv)
    if args.command == "check" and args.top_k > args.experts:
        parser.error(f"argument --top-k: expected at most --experts={args.experts}, got {args.top_k}")
    plugin_errors = {name: error for name, error in load_entry_point_backends().items() if error is not None}
    for name, error in plugin_errors.items():
        _progress(f"warning: backend entry point {name!r} failed to load: {error}")
    if args.command == "info":
        return _info(args.device, plugin_errors)
    reference = reference_availability(args.device)
    if not reference.ok:
        print(f"moe-core check: the reference backends cannot run on {args.device}: {'; '.join(reference.reasons)}",
              file=sys.stderr)
        return 2
    return _check(args, plugin_errors)
