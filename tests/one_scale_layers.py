"""The canonical layer a kernel with one FC1 scale per expert really runs: w1/w3 fused onto one scale, split back.

The reference backends then compute exactly what such a kernel should, so
an adapter's output can be held to a tight tolerance.
"""

from __future__ import annotations

import attrs

from moe_core import (
    ExpertFp8Scales,
    Fp8ExpertWeights,
    Fp8GateUpWeights,
    Fp8MoeWeights,
    GateUpScalePolicy,
    LinearBlockScales,
    Nvfp4ExpertWeights,
    Nvfp4GateUpWeights,
    Nvfp4MoeWeights,
)


def nvfp4_shared_scale(weights: Nvfp4MoeWeights) -> Nvfp4MoeWeights:
    """The same layer with w1/w3 fused onto one scale per expert (what a one-alpha kernel runs), split back into halves."""
    fused = weights.w13.with_shared_global_scales(GateUpScalePolicy.RESCALE_BLOCK_SCALES)
    inter = weights.intermediate_size
    halves = [
        Nvfp4ExpertWeights(fused.packed[:, rows], LinearBlockScales.from_checkpoint(fused.block_scales.data[:, rows]), fused.global_scales)
        for rows in (slice(0, inter), slice(inter, 2 * inter))
    ]
    return attrs.evolve(weights, w13=Nvfp4GateUpWeights(gate=halves[0], up=halves[1]))


def fp8_shared_scale(weights: Fp8MoeWeights) -> Fp8MoeWeights:
    """The same FP8 layer with w1/w3 on one scale per expert (what the one-scale kernel runs), split back into halves."""
    fused = weights.w13.with_shared_scale()
    inter = weights.intermediate_size
    halves = [Fp8ExpertWeights(fused.codes[:, rows], ExpertFp8Scales.from_checkpoint(fused.scales.value)) for rows in (slice(0, inter), slice(inter, 2 * inter))]
    return attrs.evolve(weights, w13=Fp8GateUpWeights(gate=halves[0], up=halves[1]))
