"""The dispatch table at run time: registration, routes, choice by name, faulty plugins."""

from __future__ import annotations

from collections.abc import Iterator
from importlib.metadata import EntryPoint, entry_points

import pytest
import torch

from moe_core import (
    DENSE,
    NVFP4,
    Availability,
    BackendKey,
    BackendSelectionError,
    FormatRoute,
    MoeRunnerConfig,
    Nvfp4MoeWeights,
    StandardDispatchOutput,
    TopKOutput,
    create_runner,
    load_entry_point_backends,
    register_backend,
    registered_backends,
    select_backend,
)
from moe_core import registry
from moe_core.backends.reference import (
    REFERENCE_DENSE,
    REFERENCE_NVFP4,
    ReferenceDenseRunner,
    reference_availability,
)
from moe_core.registry import ENTRY_POINT_GROUP
from moe_core.synthetic import random_dense_layer, random_nvfp4_layer
from tests.type_cases.accepted import third_party_backend
from tests.type_cases.accepted.third_party_backend import ScaledIdentityQuantInfo

CONFIG = MoeRunnerConfig(num_experts=4, hidden_size=32, intermediate_size_per_partition=16, top_k=2)


def with_plugins(monkeypatch: pytest.MonkeyPatch, **modules: str) -> None:
    """Add entry points (name -> module) to the real ones of the group."""
    extra = [EntryPoint(name, value, ENTRY_POINT_GROUP) for name, value in modules.items()]
    real = list(entry_points(group=ENTRY_POINT_GROUP))
    monkeypatch.setattr(registry, "entry_points", lambda group: [*extra, *real])


@pytest.fixture(scope="module")
def third_party_key() -> Iterator[BackendKey[ScaledIdentityQuantInfo]]:
    """The toy backend, registered for this module's tests and unregistered after them."""
    saved = dict(registry._REGISTRY)
    yield third_party_backend.register()
    registry._REGISTRY.clear()
    registry._REGISTRY.update(saved)


def test_third_party_backend_registers_and_runs(
    gen: torch.Generator, third_party_key: BackendKey[ScaledIdentityQuantInfo]
) -> None:
    assert third_party_key.name in [entry.name for entry in registered_backends()]
    factors = torch.rand(4, generator=gen) + 0.5
    ids = torch.stack([torch.randperm(4, generator=gen)[:2] for _ in range(5)]).to(torch.int32)
    weights = torch.rand(5, 2, generator=gen)
    x = torch.randn(5, 32, generator=gen)
    info = ScaledIdentityQuantInfo(factors, hidden_size=32, intermediate_size=16)

    topk = TopKOutput(ids, weights, num_experts=4)
    out = create_runner(third_party_key, CONFIG).run(StandardDispatchOutput(x, topk), info)

    expected = x * (factors[ids.long()] * weights).sum(dim=1, keepdim=True)
    assert torch.allclose(out, expected, rtol=1e-6, atol=0)
    assert third_party_key.availability(torch.device("meta")).reasons == ("runs on the CPU only, not meta",)
    assert third_party_key.formats == (DENSE,)


def test_backends_of_different_quant_info_are_chosen_by_name_through_routes(
    gen: torch.Generator, third_party_key: BackendKey[ScaledIdentityQuantInfo]
) -> None:
    weights, dispatch = random_dense_layer(CONFIG, 5, torch.float32, torch.device("cpu"), int(torch.randint(1 << 30, (1,), generator=gen)))
    forward = third_party_backend.choose(third_party_key, CONFIG, weights, "example-scaled-identity")
    factors = weights.w2.mean(dim=(1, 2))
    topk = dispatch.topk
    expected = dispatch.hidden_states * (factors[topk.topk_ids.long()] * topk.topk_weights).sum(dim=1, keepdim=True)
    assert torch.allclose(forward(dispatch), expected, rtol=1e-6, atol=0)
    first_available = third_party_backend.choose(third_party_key, CONFIG, weights, None)
    assert torch.equal(first_available(dispatch), forward(dispatch)), "the toy is listed first and runs on the CPU"


def test_names_register_once(third_party_key: BackendKey[ScaledIdentityQuantInfo]) -> None:
    with pytest.raises(ValueError, match="'example-scaled-identity' is already registered"):
        third_party_backend.register()
    with pytest.raises(ValueError, match="non-empty str"):
        register_backend("", description="", factory=ReferenceDenseRunner, availability=reference_availability)


def test_unregistered_key_is_refused() -> None:
    impostor = BackendKey(
        _name="reference-dense",
        _description="copy",
        _factory=ReferenceDenseRunner,
        _availability=reference_availability,
        _conversions=(),
    )
    with pytest.raises(ValueError, match="'reference-dense' is not registered"):
        create_runner(impostor, CONFIG)
    with pytest.raises(TypeError, match="config: expected a MoeRunnerConfig"):
        create_runner(REFERENCE_DENSE, {"num_experts": 4})  # type: ignore[arg-type]  # the runtime check under test


def test_registered_entries_do_not_hand_out_keys() -> None:
    """The table's entries hide Q: no isinstance recovers a ``BackendKey[Any]`` from them."""
    entries = registered_backends()
    assert entries and not any(isinstance(entry, BackendKey) for entry in entries)
    nvfp4 = next(entry for entry in entries if entry.name == REFERENCE_NVFP4.name)
    assert nvfp4.formats == (NVFP4,) and nvfp4.converts_from(NVFP4) and not nvfp4.converts_from(DENSE)


