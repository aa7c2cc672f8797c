"""A library user's run: a checkpoint loaded through its scheme runs the fastest kernel that fits, nothing imported.

Imports only the schemes and the checkpoint reader (no backend module, no
registration call), loads each fixture checkpoint's first MoE layer onto the
GPU, and prints the backend chosen (with any degradation), the time per
``apply`` call, and the error against the reference backends on the same
layer and batch. Run from an installed wheel:

    python benchmarks/scheme_from_wheel.py tests/fixtures [--device cuda] [--tokens 64]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch

from moe_core.checkpoint import MoeCheckpoint
from moe_core.dispatch import StandardDispatchOutput
from moe_core.routing import route

REFERENCES = {"nvfp4": ("reference-nvfp4-w4a16", "reference-nvfp4"), "dense": ("reference-dense",)}
"""What each format's chosen backend is compared with: the computation it runs first, then the format's own oracle."""


def per_call_ms(apply: object, dispatch: StandardDispatchOutput, calls: int) -> float:
    """Median wall time of one ``apply(dispatch)``, synchronized, after three warm-up calls."""
    assert callable(apply)
    for _ in range(3):
        apply(dispatch)
    times = []
    for _ in range(calls):
        torch.cuda.synchronize() if torch.cuda.is_available() else None
        start = time.perf_counter()
        apply(dispatch)
        torch.cuda.synchronize() if torch.cuda.is_available() else None
        times.append((time.perf_counter() - start) * 1e3)
    return sorted(times)[len(times) // 2]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("fixtures", type=Path)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--calls", type=int, default=50)
    args = parser.parse_args()
    device = torch.device(args.device)
    print(f"torch {torch.__version__}, device {device}" + (f" ({torch.cuda.get_device_name(device)})" if device.type == "cuda" else ""))
    print("| checkpoint | scheme | backend chosen | ms/call | compared with | rel err |")
    print("|---|---|---|---|---|---|")
    for directory in sorted(path for path in args.fixtures.iterdir() if (path / "config.json").exists()):
        checkpoint = MoeCheckpoint(directory)
        layer = checkpoint.moe_layers()[0]
        scheme = checkpoint.load_layer(layer, device=device)
        gen = torch.Generator().manual_seed(0)
        x = torch.randn(args.tokens, checkpoint.hidden_size, generator=gen).to(torch.bfloat16).to(device)
        dispatch = StandardDispatchOutput(x, route(x, checkpoint.router(layer, device=device), scheme.config))
        chosen = scheme.backend_summary().split("; passed over")[0]
        out = scheme.apply(dispatch).float()
        ms = per_call_ms(scheme.apply, dispatch, args.calls)
        for name in REFERENCES[scheme.format.name]:
            expected = checkpoint.load_layer(layer, device=device, backend=name).apply(dispatch).float()
            err = float((out - expected).norm() / expected.norm())
            print(f"| {directory.name} | {chosen.split(':')[0]} | {chosen.split(': ', 1)[1]} | {ms:.3f} | {name} | {err:.2e} |")


if __name__ == "__main__":
    main()
