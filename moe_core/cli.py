"""The ``moe-core`` command: list backends, and check them on a random MoE layer.

``moe-core info`` prints every registered backend with its availability on a
device and the formats it converts from; it exits 1 when a plugin failed to
load or its availability check raised. ``moe-core check`` is described in
:mod:`moe_core.check`; it exits 1 when any row failed. Backends are found
through the ``moe_core.backends`` entry-point group, so installed
third-party backends show up too.

torch, and every module that imports it, is imported inside the command
functions, after parsing: ``--help`` and ``--version`` answer without it.
"""

from __future__ import annotations

import argparse
import ast
import json
import math
import os
import re
import shutil
import sys
import textwrap
from collections.abc import Sequence
from itertools import zip_longest
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

    from moe_core.capability import DeviceSpec
    from moe_core.check import CheckRow
    from moe_core.config import MoeRunnerConfig, Routing
    from moe_core.selection_table import CandidateRow

EXIT_OK = 0
"""Every row ok (``check``); every plugin loaded and every backend's check answered (``info``)."""
EXIT_FAILED = 1
"""A row FAILED (``check``); a plugin failed to load or a backend's check raised (``info``)."""
EXIT_BAD_INPUT = 2
"""A flag or value refused, a checkpoint the loader cannot take, a device the reference backends cannot run on."""
EXIT_CORRUPT_CHECKPOINT = 3
"""A damaged checkpoint file (:class:`moe_core.checkpoint.CorruptCheckpoint`): truncated, or not safetensors."""

EXIT_CODES = f"""\
exit codes:
  {EXIT_OK}  ok
  {EXIT_FAILED}  check: a row FAILED; info: a plugin failed to load or a backend's check
     raised
  {EXIT_BAD_INPUT}  bad input or usage: a flag or value refused, a directory that is not a
     checkpoint the loader takes, a device the reference backends cannot run on
  {EXIT_CORRUPT_CHECKPOINT}  check --checkpoint: a damaged checkpoint file (truncated, or not
     safetensors)"""
"""The epilog of every ``--help``."""

DISTRIBUTION = "moe-core"
"""The distribution whose version ``--version`` prints."""

DTYPE_NAMES = ("bf16", "fp16", "fp32")
"""``--dtype``'s choices; :func:`_dtype` maps them to torch dtypes after parsing."""

SEED_RANGE = (-(2**63), 2**64 - 1)
"""The seeds ``torch.Generator.manual_seed`` takes (it maps negative ones onto the unsigned range)."""

TABLE_WIDTH = 100
"""Columns a table fits when stdout is not a terminal (a pipe or a file has no width)."""

_ROLE = re.compile(r":[\w:]+:`(~?)([^`<]+?)(?:\s*<[^`>]*>)?`")
"""A Sphinx cross-reference, ``:role:`target```, ``:role:`~a.b.target``` or ``:role:`title <target>```."""


def plain_text(text: str) -> str:
    """``text`` without the Sphinx markup of a docstring, for ``--help``.

    A role becomes its text (``~`` its last dotted part, ``title <target>`` its
    title); a double-backquoted literal loses its backquotes.
    """
    text = _ROLE.sub(lambda match: match[2].rsplit(".", 1)[-1] if match[1] else match[2], text)
    return re.sub(r"``([^`]+)``", r"\1", text)


def _check_doc() -> str:
    """The docstring of :mod:`moe_core.check`, read from its source: importing it would import torch."""
    return ast.get_docstring(ast.parse(Path(__file__).with_name("check.py").read_text())) or ""


def output_width() -> int:
    """The columns a table fits: the terminal's when stdout is one, else :data:`TABLE_WIDTH`."""
    return shutil.get_terminal_size((TABLE_WIDTH, 24)).columns if sys.stdout.isatty() else TABLE_WIDTH


def _column_widths(natural: Sequence[int], narrowest: Sequence[int], room: int) -> list[int]:
    """The widths under the largest common cap that fits ``room``, none below its narrowest: the widest narrow first."""
    for cap in range(max(natural, default=0), -1, -1):
        widths = [max(low, min(high, cap)) for high, low in zip(natural, narrowest)]
        if sum(widths) <= room:
            return widths
    return list(narrowest)


def _wrap(cell: str, width: int) -> list[str]:
    if len(cell) <= width:
        return [cell]
    return textwrap.wrap(cell, width, break_long_words=False, break_on_hyphens=False) or [""]


