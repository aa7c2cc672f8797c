"""``create_runner`` infers the runner's quant info type from the key; routes and choices keep it."""

import torch
from typing_extensions import assert_type

from moe_core import (
    NVFP4,
    LayerSpec,
    BackendKey,
    BoundRunner,
    DenseMoeWeights,
    DispatchOutput,
    MoeRunnerConfig,
    Nvfp4MoeWeights,
    Route,
    Runner,
    create_runner,
    select_backend,
)
from moe_core.backends.reference import REFERENCE_DENSE, REFERENCE_NVFP4


def forward(config: MoeRunnerConfig, dispatch: DispatchOutput, weights: Nvfp4MoeWeights) -> torch.Tensor:
    runner = create_runner(REFERENCE_NVFP4, config)
    assert_type(runner, Runner[Nvfp4MoeWeights])
    dense_runner = create_runner(REFERENCE_DENSE, config)
    assert_type(dense_runner, Runner[DenseMoeWeights])
    route = REFERENCE_NVFP4.route(NVFP4)
    assert_type(route, Route[Nvfp4MoeWeights, Nvfp4MoeWeights])
    bound = route.bind(config, weights)
    assert_type(bound, BoundRunner[Nvfp4MoeWeights])
    return runner.run(dispatch, weights) + dense_runner.run(dispatch, weights.dequantize()) + bound(dispatch)


def by_name_among_keys(config: MoeRunnerConfig, name: str | None) -> Runner[Nvfp4MoeWeights]:
    """Keys of one quant info type: the chosen one keeps it."""
    keys: list[BackendKey[Nvfp4MoeWeights]] = [REFERENCE_NVFP4]
    chosen = select_backend(keys, torch.device("cpu"), LayerSpec(config, NVFP4), name=name).chosen
    assert_type(chosen, BackendKey[Nvfp4MoeWeights])
    return create_runner(chosen, config)

