"""Block sizes for the fused MoE kernels: tuned per shape and device, with a heuristic for the rest.

Tuned tables live in ``configs/<device>.json`` (written by
``benchmarks/tune_triton_moe.py``), keyed by the layer's ``E,H,I,top_k,format``
(``format`` ``bf16``, ``fp16``, ``fp8``, ``fp8-block``, ``nvfp4`` or ``mxfp4``), then by a token count, each entry
holding both GEMMs' configs (``w13`` and ``w2``, one ``block_m``: the tokens
are sorted once); a call takes the entry of the nearest tuned token count
within one doubling (:data:`MAX_TUNED_DISTANCE`).
Untuned shapes and devices use :func:`heuristic`. ``MOE_CORE_TRITON_CONFIGS``
names another directory of such tables (an engine's own tuning, or a tuning
run's output), read instead of the package's. Beside each table,
``<device>.nvfp4_dequantize.json`` holds the measured token counts (as rows per
expert) from which NVFP4 W4A16 dequantizes into a workspace
(:func:`nvfp4_dequantizes`), and MXFP4 W4A16's under its own layer keys
(format ``mxfp4``, :func:`mxfp4_dequantizes`).
"""

from __future__ import annotations

import functools
import json
import math
import os
from collections.abc import Mapping
from pathlib import Path
from typing import final

import attrs

CONFIG_DIR = Path(__file__).resolve().parent / "configs"
CONFIG_DIR_VARIABLE = "MOE_CORE_TRITON_CONFIGS"
"""The environment variable naming a directory of tuned tables read instead of :data:`CONFIG_DIR` (each device's
table is read once per process, at its first forward: set it before)."""
MAX_TUNED_DISTANCE = 1.0
"""A tuned entry serves token counts within this many doublings of its own; farther ones use the heuristic
(seen on the H200: Mixtral T=256 with T=64's 16-row blocks ran at 0.44x of torch._grouped_mm)."""


@final
@attrs.frozen
class KernelConfig:
    """One launch's tile sizes and schedule."""

    block_m: int
    block_n: int
    block_k: int
    group_m: int = 8
    num_warps: int = 4
    num_stages: int = 3

    def as_dict(self) -> dict[str, int]:
        """The fields by name, as the JSON tables store them."""
        return attrs.asdict(self)


def layer_key(experts: int, hidden: int, inter: int, top_k: int, fmt: str) -> str:
    """The table key of one layer shape."""
    return f"{experts},{hidden},{inter},{top_k},{fmt}"


def device_file(device_name: str) -> Path:
    """The tuned table's path for a device name as torch reports it (under ``$MOE_CORE_TRITON_CONFIGS`` if set)."""
    directory = os.environ.get(CONFIG_DIR_VARIABLE)
    if directory and not Path(directory).is_dir():
        raise ValueError(f"${CONFIG_DIR_VARIABLE}={directory!r} is not a directory (tuned tables would go unread)")
    return (Path(directory) if directory else CONFIG_DIR) / (device_name.replace(" ", "_") + ".json")


def _json_object(path: Path, what: str) -> dict[str, object]:
    """The JSON object in ``path``, refused by the file's name where it is not one (``what`` it should be)."""
    try:
        data: object = json.loads(path.read_text())
    except json.JSONDecodeError as error:
        raise ValueError(f"{path}: not {what} ({error})") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a JSON object of layer keys, got {type(data).__name__}")
    return data


@functools.cache
def _table(device_name: str) -> dict[str, object]:
    path = device_file(device_name)
    return _json_object(path, "a tuned table") if path.exists() else {}


_FIELDS = frozenset(attrs.fields_dict(KernelConfig))


