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
import json
import math
import sys
from collections.abc import Sequence
from pathlib import Path

import torch

from moe_core.capability import DeviceSpec
from moe_core.backends.reference import reference_device_support
from moe_core.check import FORMAT_CHECKS, CheckRow, CheckRun, unchecked_formats
from moe_core.check import __doc__ as CHECK_DOC
from moe_core.checkpoint import MoeCheckpoint
from moe_core.config import MoeRunnerConfig
from moe_core.dispatch import StandardDispatchOutput
from moe_core.formats import DenseMoeWeights, Nvfp4MoeWeights
from moe_core.registry import plugin_errors as registry_plugin_errors
from moe_core.registry import registered_backends
from moe_core.routing import select_experts
from moe_core.schemes import SCHEMES
from moe_core.selection_table import INFO_LAYER, CandidateRow, broken_backends, candidate_rows
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


def _device_spec(text: str) -> DeviceSpec:
    try:
        return DeviceSpec.parse(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def _int_at_least(text: str, minimum: int, what: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from None
    if value < minimum:
        raise argparse.ArgumentTypeError(f"expected {what}, got {value}")
    return value


def _positive_int(text: str) -> int:
    return _int_at_least(text, 1, "a positive integer")


def _non_negative_int(text: str) -> int:
    return _int_at_least(text, 0, "an integer >= 0")


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


def _info(device: DeviceSpec, as_json: bool) -> int:
    rows = candidate_rows(device)
    broken = broken_backends(device)
    for name, reason in broken:
        _progress(f"warning: backend {name} is broken: {reason}")
    if as_json:
        print(json.dumps([row.as_json() for row in rows], indent=1))
        return 1 if broken else 0
    layer = INFO_LAYER
    print(
        f"moe-core on {device.describe()} (torch {torch.__version__}): each format's candidates in rank order, "
        f"for a layer of {layer.num_experts} experts, top {layer.top_k}, hidden {layer.hidden_size}, "
        f"intermediate {layer.intermediate_size_per_partition}, bf16; * marks the one chosen"
    )
    table = [
        [
            row.format,
            ("* " if row.chosen else "  ") + row.backend,
            row.tier,
            "ok" if row.supported else "; ".join(row.reasons),
            row.degradation or "-",
        ]
        for row in rows
    ]
    print(format_table(["format", "backend", "tier", "supports", "degradation"], table))
    print(f"\nmoe-core schemes on {device.describe()}: the backend each would run its layers on")
    print(format_table(["scheme", "format", "would run on"], _scheme_rows(rows)))
    return 1 if broken else 0


def _scheme_rows(rows: Sequence[CandidateRow]) -> list[list[str]]:
    chosen = {row.format: row for row in rows if row.chosen}
    table = []
    for spec in SCHEMES:
        row = chosen.get(spec.format.name)
        where = "nothing fits" if row is None else row.backend + (f" (degraded: {row.degradation})" if row.degradation else "")
        table.append([spec.name, spec.format.name, where])
    return table


def _number(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def _print_rows(rows: Sequence[CheckRow]) -> int:
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


def _plugin_rows(plugin_errors: dict[str, str]) -> list[CheckRow]:
    return [
        CheckRow("-", f"entry point {name}", "-", None, None, None, None, f"FAILED: did not load: {error}")
        for name, error in plugin_errors.items()
    ]


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
    rows += _plugin_rows(plugin_errors)
    print(
        f"moe-core check on {args.device} (torch {torch.__version__}): {args.experts} experts, top {args.top_k}, "
        f"hidden {args.hidden}, intermediate {args.intermediate}, {args.tokens} tokens of {args.dtype}, seed {args.seed}"
    )
    return _print_rows(rows)


def _check_checkpoint(args: argparse.Namespace, plugin_errors: dict[str, str]) -> int:
    checkpoint = MoeCheckpoint(args.checkpoint)
    layers = checkpoint.moe_layers()
    layer = layers[0] if args.layer is None and layers else args.layer
    spec = checkpoint.scheme()
    _progress(f"moe-core check: loading layer {layer} of {checkpoint.directory} through the {spec.name} scheme")
    scheme = checkpoint.load_layer(layer, device=args.device)
    weights = scheme.weights
    checks = [check for check in FORMAT_CHECKS if check.format is spec.format]
    if weights is None or not checks:
        print(f"moe-core check: no check covers the {spec.format.name} format of {spec.name}", file=sys.stderr)
        return 2
    config = scheme.config
    gen = torch.Generator().manual_seed(args.seed)
    x = torch.randn(args.tokens, config.hidden_size, generator=gen).to(DTYPES[args.dtype]).to(args.device)
    logits = x.float() @ checkpoint.router_weight(layer).to(args.device).float().T
    dispatch = StandardDispatchOutput(x, select_experts(logits, config))
    dequantized: DenseMoeWeights | None = None
    if isinstance(weights, Nvfp4MoeWeights):
        dequantized = source = weights.dequantize()
    elif isinstance(weights, DenseMoeWeights):
        source = weights
    else:
        print(f"moe-core check: cannot dequantize {type(weights).__name__}", file=sys.stderr)
        return 2
    run = CheckRun(config, source, dispatch, registered_backends(), args.tolerance, args.iters, _progress)
    rows = checks[0].rows_for(run, weights, dequantized, "float64 MoE, dequantized weights, no activation quantization")
    rows += _plugin_rows(plugin_errors)
    print(
        f"moe-core check on {args.device} (torch {torch.__version__}): {checkpoint.directory}, layer {layer} "
        f"({checkpoint.model_type}: {config.num_experts} experts, top {config.top_k}, hidden {config.hidden_size}, "
        f"intermediate {config.intermediate_size_per_partition}); {scheme.backend_summary()}; "
        f"{args.tokens} tokens of {args.dtype} routed by the checkpoint's router, seed {args.seed}"
    )
    return _print_rows(rows)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="moe-core", description=(__doc__ or "").splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    info = commands.add_parser(
        "info", help="each format's candidate backends on a device, their answers, and the one chosen"
    )
    info.add_argument(
        "--device",
        type=_device_spec,
        default=DeviceSpec.parse("cpu"),
        help="a device here (cpu, cuda:0) or described (sm90, sm100; +pkg/-pkg: with or without a package) (cpu)",
    )
    info.add_argument("--json", action="store_true", help="print the rows as a JSON list")
    check = commands.add_parser(
        "check",
        help="check the references and every available backend on a random MoE layer",
        description=CHECK_DOC,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    check.add_argument("--device", type=_device, default=torch.device("cpu"), help="device to run on (cpu)")
    check.add_argument(
        "--checkpoint",
        type=Path,
        help="a Hugging Face checkpoint directory: check one of its MoE layers instead of a random one "
        "(sizes come from its config.json)",
    )
    check.add_argument("--layer", type=_non_negative_int, help="the checkpoint's decoder layer (its first MoE layer)")
    check.add_argument("--tokens", type=_positive_int, default=64, help="tokens in the batch (64)")
    check.add_argument("--experts", type=_positive_int, help="number of experts (8)")
    check.add_argument("--top-k", type=_positive_int, help="experts per token, at most --experts (2)")
    check.add_argument("--hidden", type=_multiple_of_16, help="hidden size, a multiple of 16 (256)")
    check.add_argument("--intermediate", type=_multiple_of_16, help="intermediate size, a multiple of 16 (512)")
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


SIZE_DEFAULTS = {"experts": 8, "top_k": 2, "hidden": 256, "intermediate": 512}
"""The random layer's sizes where no flag gives them."""


def _resolve_sizes(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    given = [name for name in SIZE_DEFAULTS if getattr(args, name) is not None]
    if args.checkpoint is not None:
        if given:
            flag = "--" + given[0].replace("_", "-")
            parser.error(f"argument {flag}: not allowed with --checkpoint (the sizes come from its config.json)")
        return
    if args.layer is not None:
        parser.error("argument --layer: only with --checkpoint")
    for name, default in SIZE_DEFAULTS.items():
        if getattr(args, name) is None:
            setattr(args, name, default)
    if args.top_k > args.experts:
        parser.error(f"argument --top-k: expected at most --experts={args.experts}, got {args.top_k}")


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``moe-core`` and ``python -m moe_core``."""
    parser = _parser()
    args = parser.parse_args(argv)
    if args.command == "check":
        _resolve_sizes(parser, args)
    if args.command == "info":
        return _info(args.device, args.json)
    plugin_errors = registry_plugin_errors()
    for name, error in plugin_errors.items():
        _progress(f"warning: backend entry point {name!r} failed to load: {error}")
    reference = reference_device_support(DeviceSpec.of(args.device))
    if not reference.ok:
        print(f"moe-core check: the reference backends cannot run on {args.device}: {'; '.join(reference.reasons)}",
              file=sys.stderr)
        return 2
    if args.checkpoint is not None:
        try:
            return _check_checkpoint(args, plugin_errors)
        except (OSError, ValueError, TypeError, KeyError) as error:
            print(f"moe-core check: {type(error).__name__}: {error}", file=sys.stderr)
            return 2
    return _check(args, plugin_errors)