def format_table(headers: Sequence[str], rows: Sequence[Sequence[str]], *, width: int | None = None) -> str:
    """A plain-text table with left-aligned columns, fitted to ``width`` columns (default: :func:`output_width`).

    Where the rows are wider, the widest columns narrow first and their cells
    wrap at spaces onto continuation lines, whose first cell is blank when the
    first column holds no spaces. Headers and words are never broken: a table
    whose headers or longest words do not fit comes out wider than ``width``.
    """
    columns = list(zip(headers, *rows))
    natural = [max(len(cell) for cell in column) for column in columns]
    narrowest = [max([len(column[0]), *(len(word) for cell in column[1:] for word in cell.split())]) for column in columns]
    room = (output_width() if width is None else width) - 2 * (len(columns) - 1)
    widths = _column_widths(natural, narrowest, room)

    def line(cells: Sequence[str]) -> str:
        return "  ".join(cell.ljust(width) for cell, width in zip(cells, widths)).rstrip()

    lines = [line(headers), "  ".join("-" * width for width in widths)]
    for row in rows:
        wrapped = [_wrap(cell, width) for cell, width in zip(row, widths)]
        lines += [line(cells) for cells in zip_longest(*wrapped, fillvalue="")]
    return "\n".join(lines)


class _VersionAction(argparse.Action):
    """``--version``: the installed distribution's version, looked up only when asked (importlib.metadata takes ~30 ms)."""

    def __init__(self, option_strings: Sequence[str], dest: str, help: str | None = None) -> None:
        super().__init__(option_strings, dest=argparse.SUPPRESS, default=argparse.SUPPRESS, nargs=0, help=help)

    def __call__(
        self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: object, option_string: str | None = None
    ) -> None:
        from importlib.metadata import PackageNotFoundError, version

        try:
            text = version(DISTRIBUTION)
        except PackageNotFoundError:
            text = f"unknown (the {DISTRIBUTION} distribution is not installed)"
        print(f"{parser.prog} {text}")
        parser.exit()


def _device(text: str) -> torch.device:
    import torch

    try:
        return torch.device(text)
    except RuntimeError as error:
        raise argparse.ArgumentTypeError(f"expected a torch device, got {text!r} ({error})") from None