def _tuned_gemm(entry: Mapping[str, object], gemm: str, where: str) -> KernelConfig:
    """One GEMM's config of a tuned entry, its fields KernelConfig's, each a positive int (block sizes powers of 2)."""
    config = entry.get(gemm)
    if not isinstance(config, Mapping):
        raise ValueError(f"{where}: expected a {gemm!r} config, got {config!r}")
    unknown, missing = set(config) - _FIELDS, {"block_m", "block_n", "block_k"} - set(config)
    if unknown or missing:
        raise ValueError(
            f"{where}.{gemm}: expected the fields {sorted(_FIELDS)} (block_m, block_n, block_k required), "
            f"got unknown {sorted(unknown)} and missing {sorted(missing)} (a table written by benchmarks/tune_triton_moe.py)"
        )
    for name, value in config.items():
        power = name.startswith("block_") or name == "num_warps"  # Triton takes warps in powers of 2 only
        if not isinstance(value, int) or isinstance(value, bool) or value < 1 or (power and value & (value - 1)):
            raise ValueError(f"{where}.{gemm}.{name}: expected a positive int{' (a power of 2)' if power else ''}, got {value!r}")
    return KernelConfig(**{name: int(str(value)) for name, value in config.items()})


def checked_entry(entry: object, fmt: str, where: str) -> tuple[KernelConfig, KernelConfig]:
    """A tuned entry's ``(w13, w2)`` configs, refused by name (``where``: the table, key and token count) unless the
    kernels compute with them: one ``block_m`` for both GEMMs (the tokens are sorted once, in its blocks), and K
    tiles the format's decoding and scales take (adversarial pass 16, c13: other row blocks read the sort's padding,
    1.1-1.3 off; 256-deep block-FP8 tiles cross their 128-element scale blocks, 0.16-0.52 off)."""
    if not isinstance(entry, Mapping):
        raise ValueError(f"{where}: expected an entry with 'w13' and 'w2' configs, got {entry!r}")
    w13, w2 = _tuned_gemm(entry, "w13", where), _tuned_gemm(entry, "w2", where)
    if w13.block_m != w2.block_m:
        raise ValueError(f"{where}: w13's block_m {w13.block_m} and w2's {w2.block_m} differ; both GEMMs read one sort of the tokens, in one block_m")
    smallest = 32 if fmt in ONE_BYTE_FORMATS else 16
    widest = 128 if fmt == "fp8-block" else 256
    for gemm, config in (("w13", w13), ("w2", w2)):
        if not smallest <= config.block_k <= widest:
            raise ValueError(f"{where}.{gemm}.block_k: {fmt} K tiles hold {smallest} to {widest} elements, got {config.block_k}")
        if min(config.block_m, config.block_n) < 16:  # tl.dot's smallest tile
            raise ValueError(f"{where}.{gemm}: tiles of at least 16 rows and columns (tl.dot's smallest), got {config.block_m} x {config.block_n}")
    return w13, w2


ONE_BYTE_FORMATS = ("nvfp4", "mxfp4", "fp8", "fp8-block")
"""Formats whose weights take a byte or less per element: K tiles up to 256 and at least 32 (FP8 dot products need
K >= 32; NVFP4 tiles hold whole 32-element pairs of blocks, MXFP4 tiles whole 32-element blocks)."""


def widest_block_k(k: int, fmt: str, widest: int) -> int:
    """The widest K tile up to ``widest`` that divides ``k``."""
    one_byte = fmt in ONE_BYTE_FORMATS
    smallest = 32 if one_byte else 16
    block_k = min(widest, 256 if fmt in ("nvfp4", "mxfp4", "fp8") else 128)  # a block-scaled tile stays inside its 128 block
    while block_k > smallest and k % block_k:
        block_k //= 2
    return block_k


DECODE_ROWS = 16
"""Up to this many rows per expert on average a GEMM reads weights, not computes. From half of it, routing puts more
than 16 rows on most experts: 16-row blocks would read their weights twice, so 32-row blocks, the blocks of one
expert side by side (``group_m``); seen on the H200 at Mixtral T=64: 0.969 -> 0.658 ms bf16, 0.519 -> 0.399 FP8."""