def test_routes_convert_checked_weights_and_bind(gen: torch.Generator) -> None:
    weights, dispatch = random_nvfp4_layer(CONFIG, 6, torch.float32, torch.device("cpu"), int(torch.randint(2**31, (1,), generator=gen)))
    route = REFERENCE_NVFP4.route(NVFP4)

    out = route.bind(CONFIG, weights)(dispatch)

    assert torch.equal(out, create_runner(REFERENCE_NVFP4, CONFIG).run(dispatch, weights))
    with pytest.raises(ValueError, match=r"backend 'reference-dense' converts from no nvfp4 weights \(it takes: dense\)"):
        REFERENCE_DENSE.route(NVFP4)
    with pytest.raises(TypeError, match="the nvfp4 format takes Nvfp4MoeWeights, got DenseMoeWeights"):
        route.quant_info(weights.dequantize())  # type: ignore[arg-type]  # the runtime check under test


def test_select_backend_by_name_first_available_and_errors() -> None:
    def needs_gpu(device: torch.device) -> Availability:
        return Availability.unavailable("needs a CUDA device") if device.type != "cuda" else Availability.available()

    gpu_only = register_backend(
        "test-gpu-only", description="", factory=REFERENCE_NVFP4.factory, availability=needs_gpu,
        conversions=REFERENCE_NVFP4.conversions,
    )
    routes: list[FormatRoute[Nvfp4MoeWeights]] = [gpu_only.route(NVFP4), REFERENCE_NVFP4.route(NVFP4)]
    cpu = torch.device("cpu")

    chosen = select_backend(routes, cpu)
    assert chosen.chosen is routes[1]
    assert chosen.summary() == "backend reference-nvfp4; unavailable: test-gpu-only (needs a CUDA device)"
    assert select_backend(routes, cpu, name="reference-nvfp4").chosen is routes[1]
    with pytest.raises(BackendSelectionError, match="unknown backend 'trtllm'; the choices are: test-gpu-only, reference-nvfp4"):
        select_backend(routes, cpu, name="trtllm")
    with pytest.raises(BackendSelectionError, match=r"backend 'test-gpu-only' cannot run on cpu: needs a CUDA device \(all choices: test-gpu-only: needs a CUDA device; reference-nvfp4: available\)"):
        select_backend(routes, cpu, name="test-gpu-only")
    with pytest.raises(BackendSelectionError, match="no backend runs on cpu: test-gpu-only: needs a CUDA device"):
        select_backend([gpu_only], cpu)
    with pytest.raises(BackendSelectionError, match="at least one"):
        select_backend([], cpu)


def test_availability_rejects_a_bare_string() -> None:
    with pytest.raises(TypeError, match=r"Availability.reasons: expected a tuple of non-empty str, got 'a string'"):
        Availability("a string")  # type: ignore[arg-type]  # the runtime check under test
    assert Availability.unavailable("needs SM100", "flashinfer missing").reasons == ("needs SM100", "flashinfer missing")


def test_entry_points_name_the_reference_backend() -> None:
    assert load_entry_point_backends().get("reference", "missing") is None, f"is moe-core installed? ({ENTRY_POINT_GROUP})"
    names = [backend.name for backend in registered_backends()]
    assert names[:2] == [REFERENCE_DENSE.name, REFERENCE_NVFP4.name]


def test_broken_entry_point_is_reported_not_raised(monkeypatch: pytest.MonkeyPatch) -> None:
    broken = EntryPoint("broken", "no_such_module_for_moe_core", ENTRY_POINT_GROUP)
    monkeypatch.setattr(registry, "entry_points", lambda group: [broken])
    assert load_entry_point_backends() == {"broken": "ModuleNotFoundError: No module named 'no_such_module_for_moe_core'"}


@pytest.mark.usefixtures("isolated_registry")
def test_a_plugin_that_fails_after_registering_leaves_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    with_plugins(monkeypatch, half="tests.plugins.raises_after_register")

    outcome = load_entry_point_backends()

    assert outcome["half"] == "ImportError: missing its kernel library"
    assert "half-made" not in [entry.name for entry in registered_backends()]


@pytest.mark.usefixtures("isolated_registry")
def test_a_plugin_cannot_take_the_reference_name(monkeypatch: pytest.MonkeyPatch) -> None:
    with_plugins(monkeypatch, impostor="tests.plugins.takes_reference_name")

    outcome = load_entry_point_backends()

    assert outcome["impostor"] == "ValueError: name: a backend named 'reference-nvfp4' is already registered"
    (entry,) = [entry for entry in registered_backends() if entry.name == "reference-nvfp4"]
    assert entry.description == REFERENCE_NVFP4.description


@pytest.mark.usefixtures("isolated_registry")
def test_an_availability_check_that_raises_is_reported_as_broken(monkeypatch: pytest.MonkeyPatch) -> None:
    with_plugins(monkeypatch, faulty="tests.plugins.faulty_backends")
    assert load_entry_point_backends()["faulty"] is None

    (entry,) = [entry for entry in registered_backends() if entry.name == "faulty-availability"]
    verdict = entry.availability(torch.device("cpu"))

    assert verdict.broken and verdict.reasons == ("availability check raised RuntimeError: driver probe crashed",)


def test_availability_reports_reasons() -> None:
    assert reference_availability(torch.device("cpu")).ok
    assert not reference_availability(torch.device("meta")).ok
    if not torch.cuda.is_available():
        verdict = reference_availability(torch.device("cuda"))
        assert not verdict.ok and "torch cannot allocate on cuda" in verdict.reasons[0]
