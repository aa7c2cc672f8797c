"""After loading, a layer holds its expert weights once: in the chosen backend's layout, nothing else beside it."""

from __future__ import annotations

import gc
from pathlib import Path

import pytest
import torch

from moe_core.checkpoint import MoeCheckpoint
from moe_core.registry import BoundRunner
from moe_core.scheme import ExpertScheme
from tests.checkpoint_oracles import BF16, CT_NVFP4, CT_SPLIT, MODELOPT

LIMIT = 1.05
"""Reachable bytes over the backend layout's bytes (the issue's bound; the input scales' scalars are in both)."""


def _owned_by_moe_core(value: object) -> bool:
    module = type(value).__module__
    return module.startswith(("moe_core", "schemes", "backends"))


def storage_bytes(root: object) -> int:
    """Bytes of the distinct tensor storages reachable from ``root`` through moe-core's objects and containers."""
    seen: set[int] = set()
    storages: dict[int, int] = {}
    stack = [root]
    while stack:
        value = stack.pop()
        if id(value) in seen:
            continue
        seen.add(id(value))
        if isinstance(value, torch.Tensor):
            storage = value.untyped_storage()
            storages[storage.data_ptr()] = storage.nbytes()
        elif isinstance(value, (dict, list, tuple, set, frozenset)) or _owned_by_moe_core(value):
            stack.extend(gc.get_referents(value))
    return sum(storages.values())


@pytest.mark.parametrize(
    ("directory", "backend"),
    [(CT_NVFP4, None), (CT_SPLIT, None), (MODELOPT, None), (BF16, None), (BF16, "triton-dense"), (CT_NVFP4, "triton-nvfp4-w4a16")],
    ids=["ct-nvfp4", "ct-split", "modelopt", "bf16", "bf16-triton", "ct-nvfp4-triton-w4a16"],
)
def test_a_loaded_layer_holds_its_weights_once(directory: Path, backend: str | None) -> None:
    checkpoint = MoeCheckpoint(directory)
    scheme = checkpoint.load_layer(checkpoint.moe_layers()[0], backend=backend)
    assert isinstance(scheme, ExpertScheme)
    assert isinstance(scheme.forward, BoundRunner)
    layout = storage_bytes(scheme.forward.quant_info)
    reachable = storage_bytes(scheme)
    assert layout > 0
    assert reachable <= LIMIT * layout, f"{reachable} bytes reachable, {layout} in the backend's layout"
    assert scheme.weights is None
    with pytest.raises(RuntimeError, match="released after processing"):
        scheme.params.down(next(iter(scheme.params.specs)))


def test_keeping_the_canonical_weights_is_a_second_copy_on_request() -> None:
    checkpoint = MoeCheckpoint(CT_NVFP4)
    kept = checkpoint.load_layer(checkpoint.moe_layers()[0], backend="triton-nvfp4-w4a16", keep_canonical=True)
    assert isinstance(kept, ExpertScheme) and isinstance(kept.forward, BoundRunner)
    assert kept.weights is not None
    assert storage_bytes(kept) > LIMIT * storage_bytes(kept.forward.quant_info)