NVFP4_DEQUANTIZE_ROWS = 32
"""Untuned shapes: from this many rows per local expert on average, NVFP4 W4A16 expands its weights into a 16-bit
workspace (one pass, 2.56 bytes moved per weight) and runs the 16-bit kernels, instead of decoding every weight tile
again in each row block of the fused kernel. Mixtral's crossover on the H200 (16-32 rows per expert)."""


def crossover_file(device_name: str) -> Path:
    """The measured NVFP4 and MXFP4 W4A16 crossovers' path beside the device's tuned table: ``{layer key:
    {"rows_per_expert": n, ...}}``, each from ``benchmarks/bench_moe.py --backends triton-nvfp4-w4a16-paths`` (or
    ``triton-mxfp4-w4a16-paths``) on that device."""
    table = device_file(device_name)
    return table.with_name(table.stem + ".nvfp4_dequantize.json")


@functools.cache
def _crossovers(device_name: str) -> dict[str, int]:
    path = crossover_file(device_name)
    if not path.exists():
        return {}
    crossovers = {}
    for key, entry in _json_object(path, "a table of crossovers").items():
        rows = entry.get("rows_per_expert") if isinstance(entry, dict) else None
        if not isinstance(rows, int) or isinstance(rows, bool) or rows < 1:
            raise ValueError(f"{path}: {key}: expected {{\"rows_per_expert\": a positive int, ...}}, got {entry!r}")
        crossovers[key] = rows
    return crossovers


def nvfp4_dequantizes(
    device_name: str, tokens: int, top_k: int, experts: int, hidden: int, inter: int, interpreted: bool
) -> bool:
    """Whether NVFP4 W4A16 takes the dequantize-then-16-bit path for ``tokens`` (prefill) over the fused one (decode).

    The crossover depends on the shape, not only on rows per expert (on the
    H200: Mixtral 16-32 rows per expert, Qwen3's E=128 I=768 64-256, whose
    fused tiles run near its slow 16-bit ones): the device's measured one
    for this layer (:func:`crossover_file`), else :data:`NVFP4_DEQUANTIZE_ROWS`.
    """
    measured = None if interpreted else _crossovers(device_name).get(layer_key(experts, hidden, inter, top_k, "nvfp4"))
    return tokens * top_k >= (NVFP4_DEQUANTIZE_ROWS if measured is None else measured) * experts


MXFP4_DEQUANTIZE_ROWS = 32
"""Untuned shapes: from this many rows per local expert on average, MXFP4 W4A16 expands its weights into a bf16
workspace and runs the 16-bit kernels. gpt-oss-120b's layer (E=128, I=2880) crosses between 16 and 32 on the H200
(T=512: fused 3.83 ms, workspace 4.18; T=1024: 7.14 and 4.80), like NVFP4's Mixtral."""


def mxfp4_dequantizes(
    device_name: str, tokens: int, top_k: int, experts: int, hidden: int, inter: int, interpreted: bool
) -> bool:
    """Whether MXFP4 W4A16 takes the dequantize-then-bf16 path for ``tokens`` over the fused one: the device's
    measured crossover for this layer (:func:`crossover_file`, format ``mxfp4``), else :data:`MXFP4_DEQUANTIZE_ROWS`."""
    measured = None if interpreted else _crossovers(device_name).get(layer_key(experts, hidden, inter, top_k, "mxfp4"))
    return tokens * top_k >= (MXFP4_DEQUANTIZE_ROWS if measured is None else measured) * experts


FP8_WIDE_ROWS = 512
"""Per-tensor and per-channel FP8 above 128 and up to this many rows per expert: 64 x 256 tiles with 8 warps, what
the tuner chose on every layer measured there (H200 Mixtral at 256 rows per expert; H100 Qwen3-30B at 256 and 512),
where the 128 x 128 prefill tiles ran at 78-89% of it (H100 Qwen3). At 128 rows the H200 chose 64-row blocks of 64
and 128 columns (DeepSeek-V3); beyond 512, 128 x 128 (both devices, 1024-2048 rows)."""