def _device_spec(text: str) -> DeviceSpec:
    from moe_core.capability import DeviceSpec

    try:
        return DeviceSpec.parse(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def _dtype(name: str) -> torch.dtype:
    """The torch dtype of ``--dtype``'s ``name`` (one of :data:`DTYPE_NAMES`)."""
    import torch

    return {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[name]


def _int_in(text: str, what: str, minimum: int, maximum: int | None = None) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from None
    if value < minimum or (maximum is not None and value > maximum):
        raise argparse.ArgumentTypeError(f"expected {what}, got {value}")
    return value


def _positive_int(text: str) -> int:
    return _int_in(text, "a positive integer", 1)


def _non_negative_int(text: str) -> int:
    return _int_in(text, "an integer >= 0", 0)


def _seed(text: str) -> int:
    low, high = SEED_RANGE
    return _int_in(text, "an integer from -2**63 to 2**64 - 1 (torch.Generator.manual_seed's range)", low, high)


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
    import torch

    from moe_core.selection_table import INFO_LAYER, broken_backends, candidate_rows

    rows = candidate_rows(device)
    broken = broken_backends(device)
    for name, reason in broken:
        _progress(f"warning: backend {name} is broken: {reason}")
    if as_json:
        print(json.dumps([row.as_json() for row in rows], indent=1))
        return 1 if broken else 0
    layer = INFO_LAYER
    print(f"moe-core on {device.describe()} (torch {torch.__version__}): each format's candidates in rank order")
    print(
        f"for a layer of {layer.num_experts} experts, top {layer.top_k}, hidden {layer.hidden_size}, "
        f"intermediate {layer.intermediate_size_per_partition}, bf16 hidden states"
    )
    table = [
        [
            row.format,
            row.backend,
            row.tier,
            "yes" if row.chosen else "-",
            "ok" if row.supported else "; ".join(row.reasons),
            row.degradation.removeprefix(f"{row.format} ") if row.degradation else "-",  # the row names the source
        ]
        for row in rows
    ]
    print(format_table(["format", "backend", "tier", "chosen", "answer", "degradation"], table))
    print(f"\nmoe-core schemes on {device.describe()}: the backend each would run its layers on")
    print(format_table(["scheme", "format", "would run on"], _scheme_rows(rows)))
    print("\nthe activations and routing methods each backend computes (asked of its own supports)")
    print(format_table(["backend", "activations", "routing methods"], _capability_rows(device)))
    print(f"\nwhat computes each routing method's top-k (route, MoeLayer) on {device.describe()}")
    print(format_table(["routing method", "top-k by"], _routing_rows(device, layer)))
    if broken:
        print("\nbroken backends (a faulty plugin: its check raised, or its module failed to load)")
        print(format_table(["backend", "problem"], [list(row) for row in broken]))
    return 1 if broken else 0


def _capability_rows(device: DeviceSpec) -> list[list[str]]:
    from moe_core.capability_listing import capability_table

    return [
        [row.backend, ", ".join(row.supported_activations()) or "-", ", ".join(row.supported_routings()) or "-"]
        for row in capability_table(device)
    ]


def _routing_rows(device: DeviceSpec, layer: MoeRunnerConfig) -> list[list[str]]:
    import attrs
    import torch

    from moe_core.config import example_routings
    from moe_core.routing import routing_summary

    def top_k_by(method: Routing) -> str:
        if not device.has("triton"):
            return "select_experts (no triton on the device)"
        return routing_summary(attrs.evolve(layer, routing_method=method), torch.device(device.kind)).removeprefix("routing: ")

    return [[method.value, top_k_by(method)] for method in example_routings(layer.num_experts, layer.top_k)]


def _scheme_rows(rows: Sequence[CandidateRow]) -> list[list[str]]:
    from moe_core.schemes import OPT_IN_SCHEMES, SCHEMES

    chosen = {row.format: row for row in rows if row.chosen}
    table = []
    for spec in (*SCHEMES, *OPT_IN_SCHEMES):
        row = chosen.get(spec.format.name)
        where = "nothing fits" if row is None else row.backend + (f" (degraded: {row.degradation})" if row.degradation else "")
        name = spec.name + (" (opt-in: scheme=)" if spec in OPT_IN_SCHEMES else "")
        table.append([name, spec.format.name, where])
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
    return EXIT_FAILED if any(row.failed for row in rows) else EXIT_OK


def _plugin_rows(plugin_errors: dict[str, str]) -> list[CheckRow]:
    from moe_core.check import CheckRow

    return [
        CheckRow("-", f"entry point {name}", "-", None, None, None, None, f"FAILED: did not load: {error}")
        for name, error in plugin_errors.items()
    ]


def _check(args: argparse.Namespace, plugin_errors: dict[str, str]) -> int:
    import torch

    from moe_core.check import FORMAT_CHECKS, CheckRun, unchecked_formats
    from moe_core.config import MoeRunnerConfig
    from moe_core.registry import registered_backends
    from moe_core.synthetic import random_dense_layer

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
    source, dispatch = random_dense_layer(config, args.tokens, _dtype(args.dtype), args.device, args.seed)
    backends = registered_backends()
    rows: list[CheckRow] = []
    run = CheckRun(config, source, dispatch, backends, args.tolerance, args.iters, _progress, seed=args.seed)
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
    import torch

    from moe_core.check import FORMAT_CHECKS, CheckRun
    from moe_core.checkpoint import MoeCheckpoint
    from moe_core.dispatch import StandardDispatchOutput
    from moe_core.formats import DenseMoeWeights
    from moe_core.formats._experts import Dequantizes
    from moe_core.registry import registered_backends
    from moe_core.routing import route

    checkpoint = MoeCheckpoint(args.checkpoint)
    layers = checkpoint.moe_layers()
    layer = layers[0] if args.layer is None and layers else args.layer
    spec = checkpoint.scheme()
    _progress(f"moe-core check: loading layer {layer} of {checkpoint.directory} through the {spec.name} scheme")
    scheme = checkpoint.load_layer(layer, device=args.device, keep_canonical=True, activation_dtype=_dtype(args.dtype))
    weights = scheme.weights
    checks = [check for check in FORMAT_CHECKS if check.format is spec.format]
    if weights is None or not checks:
        print(f"moe-core check: no check covers the {spec.format.name} format of {spec.name}", file=sys.stderr)
        return EXIT_BAD_INPUT
    config = scheme.config
    gen = torch.Generator().manual_seed(args.seed)
    x = torch.randn(args.tokens, config.hidden_size, generator=gen).to(_dtype(args.dtype)).to(args.device)
    dispatch = StandardDispatchOutput(x, route(x, checkpoint.router(layer, device=torch.device(args.device)), config))
    dequantized: DenseMoeWeights | None = None
    if isinstance(weights, DenseMoeWeights):
        source = weights
    elif isinstance(weights, Dequantizes):
        dequantized = source = weights.dequantize()
    else:
        print(f"moe-core check: cannot dequantize {type(weights).__name__}", file=sys.stderr)
        return EXIT_BAD_INPUT
    run = CheckRun(config, source, dispatch, registered_backends(), args.tolerance, args.iters, _progress, seed=args.seed)
    rows = checks[0].rows_for(run, weights, dequantized, "float64 MoE, dequantized weights, no activation quantization")
    rows += _plugin_rows(plugin_errors)
    print(
        f"moe-core check on {args.device} (torch {torch.__version__}): {checkpoint.directory}, layer {layer} "
        f"({checkpoint.model_type}: {config.num_experts} experts, top {config.top_k}, hidden {config.hidden_size}, "
        f"intermediate {config.intermediate_size_per_partition}); {scheme.backend_summary()}; "
        f"{args.tokens} tokens of {args.dtype} routed by the checkpoint's router, seed {args.seed}"
    )
    if checkpoint.shared_expert_keys(layer):
        print(
            f"moe-core check: the routed experts only; layer {layer} also has a shared expert, which the model adds "
            "once per token (MoeCheckpoint.shared_expert)"
        )
    return _print_rows(rows)


def _parser() -> argparse.ArgumentParser:
    raw = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(
        prog="moe-core", description=plain_text((__doc__ or "").splitlines()[0]), epilog=EXIT_CODES, formatter_class=raw
    )
    parser.add_argument("--version", action=_VersionAction, help=f"print the installed {DISTRIBUTION} version and exit")
    commands = parser.add_subparsers(dest="command", required=True)
    info = commands.add_parser(
        "info",
        help="each format's candidate backends on a device, their answers, and the one chosen",
        epilog=EXIT_CODES,
        formatter_class=raw,
    )
    info.add_argument(
        "--device",
        type=_device_spec,
        default="cpu",
        help="a device here (cpu, cuda:0) or described (sm90, sm100; +pkg/-pkg: with or without a package) (cpu)",
    )
    info.add_argument("--json", action="store_true", help="print the rows as a JSON list")
    check = commands.add_parser(
        "check",
        help="check the references and every available backend on a random MoE layer",
        description=plain_text(_check_doc()),
        epilog=EXIT_CODES,
        formatter_class=raw,
    )
    check.add_argument("--device", type=_device, default="cpu", help="device to run on (cpu)")
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
    check.add_argument("--dtype", choices=DTYPE_NAMES, default="bf16", help="activation dtype (bf16)")
    check.add_argument("--seed", type=_seed, default=0, help="random seed, from -2**63 to 2**64 - 1 (0)")
    check.add_argument("--iters", type=_positive_int, default=5, help="fewest timed calls per backend (5)")
    check.add_argument(
        "--tolerance",
        type=_positive_float,
        help="largest relative l2 error of a backend against its format's reference that passes (default: 5e-2 for "
        "formats that quantize activations, else two epsilons of --dtype, at least 5e-3 on CUDA (TF32), 1e-5 elsewhere)",
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
    needed, memory = 4 * args.experts * 3 * args.hidden * args.intermediate, _memory_bytes(args.device)
    if memory is not None and needed > memory:
        parser.error(
            f"arguments --experts, --hidden, --intermediate: the random layer's float32 weights alone take "
            f"{needed / 2**30:.3g} GiB, more than the {memory / 2**30:.3g} GiB of memory {args.device} has"
        )


def _memory_bytes(device: torch.device) -> int | None:
    """The memory ``device`` has in all (a CUDA device's, or this machine's for the CPU); None where unknown."""
    import torch

    if device.type == "cuda" and torch.cuda.is_available():
        return int(torch.cuda.mem_get_info(device)[1])
    if device.type == "cpu" and hasattr(os, "sysconf"):
        return int(os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
    return None


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``moe-core`` and ``python -m moe_core``; returns the exit code (``EXIT_*``)."""
    parser = _parser()
    args = parser.parse_args(argv)
    if args.command == "check":
        _resolve_sizes(parser, args)
    if args.command == "info":
        return _info(args.device, args.json)
    from moe_core.backends.reference import reference_device_support
    from moe_core.capability import DeviceSpec
    from moe_core.checkpoint import CorruptCheckpoint
    from moe_core.registry import plugin_errors as registry_plugin_errors

    plugin_errors = registry_plugin_errors()
    for name, error in plugin_errors.items():
        _progress(f"warning: backend entry point {name!r} failed to load: {error}")
    reference = reference_device_support(DeviceSpec.of(args.device))
    if not reference.ok:
        print(f"moe-core check: the reference backends cannot run on {args.device}: {'; '.join(reference.reasons)}",
              file=sys.stderr)
        return EXIT_BAD_INPUT
    if args.checkpoint is not None:
        try:
            return _check_checkpoint(args, plugin_errors)
        except (OSError, ValueError, TypeError, KeyError) as error:
            print(f"moe-core check: {type(error).__name__}: {error}", file=sys.stderr)
            return EXIT_CORRUPT_CHECKPOINT if isinstance(error, CorruptCheckpoint) else EXIT_BAD_INPUT
    return _check(args, plugin_errors)
