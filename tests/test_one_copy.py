"""After loading, a layer holds its expert weights once: in the chosen backend's layout, nothing else beside it."""

from __future__ import annotations

import gc
from pathlib import Path

import pytest
import torch

from moe_core import StandardDispatchOutput, select_experts
from moe_core._halves import joined_halves
from moe_core.checkpoint import MoeCheckpoint
from moe_core.registry import BoundRunner
from moe_core.scheme import ExpertScheme, SchemeOptions
from tests.checkpoint_oracles import BF16, CT_NVFP4, CT_SPLIT, FIXTURES, MODELOPT

CT_FP8 = FIXTURES / "qwen3_moe_fp8"
"""compressed-tensors FP8, static per-tensor scales."""
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


@pytest.mark.parametrize(("directory", "backend"), [(CT_NVFP4, "triton-nvfp4-w4a16"), (CT_FP8, "triton-fp8"), (CT_SPLIT, None)])
def test_keeping_the_canonical_weights_adds_no_copy_where_the_layout_views_them(directory: Path, backend: str | None) -> None:
    """Gate and up are the two halves of one ``[E, 2, ...]`` parameter: the canonical halves view it and the Triton
    conversions join them back into a view (:func:`moe_core._halves.joined_halves`), where they copied both before."""
    checkpoint = MoeCheckpoint(directory)
    kept = checkpoint.load_layer(checkpoint.moe_layers()[0], backend=backend, keep_canonical=True)
    assert isinstance(kept, ExpertScheme) and isinstance(kept.forward, BoundRunner)
    assert kept.weights is not None
    assert storage_bytes(kept) <= LIMIT * storage_bytes(kept.forward.quant_info)


@pytest.mark.parametrize(
    ("directory", "backend"),
    [(CT_NVFP4, "triton-nvfp4-w4a16"), (CT_NVFP4, None), (CT_FP8, "triton-fp8"), (CT_FP8, None)],
    ids=["ct-nvfp4-triton-w4a16", "ct-nvfp4", "ct-fp8-triton", "ct-fp8"],
)
def test_a_refit_written_into_the_released_gate_up_parameter_is_refused_by_name(directory: Path, backend: str | None) -> None:
    """Silent (adversarial pass 13, c11): an engine that registered the scheme's parameters as its own refit gate and
    up with ``load_state_dict`` after processing; compressed-tensors FP8 static and NVFP4 had copied each half out of
    the ``[E, 2, ...]`` parameter, so the layer ran the old weights (1.14-1.54 off the new ones). The halves are views
    now, and the bound layer refuses the write by name, as for the other schemes."""
    checkpoint = MoeCheckpoint(directory)
    layer = checkpoint.moe_layers()[0]
    scheme = checkpoint.scheme().for_layer(
        checkpoint.runner_config(), torch.device("cpu"), checkpoint.dtype, SchemeOptions(backend=backend)
    )
    assert isinstance(scheme, ExpertScheme)
    engine_params = {name: scheme.params.gate_up(name) for name in scheme.params.specs}
    checkpoint.load_into(layer, scheme)
    x = torch.randn(3, checkpoint.hidden_size).to(torch.bfloat16)
    dispatch = StandardDispatchOutput(x, select_experts(x.float() @ checkpoint.router_weight(layer).float().T, scheme.config))
    scheme.apply(dispatch)
    codes = next(tensor for name, tensor in engine_params.items() if tensor.dtype in (torch.uint8, torch.float8_e4m3fn))
    codes[:, 1].copy_(codes[:, 0].clone())  # the up half rewritten (another version's values)
    with pytest.raises(RuntimeError, match="written in place after its weights were built"):
        scheme.apply(dispatch)


def test_joined_halves_views_one_buffer_and_copies_otherwise() -> None:
    fused = torch.randn(3, 2, 4, 5)
    gate, up = fused[:, 0], fused[:, 1]
    joined = joined_halves(gate, up)
    assert joined.data_ptr() == fused.data_ptr() and joined.is_contiguous()
    assert torch.equal(joined, torch.cat((gate, up), dim=1))
    for other_gate, other_up in ((up, gate), (gate, up.clone()), (fused[:, 0, :, :4], fused[:, 1, :, :4])):
        copied = joined_halves(other_gate, other_up)
        assert copied.data_ptr() != fused.data_ptr()
        assert torch.equal(copied, torch.cat((other_gate, other_up), dim=1))