def _fp8_tiles(
    rows_per_expert: float, block_m: int, block_n: int, widest: int, warps: int, stages: int
) -> tuple[int, int, int, int, int]:
    """The FP8 (per-tensor, per-channel) tiles where the tuned tables of both Hoppers agree and the 16-bit tiles did
    not: 256-deep K tiles where 32-row blocks begin (one-byte elements: the bytes of bf16's 128), 128 columns from 32
    rows per expert (up to 128), 64 x 256 up to :data:`FP8_WIDE_ROWS` rows."""
    if DECODE_ROWS / 2 < rows_per_expert <= DECODE_ROWS:
        return block_m, block_n, 256, warps, stages
    if DECODE_ROWS < rows_per_expert <= 64:
        return block_m, 128 if rows_per_expert > 32 else block_n, widest, warps, stages
    if 64 < rows_per_expert <= 128:
        return 64, 128, 128, 4, 4
    if 128 < rows_per_expert <= FP8_WIDE_ROWS:
        return 64, 256, 128, 8, 3
    return block_m, block_n, widest, warps, stages


def heuristic(
    tokens: int, top_k: int, experts: int, hidden: int, inter: int, fmt: str, interpreted: bool
) -> tuple[KernelConfig, KernelConfig]:
    """Both GEMMs' block sizes from the shape alone: small row blocks and wide K at decode, big tiles at prefill.

    ``interpreted`` (Triton's CPU interpreter, slow per program): the biggest
    tiles the tiny test shapes allow.
    """
    rows_per_expert = tokens * top_k / experts
    if interpreted:
        block_m, block_n, widest, warps, stages, group = 16, 64, 256, 4, 1, 8
    elif rows_per_expert <= DECODE_ROWS / 2:
        block_m, block_n, widest, warps, stages, group = 16, 64, 256, 4, 4, 1
    elif rows_per_expert <= DECODE_ROWS:
        block_m, block_n, widest, warps, stages, group = 32, 64, 128, 4, 3, 8
    elif rows_per_expert <= 64:
        block_m, block_n, widest, warps, stages, group = 64, 64, 128, 4, 4, 8
    else:
        block_m, block_n, widest, warps, stages, group = 128, 128, 64, 8, 3, 8
    if fmt in ("fp8", "fp8-block"):
        widest = max(widest, 128)  # 128 one-byte K elements: the bytes of bf16's 64
    if fmt == "fp8" and not interpreted:
        block_m, block_n, widest, warps, stages = _fp8_tiles(rows_per_expert, block_m, block_n, widest, warps, stages)
    if fmt == "fp8-block" and block_m == 128:
        block_n = 64  # each K tile's fresh products sit beside both accumulators: half the columns, no spills
    return (
        KernelConfig(block_m, block_n, widest_block_k(hidden, fmt, widest), group, warps, stages),
        KernelConfig(block_m, block_n, widest_block_k(inter, fmt, widest), group, warps, stages),
    )


@functools.lru_cache(maxsize=4096)
def choose(
    device_name: str, tokens: int, top_k: int, experts: int, hidden: int, inter: int, fmt: str, interpreted: bool
) -> tuple[KernelConfig, KernelConfig]:
    """The tuned ``(w13, w2)`` configs of this layer nearest to ``tokens``, else :func:`heuristic`.

    Memoized: a forward asks with the same few arguments every step, and the answer is a pure function of them.
    """
    key = layer_key(experts, hidden, inter, top_k, fmt)
    entries = None if interpreted else _table(device_name).get(key)
    if entries:
        where = f"{device_file(device_name)}: {key!r}"
        if not isinstance(entries, Mapping) or not all(isinstance(c, str) and c.isdigit() and int(c) > 0 for c in entries):
            raise ValueError(f"{where}: expected entries by token count (positive integers), got {entries!r}")
        count = min(entries, key=lambda tuned: abs(math.log2(int(tuned) / tokens)))
        if abs(math.log2(int(count) / tokens)) <= MAX_TUNED_DISTANCE:
            return checked_entry(entries[count], fmt, f"{where}[{count!r}]")
    return heuristic(tokens, top_k, experts, hidden, inter, fmt, interpreted)
