"""The dispatch table at run time: registration, lookup, availability."""

from __future__ import annotations

from importlib.metadata import EntryPoint

import pytest
import torch

from backends.reference import REFERENCE_DENSE, REFERENCE_NVFP4, ReferenceDenseRunner, reference_availability
from moe_core import (
    Availability,
    BackendKey,
    MoeRunnerConfig,
    StandardDispatchOutput,
    TopKOutput,
    create_runner,
    load_entry_point_backends,
    register_backend,
    registered_backends,
)
from moe_core import registry
from moe_core.registry import ENTRY_POINT_GROUP
from tests.type_cases.accepted import third_party_backend
from tests.type_cases.accepted.third_party_backend import ScaledIdentityQuantInfo

CONFIG = MoeRunnerConfig(num_experts=4, hidden_size=32, intermediate_size_per_partition=16, top_k=2)


@pytest.fixture(scope="module")
def third_party_key() -> BackendKey[ScaledIdentityQuantInfo]:
    return third_party_backend.register()


def test_third_party_backend_registers_and_runs(
    gen: torch.Generator, third_party_key: BackendKey[ScaledIdentityQuantInfo]
) -> None:
    assert third_party_key in registered_backends()
    factors = torch.rand(4, generator=gen) + 0.5
    ids = torch.randint(0, 4, (5, 2), generator=gen, dtype=torch.int32)
    weights = torch.rand(5, 2, generator=gen)
    x = torch.randn(5, 32, generator=gen)
    info = ScaledIdentityQuantInfo(factors, hidden_size=32, intermediate_size=16)

    out = create_runner(third_party_key, CONFIG).run(StandardDispatchOutput(x, TopKOutput(ids, weights)), info)

    expected = x * (factors[ids.long()] * weights).sum(dim=1, keepdim=True)
    assert torch.allclose(out, expected, rtol=1e-6, atol=0)
    assert third_party_key.availability(torch.device("meta")).reasons == ("runs on the CPU only, not meta",)
    assert third_party_key.bind_nvfp4(CONFIG, object()) is None  # type: ignore[arg-type]  # no NVFP4 hook: the weights are never read


def test_names_register_once(third_party_key: BackendKey[ScaledIdentityQuantInfo]) -> None:
    with pytest.raises(ValueError, match="'example-scaled-identity' is already registered"):
        third_party_backend.register()
    with pytest.raises(ValueError, match="non-empty str"):
        register_backend("", description="", factory=ReferenceDenseRunner, availability=reference_availability)


def test_unregistered_key_is_refused() -> None:
    impostor = BackendKey(
        "reference-dense", "copy", ReferenceDenseRunner, reference_availability, None
    )
    with pytest.raises(ValueError, match="was not registered through register_backend"):
        create_runner(impostor, CONFIG)
    with pytest.raises(TypeError, match="config: expected a MoeRunnerConfig"):
        create_runner(REFERENCE_DENSE, {"num_experts": 4})  # type: ignore[arg-type]  # the runtime check under test


def test_entry_points_name_the_reference_backend() -> None:
    assert load_entry_point_backends().get("reference", "missing") is None, f"is moe-core installed? ({ENTRY_POINT_GROUP})"
    names = [backend.name for backend in registered_backends()]
    assert names[:2] == [REFERENCE_DENSE.name, REFERENCE_NVFP4.name]


def test_broken_entry_point_is_reported_not_raised(monkeypatch: pytest.MonkeyPatch) -> None:
    broken = EntryPoint("broken", "no_such_module_for_moe_core", ENTRY_POINT_GROUP)
    monkeypatch.setattr(registry, "entry_points", lambda group: [broken])
    assert load_entry_point_backends() == {"broken": "ModuleNotFoundError: No module named 'no_such_module_for_moe_core'"}


def test_availability_reports_reasons() -> None:
    assert reference_availability(torch.device("cpu")).ok
    assert not reference_availability(torch.device("meta")).ok
    assert Availability.unavailable("needs SM100", "flashinfer missing").reasons == ("needs SM100", "flashinfer missing")
    if not torch.cuda.is_available():
        verdict = reference_availability(torch.device("cuda"))
        assert not verdict.ok and "torch cannot allocate on cuda" in verdict.reasons[0]
