"""The dispatch table at run time: registration, discovery, capability, rank, degradation, choice by name, faulty plugins."""

from __future__ import annotations

import functools
import os
import re
import subprocess
import sys
import types
from collections.abc import Callable, Iterator
from importlib.metadata import EntryPoint, entry_points
from pathlib import Path

import attrs
import pytest
import torch

from moe_core import (
    DENSE,
    BoundRunner,
    DenseMoeWeights,
    DispatchOutput,
    FP8_BLOCK_SCALED,
    NVFP4,
    Activation,
    BackendKey,
    BackendSelectionError,
    DeviceSpec,
    FormatRoute,
    LayerSpec,
    MoeRunnerConfig,
    Nvfp4MoeWeights,
    Priority,
    StandardDispatchOutput,
    Support,
    Tier,
    TopKOutput,
    candidates,
    choose,
    create_runner,
    discover_backends,
    plugin_errors,
    register_backend,
    registered_backends,
    select_backend,
    select_experts,
)
from moe_core import registry
from moe_core.backends.reference import (
    ORACLE,
    REFERENCE_DENSE,
    REFERENCE_NVFP4,
    reference_supports,
)
from moe_core.registry import ENTRY_POINT_GROUP
from moe_core.checkpoint import MoeCheckpoint
from moe_core.distributed import LocalDispatcher, load_expert_parallel
from moe_core.routing import route
from tests.checkpoint_oracles import FIXTURES
from moe_core.synthetic import random_dense_layer, random_nvfp4_layer
from tests.type_cases.accepted import third_party_backend
from tests.type_cases.accepted.third_party_backend import ScaledIdentityQuantInfo

CONFIG = MoeRunnerConfig(num_experts=4, hidden_size=32, intermediate_size_per_partition=16, top_k=2)
MIXTRAL = MoeRunnerConfig(num_experts=8, hidden_size=4096, intermediate_size_per_partition=14336, top_k=2)


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
    meta = DeviceSpec.parse("meta")
    assert third_party_key.supports(meta, LayerSpec(CONFIG, DENSE)).reasons == ("runs on the CPU only, not meta",)
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
    first_fit = third_party_backend.choose(third_party_key, CONFIG, weights, None)
    assert torch.equal(first_fit(dispatch), forward(dispatch)), "the toy is listed first and runs on the CPU"


def test_names_register_once(third_party_key: BackendKey[ScaledIdentityQuantInfo]) -> None:
    with pytest.raises(ValueError, match="'example-scaled-identity' is already registered"):
        third_party_backend.register()
    for spelling in ("", "Reference-Dense", "reference-dense ", " triton-dense", "-dense"):
        with pytest.raises(ValueError, match="name: expected lowercase letters, digits"):
            register_backend(spelling, description="", factory=REFERENCE_DENSE.factory, supports=reference_supports, priority=ORACLE)
    with pytest.raises(TypeError, match="priority: expected a Priority, got int"):
        register_backend("x", description="", factory=REFERENCE_DENSE.factory, supports=reference_supports, priority=2)  # type: ignore[arg-type]  # the runtime check under test


def test_unregistered_key_is_refused() -> None:
    impostor = BackendKey(
        _name="reference-dense",
        _description="copy",
        _factory=REFERENCE_DENSE.factory,
        _supports=reference_supports,
        _conversions=(),
        _priority=ORACLE,
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
        route.bind(CONFIG, weights.dequantize())  # type: ignore[arg-type]  # the runtime check under test


def _needs_gpu(device: DeviceSpec, layer: LayerSpec) -> Support:
    return Support.no("needs a CUDA device") if device.kind != "cuda" else Support.yes()


@pytest.mark.usefixtures("isolated_registry")
def test_select_backend_by_name_first_fit_and_errors() -> None:
    gpu_only = register_backend(
        "test-gpu-only", description="", factory=REFERENCE_NVFP4.factory, supports=_needs_gpu,
        conversions=REFERENCE_NVFP4.conversions, priority=Priority(Tier.KERNEL),
    )
    routes: list[FormatRoute[Nvfp4MoeWeights]] = [gpu_only.route(NVFP4), REFERENCE_NVFP4.route(NVFP4)]
    cpu, layer = torch.device("cpu"), LayerSpec(CONFIG, NVFP4)

    chosen = select_backend(routes, cpu, layer)
    assert chosen.chosen is routes[1]
    assert chosen.summary() == "backend reference-nvfp4; passed over: test-gpu-only (needs a CUDA device)"
    assert select_backend(routes, cpu, layer, name="reference-nvfp4").chosen is routes[1]
    with pytest.raises(BackendSelectionError, match="unknown backend 'trtllm' for nvfp4 on cpu; the choices are: test-gpu-only, reference-nvfp4"):
        select_backend(routes, cpu, layer, name="trtllm")
    with pytest.raises(BackendSelectionError, match=r"backend 'test-gpu-only' cannot run nvfp4 on cpu: needs a CUDA device \(all choices: test-gpu-only: needs a CUDA device; reference-nvfp4: fits\)"):
        select_backend(routes, cpu, layer, name="test-gpu-only")
    with pytest.raises(BackendSelectionError, match="no backend runs nvfp4 on cpu: test-gpu-only: needs a CUDA device"):
        select_backend([gpu_only], cpu, layer)
    with pytest.raises(BackendSelectionError, match="no backend takes nvfp4 weights"):
        select_backend([], cpu, layer)
    assert select_backend(routes, DeviceSpec.parse("sm90"), layer).chosen is routes[0], "a described GPU needs no GPU here"


def test_support_rejects_a_bare_string() -> None:
    with pytest.raises(TypeError, match=r"Support.reasons: expected a tuple of non-empty str, got 'a string'"):
        Support("a string")  # type: ignore[arg-type]  # the runtime check under test
    assert Support.no("needs SM100", "flashinfer missing").reasons == ("needs SM100", "flashinfer missing")
    both = Support.no("a").combine(Support(by_name_only="slow"))
    assert both.reasons == ("a",) and both.by_name_only == "slow" and not both.ranked


def test_in_tree_backends_are_found_without_importing_them() -> None:
    """A fresh process that imports only moe_core finds the Triton and FlashInfer backends (no import, no call)."""
    program = "from moe_core import NVFP4, candidates; print(' '.join(route.name for route in candidates(NVFP4)))"
    result = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, check=True)
    names = result.stdout.split()
    assert names[:3] == ["flashinfer-trtllm-fp4", "flashinfer-cutlass-nvfp4", "triton-nvfp4-w4a16"], names
    assert names[3:] == ["reference-nvfp4", "reference-nvfp4-w4a16"], "oracles last, the degraded one after the direct"


def test_candidates_rank_by_tier_then_order_and_strict_leaves_out_degradations() -> None:
    ranked = candidates(NVFP4)
    tiers = [route.priority.tier for route in ranked]
    assert tiers == sorted(tiers)
    assert [route.degradation is not None for route in ranked] == [False, False, True, False, True]
    assert [route.name for route in candidates(NVFP4, strict=True)] == [
        "flashinfer-trtllm-fp4", "flashinfer-cutlass-nvfp4", "reference-nvfp4"
    ]
    assert [route.format for route in ranked] == [NVFP4] * 5


def test_choose_degrades_nvfp4_to_w4a16_on_hopper_and_strict_says_what_would_run() -> None:
    layer = LayerSpec(MIXTRAL, NVFP4)
    hopper = choose(NVFP4, DeviceSpec.parse("sm90"), layer)
    assert hopper.chosen.name == "triton-nvfp4-w4a16"
    assert hopper.degradation is not None and hopper.degradation.startswith("nvfp4 -> nvfp4-w4a16: activations stay 16-bit")
    assert "(degraded: nvfp4 -> nvfp4-w4a16" in hopper.summary()
    with pytest.raises(BackendSelectionError, match=r"strict: no degradation; without strict, triton-nvfp4-w4a16 would run"):
        choose(NVFP4, DeviceSpec.parse("sm90"), layer, name="triton-nvfp4-w4a16", strict=True)
    strict = choose(NVFP4, DeviceSpec.parse("sm90"), layer, strict=True)
    assert strict.chosen.name == "reference-nvfp4", "strict on Hopper: only the W4A4 oracle fits"
    assert choose(NVFP4, DeviceSpec.parse("cpu"), layer).chosen.name == "reference-nvfp4"
    assert choose(NVFP4, DeviceSpec.parse("sm100+flashinfer"), layer).chosen.name == "flashinfer-cutlass-nvfp4"


def test_the_triton_interpreter_runs_by_name_only() -> None:
    cpu = DeviceSpec(kind="cpu", live=True, triton_interpreter=True, with_packages=frozenset({"triton"}))
    layer = LayerSpec(CONFIG, DENSE)
    by_rank = choose(DENSE, cpu, layer)
    assert by_rank.chosen.name != "triton-dense"
    (triton,) = [c for c in by_rank.considered if c.name == "triton-dense"]
    assert triton.support.ok and triton.support.by_name_only is not None and "interpreter" in triton.support.by_name_only
    picked = choose(DENSE, cpu, layer, name="triton-dense")
    assert picked.chosen.name == "triton-dense"


def test_a_backend_that_cannot_honour_a_config_field_is_passed_over() -> None:
    gelu = LayerSpec(attrs.evolve(MIXTRAL, activation=Activation.GELU_GATED), DENSE)
    chosen = choose(DENSE, DeviceSpec.parse("sm90"), gelu)
    assert chosen.chosen.name == "triton-dense"
    fp32 = LayerSpec(MIXTRAL, DENSE, torch.float32)
    passed = choose(DENSE, DeviceSpec.parse("sm90"), fp32)
    assert passed.chosen.name == "flashinfer-cutlass-bf16" or passed.chosen.name == "reference-dense"
    assert "triton-dense (takes bf16/fp16 hidden states, not torch.float32)" in passed.summary()
    odd = attrs.evolve(MIXTRAL, hidden_size=4096 + 64)
    block = choose(FP8_BLOCK_SCALED, DeviceSpec.parse("sm90"), LayerSpec(odd, FP8_BLOCK_SCALED))
    assert block.chosen.name == "reference-fp8-block"
    assert "multiples of 128" in block.summary()


@pytest.mark.parametrize(
    ("text", "kind", "capability"),
    [("cpu", "cpu", None), ("sm90", "cuda", (9, 0)), ("sm100", "cuda", (10, 0)), ("sm103", "cuda", (10, 3)), ("sm120+flashinfer", "cuda", (12, 0))],
)
def test_device_spec_parses_described_devices(text: str, kind: str, capability: tuple[int, int] | None) -> None:
    spec = DeviceSpec.parse(text)
    assert (spec.kind, spec.capability) == (kind, capability)
    assert not spec.live or kind == "cpu"


def test_device_spec_packages_and_refusals() -> None:
    assert DeviceSpec.parse("sm90").has("triton"), "a CUDA build of torch brings Triton"
    assert not DeviceSpec.parse("sm90-triton").has("triton")
    assert DeviceSpec.parse("sm90+attrs").has("attrs"), "a package installed here (a plugin's) may be named"
    assert DeviceSpec.parse("SM100+FlashInfer").has("flashinfer"), "names and architectures in any case"
    for typo, match in [
        ("sm100+flashinfr", "unknown package 'flashinfr' (expected one of flashinfer, triton, or a package installed"),
        ("sm100+flashinfer-flashinfer", "unknown package 'flashinfer-flashinfer'"),
        ("sm90+no_such.package", "unknown package 'no_such.package'"),
        ("sm900", "no CUDA GPU is sm900 (described GPUs: sm70, "),
        ("sm91", "no CUDA GPU is sm91"),
        ("sm100+flashinfer-flashinfer", "unknown package"),
        ("sm90+triton-triton", "unknown package 'triton-triton'"),
        ("sm90-flashinfer+flashinfer", "flashinfer both with and without"),
    ]:
        with pytest.raises(ValueError, match=re.escape(f"device {typo!r}: {match}")):
            DeviceSpec.parse(typo)
    with pytest.raises(ValueError, match="device 'sm0100': expected a torch device"):
        DeviceSpec.parse("sm0100")
    with pytest.raises(ValueError, match=re.escape("unknown package 'flashinfr'")):
        DeviceSpec("cuda", (10, 0), with_packages=frozenset({"flashinfr"}))
    with pytest.raises(ValueError, match=re.escape("no CUDA GPU is sm900")):
        DeviceSpec("cuda", (90, 0))
    with pytest.raises(ValueError, match=re.escape("DeviceSpec.kind: 'gpu' is not a torch device type")):
        DeviceSpec("gpu")
    assert not DeviceSpec.parse("sm90-flashinfer").has("flashinfer")
    with pytest.raises(ValueError, match="device 'sm9x': expected a torch device"):
        DeviceSpec.parse("sm9x")
    with pytest.raises(ValueError, match=r"device 'sm90\+': expected a torch device"):
        DeviceSpec.parse("sm90+")
    with pytest.raises(ValueError, match=r"device 'sm90\+triton\+': expected packages as \+name or -name"):
        DeviceSpec.parse("sm90+triton+")


def test_a_broken_entry_point_stays_a_row_with_its_reason(monkeypatch: pytest.MonkeyPatch, isolated_registry: None) -> None:
    broken = EntryPoint("broken", "no_such_module_for_moe_core", ENTRY_POINT_GROUP)
    monkeypatch.setattr(registry, "entry_points", lambda group: [broken])
    assert plugin_errors() == {"broken": "ModuleNotFoundError: No module named 'no_such_module_for_moe_core'"}
    (row,) = [entry for entry in registered_backends() if entry.name == "broken"]
    verdict = row.supports(DeviceSpec.parse("cpu"), LayerSpec(CONFIG, DENSE))
    assert verdict.broken and verdict.reasons == ("failed to load: ModuleNotFoundError: No module named 'no_such_module_for_moe_core'",)


def test_a_plugin_that_fails_after_registering_leaves_nothing(monkeypatch: pytest.MonkeyPatch, isolated_registry: None) -> None:
    with_plugins(monkeypatch, half="tests.plugins.raises_after_register")

    outcome = discover_backends()

    assert outcome["half"] == "ImportError: missing its kernel library"
    assert "half-made" not in [entry.name for entry in registered_backends()]


def test_a_plugin_cannot_take_the_reference_name(monkeypatch: pytest.MonkeyPatch, isolated_registry: None) -> None:
    with_plugins(monkeypatch, impostor="tests.plugins.takes_reference_name")

    outcome = discover_backends()

    assert outcome["impostor"] == "ValueError: name: a backend named 'reference-nvfp4' is already registered"
    (entry,) = [entry for entry in registered_backends() if entry.name == "reference-nvfp4"]
    assert entry.description == REFERENCE_NVFP4.description


def test_a_supports_check_that_raises_is_reported_as_broken(monkeypatch: pytest.MonkeyPatch, isolated_registry: None) -> None:
    with_plugins(monkeypatch, faulty="tests.plugins.faulty_backends")
    assert discover_backends()["faulty"] is None

    (entry,) = [entry for entry in registered_backends() if entry.name == "faulty-supports"]
    verdict = entry.supports(DeviceSpec.parse("cpu"), LayerSpec(CONFIG, NVFP4))

    assert verdict.broken and verdict.reasons == ("supports check raised RuntimeError: driver probe crashed",)
    assert choose(NVFP4, torch.device("cpu"), LayerSpec(CONFIG, NVFP4)).chosen.name == "reference-nvfp4"


def test_reference_supports_reasons() -> None:
    layer = LayerSpec(CONFIG, DENSE)
    assert reference_supports(DeviceSpec.parse("cpu"), layer).ok
    assert reference_supports(DeviceSpec.parse("meta"), layer).reasons == ("meta tensors hold no values to compute with",)
    if not torch.cuda.is_available():
        assert reference_supports(DeviceSpec.parse("cuda"), layer).reasons == ("torch sees no CUDA device",)


def test_registering_before_anyone_asked_cannot_take_an_in_tree_name() -> None:
    """A plugin's own register_backend call runs discovery first, so moe-core's references keep their names."""
    direct = (
        "from moe_core import Priority, Tier, register_backend, registered_backends\n"
        "try:\n"
        "    register_backend('reference-dense', description='impostor', factory=lambda c: None,\n"
        "                     supports=lambda d, l: None, priority=Priority(Tier.KERNEL))\n"
        "except ValueError as error:\n"
        "    print(error)\n"
        "print(sorted(e.name for e in registered_backends() if e.name.startswith('reference-'))[:2])\n"
    )
    result = subprocess.run([sys.executable, "-c", direct], capture_output=True, text=True, check=True)
    assert "a backend named 'reference-dense' is already registered" in result.stdout, result.stdout + result.stderr
    assert "['reference-dense', 'reference-fp8']" in result.stdout


@pytest.mark.parametrize("first", ["moe_core", "moe_core.backends.reference"])
def test_a_plugin_importing_the_reference_backends_loads_whatever_was_imported_first(tmp_path: Path, first: str) -> None:
    """False refusal (adversarial pass 19, k02): a plugin importing ``moe_core.backends.reference`` at module level
    (as tests/plugins do) failed with a circular ``ImportError`` when the program imported that module first: its
    first registration discovered the plugins while it was half-imported. Plugins load at the first question now."""
    package = tmp_path / "refplugin"
    package.mkdir()
    (package / "__init__.py").write_text(
        "from moe_core import DENSE, DenseMoeWeights, Priority, Tier, register_backend\n"
        "from moe_core.backends.reference import REFERENCE_DENSE, reference_supports\n"
        "from moe_core.conversion import Conversion\n"
        "def _as_is(weights: DenseMoeWeights) -> DenseMoeWeights:\n"
        "    return weights\n"
        "KEY = register_backend('refplugin-dense', description='the reference, again', factory=REFERENCE_DENSE.factory,\n"
        "    supports=reference_supports, priority=Priority(Tier.ORACLE, 99), conversions=(Conversion(DENSE, _as_is),))\n"
    )
    info = tmp_path / "refplugin-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: refplugin\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(f"[{ENTRY_POINT_GROUP}]\nrefplugin = refplugin\n")
    program = (
        f"import {first}\n"
        "from moe_core import DENSE, candidates, plugin_errors\n"
        "print(plugin_errors(), 'refplugin-dense' in [route.name for route in candidates(DENSE)])\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), *sys.path])}
    result = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, check=True, env=env)
    assert result.stdout.strip() == "{} True", result.stdout + result.stderr


def test_a_plugin_failing_after_importing_another_takes_only_its_own_names(tmp_path: Path) -> None:
    """Adversarial pass 21, a04: plugin A imported plugin B's module (which registered B's backend through a helper),
    registered its own, then failed: its cleanup removed B's backend too, and choosing changed without a word. A's
    names go, B's stay."""
    (tmp_path / "helper21.py").write_text(
        "from moe_core import DENSE, Priority, Tier, register_backend\n"
        "from moe_core.backends.reference import REFERENCE_DENSE, reference_supports\n"
        "from moe_core.conversion import Conversion\n"
        "def _as_is(weights):\n"
        "    return weights\n"
        "def register(name):\n"
        "    register_backend(name, description=name, factory=REFERENCE_DENSE.factory, supports=reference_supports,\n"
        "                     priority=Priority(Tier.ORACLE, 99), conversions=(Conversion(DENSE, _as_is),))\n"
    )
    (tmp_path / "plugin21b.py").write_text("from helper21 import register\nregister('plugin21-b')\n")
    (tmp_path / "plugin21a.py").write_text(
        "import plugin21b\nfrom helper21 import register\nregister('plugin21-a')\nraise RuntimeError('A fails')\n"
    )
    info = tmp_path / "plugins21-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: plugins21\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(f"[{ENTRY_POINT_GROUP}]\na = plugin21a\nb = plugin21b\n")
    program = (
        "from moe_core import DENSE, candidates, plugin_errors\n"
        "names = [route.name for route in candidates(DENSE)]\n"
        "print(sorted(plugin_errors()), 'plugin21-a' in names, 'plugin21-b' in names)\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), *sys.path])}
    result = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, check=True, env=env)
    assert result.stdout.strip() == "['a'] False True", result.stdout + result.stderr


def test_threads_asking_first_all_wait_for_the_whole_table() -> None:
    """Eight threads' first questions at once (adversarial pass 16, c03: seven found no backend, and a described
    sm90 was once given the oracle over the kernel): each sees every backend the process registers."""
    program = (
        "import threading\n"
        "from moe_core import registered_backends\n"
        "from moe_core.formats import DENSE\n"
        "from moe_core.registry import candidates\n"
        "barrier, seen = threading.Barrier(8), []\n"
        "def ask():\n"
        "    barrier.wait()\n"
        "    seen.append((len(candidates(DENSE)), len(registered_backends())))\n"
        "threads = [threading.Thread(target=ask) for _ in range(8)]\n"
        "[t.start() for t in threads]; [t.join() for t in threads]\n"
        "print(sorted(seen), (len(candidates(DENSE)), len(registered_backends())))\n"
    )
    result = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, check=True)
    seen, after = result.stdout.strip().rsplit(" (", 1)
    assert seen == str([tuple(int(n) for n in after.rstrip(")").split(", "))] * 8), result.stdout + result.stderr


def test_importing_a_backend_while_another_thread_discovers_does_not_hang() -> None:
    """Adversarial pass 17, c10: thread B imported ``moe_core.backends.triton`` (holding its import lock; its
    registration waited for the discovery lock) while thread A's first ``choose()`` held the discovery lock and waited
    to import that module: both hung, every time. A registration made while another thread discovers no longer
    waits for it."""
    program = (
        "import threading, torch, moe_core\n"
        "from moe_core import DENSE, LayerSpec, MoeRunnerConfig\n"
        "done = {}\n"
        "def a():\n"
        "    config = MoeRunnerConfig(num_experts=4, hidden_size=64, intermediate_size_per_partition=32, top_k=2)\n"
        "    done['a'] = moe_core.choose(DENSE, torch.device('cpu'), LayerSpec(config, DENSE, torch.bfloat16)).chosen.name\n"
        "def b():\n"
        "    import moe_core.backends.triton\n"
        "    done['b'] = 'imported'\n"
        "threads = [threading.Thread(target=b, daemon=True), threading.Thread(target=a, daemon=True)]\n"
        "[t.start() for t in threads]; [t.join(30) for t in threads]\n"
        "print(sorted(done.items()))\n"
    )
    result = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, check=True, timeout=120)
    assert result.stdout.strip() == "[('a', 'reference-dense'), ('b', 'imported')]", result.stdout + result.stderr


def test_a_route_refuses_to_bind_a_config_its_backend_refuses(gen: torch.Generator) -> None:
    """Chosen for one layer, bound to another: the backend's answer for the bound config decides."""
    weights, _ = random_nvfp4_layer(CONFIG, 6, torch.float32, torch.device("cpu"), int(torch.randint(2**31, (1,), generator=gen)))
    route = REFERENCE_NVFP4.route(NVFP4)
    biased = attrs.evolve(CONFIG, expert_biases=True)
    with pytest.raises(BackendSelectionError, match="backend 'reference-nvfp4' cannot run this nvfp4 layer: the nvfp4 weights hold no expert biases"):
        route.bind(biased, weights)


@attrs.frozen
class Float32Output:
    """A runner breaking the contract: the reference's output, but in float32 whatever the hidden states' dtype."""

    config: MoeRunnerConfig

    def run(self, dispatch: DispatchOutput, quant_info: DenseMoeWeights, /) -> torch.Tensor:
        return create_runner(REFERENCE_DENSE, self.config).run(dispatch, quant_info).float()


def test_a_runner_returning_another_dtype_than_the_contract_is_named(gen: torch.Generator) -> None:
    weights, dispatch = random_dense_layer(CONFIG, 6, torch.bfloat16, torch.device("cpu"), int(torch.randint(2**31, (1,), generator=gen)))
    assert REFERENCE_DENSE.bind(CONFIG, weights)(dispatch).dtype == torch.bfloat16
    with pytest.raises(RuntimeError, match=r"Float32Output.run returned \(6, 32\) torch.float32 on cpu, not the hidden "
                       r"states' \(6, 32\) torch.bfloat16 on cpu \(the Runner contract\)"):
        BoundRunner(Float32Output(CONFIG), weights)(dispatch)


@attrs.frozen
class KernelLike:
    """A runner that computes no gradients, as a kernel: the reference's output, computed without autograd."""

    config: MoeRunnerConfig

    def run(self, dispatch: DispatchOutput, quant_info: DenseMoeWeights, /) -> torch.Tensor:
        with torch.no_grad():
            return create_runner(REFERENCE_DENSE, self.config).run(dispatch, quant_info)


@pytest.mark.parametrize("wanting", ["hidden_states", "topk_weights"])
def test_differentiating_a_runner_that_computes_no_gradients_names_it(gen: torch.Generator, wanting: str) -> None:
    """Adversarial pass 16, c01: a swapped block on a kernel backend returned an output that did not require grad,
    and d loss / d embeddings came back 5-9% off. The output now carries the inputs' graph; its backward names the
    runner. The forward itself runs (plain calls without no_grad are common), adding into its output in place too."""
    weights, dispatch = random_dense_layer(CONFIG, 6, torch.float32, torch.device("cpu"), int(torch.randint(2**31, (1,), generator=gen)))
    x = dispatch.hidden_states.clone().requires_grad_(wanting == "hidden_states")
    topk = dispatch.topk
    w = topk.topk_weights.clone().requires_grad_(wanting == "topk_weights")
    wanted = StandardDispatchOutput(x, TopKOutput(topk.topk_ids, w, num_experts=CONFIG.num_experts, check_values=False))
    reference = REFERENCE_DENSE.bind(CONFIG, weights)(wanted)
    source = x if wanting == "hidden_states" else w
    assert torch.autograd.grad(reference.sum(), [source])[0].abs().sum() > 0  # the reference computes them
    kernel = BoundRunner(KernelLike(CONFIG), weights)
    out = kernel(wanted)
    torch.testing.assert_close(out, reference, rtol=0, atol=0)
    out += 1.0
    with pytest.raises(RuntimeError, match="KernelLike computes no gradients, and its output was differentiated"):
        torch.autograd.grad(out.sum(), [source])
    with torch.no_grad():
        assert not kernel(wanted).requires_grad


def _fp16_only(device: DeviceSpec, layer: LayerSpec) -> Support:
    return Support.yes() if layer.dtype == torch.float16 else Support.no(f"fp16 hidden states only, not {layer.dtype}")


@pytest.mark.usefixtures("isolated_registry")
def test_a_route_binds_for_the_dtype_it_runs_and_refuses_another(gen: torch.Generator) -> None:
    """A backend that takes fp16 hidden states only, chosen for an fp16 layer, was refused at bind (which asked for
    bf16, ``LayerSpec``'s default), and ``dense_layer(dtype=float16)`` with it: a correct program refused
    (adversarial pass 4, c06). One chosen with the default bf16 spec ran float32 hidden states (c05: 6e-3 off where
    float32 gives 3e-7). A route now binds where its backend takes the layer in some dtype, and its forward asks for
    the hidden states' dtype."""
    fp16 = register_backend(
        "test-fp16-only", description="", factory=REFERENCE_DENSE.factory, supports=_fp16_only,
        conversions=REFERENCE_DENSE.conversions, priority=Priority(Tier.KERNEL),
    )
    seed = int(torch.randint(2**31, (1,), generator=gen))
    weights, dispatch = random_dense_layer(CONFIG, 5, torch.float16, torch.device("cpu"), seed)
    halves = DenseMoeWeights(w13=weights.w13.half(), w2=weights.w2.half())
    chosen = choose(DENSE, torch.device("cpu"), LayerSpec(CONFIG, DENSE, torch.float16)).chosen
    assert chosen.name == "test-fp16-only"
    forward = chosen.bind(CONFIG, halves)
    torch.testing.assert_close(forward(dispatch), REFERENCE_DENSE.bind(CONFIG, halves)(dispatch), rtol=0, atol=0)
    wide = StandardDispatchOutput(dispatch.hidden_states.float(), dispatch.topk)
    with pytest.raises(BackendSelectionError, match=r"does not run this layer's torch.float32 hidden states: fp16 hidden states only"):
        fp16.route(DENSE).bind(CONFIG, weights)(wide)


@pytest.mark.usefixtures("isolated_registry")
@pytest.mark.parametrize("how", ["load_layer", "load_expert_parallel"])
def test_a_checkpoint_layer_is_chosen_for_the_hidden_states_dtype_asked(how: str) -> None:
    """Adversarial pass 16, c02 and c18: with an fp16-only kernel installed, a bf16 checkpoint served in fp16 was
    bound for bf16 (the reference) or, through load_expert_parallel, could not be asked for fp16 at all. Both take
    ``activation_dtype`` and choose the kernel for it; by default they choose for the checkpoint's dtype."""
    register_backend(
        "test-fp16-only", description="", factory=REFERENCE_DENSE.factory, supports=_fp16_only,
        conversions=REFERENCE_DENSE.conversions, priority=Priority(Tier.KERNEL),
    )
    checkpoint = MoeCheckpoint(FIXTURES / "qwen3_moe_bf16")
    x = torch.randn(3, checkpoint.hidden_size).half()
    topk = route(x, checkpoint.router(0), checkpoint.runner_config())
    if how == "load_layer":
        layer = checkpoint.load_layer(0, activation_dtype=torch.float16)
        assert layer.backend_summary().startswith("unquantized: backend test-fp16-only")
        assert not checkpoint.load_layer(0).backend_summary().startswith("unquantized: backend test-fp16-only")
        out = layer.apply(StandardDispatchOutput(x, topk))
    else:
        out = load_expert_parallel(checkpoint, 0, LocalDispatcher(), device=torch.device("cpu"), activation_dtype=torch.float16)(x, topk)
    assert out.dtype == torch.float16 and bool(out.isfinite().all())


@pytest.mark.usefixtures("isolated_registry")
def test_a_factory_that_returns_a_runner_for_another_layer_is_named() -> None:
    """A plugin's factory that caches runners by shape handed layer 1 (routed_scaling_factor 2.5) layer 0's runner
    (1.0), which ran 0.60 off, silently (adversarial pass 4, c28)."""
    made: dict[tuple[int, int, int, int], object] = {}

    def cached(config: MoeRunnerConfig) -> object:
        key = (config.num_experts, config.hidden_size, config.intermediate_size_per_partition, config.top_k)
        return made.setdefault(key, REFERENCE_DENSE.factory(config))

    key = register_backend(
        "test-cached", description="", factory=cached, supports=lambda device, layer: Support.yes(),  # type: ignore[arg-type]  # an untyped plugin's factory
        conversions=REFERENCE_DENSE.conversions, priority=Priority(Tier.KERNEL),
    )
    create_runner(key, CONFIG)
    with pytest.raises(RuntimeError, match=r"factory returned a runner for another layer than asked \(routed_scaling_factor 2.5"):
        create_runner(key, attrs.evolve(CONFIG, routed_scaling_factor=2.5))


@pytest.mark.usefixtures("isolated_registry")
def test_a_key_bound_directly_asks_its_backend(gen: torch.Generator) -> None:
    """A key's bind skipped the backend's answer: an honest plugin that refuses a scaling factor ran it 0.60 off
    (adversarial pass 4, c32), and Triton's key on a machine without it failed inside its factory with a raw
    ``ModuleNotFoundError`` (c27). It now asks, as a route's bind does."""
    honest = register_backend(
        "test-no-scaling", description="", factory=REFERENCE_DENSE.factory,
        supports=lambda device, layer: Support.no("no output scale") if layer.config.routed_scaling_factor != 1.0 else Support.yes(),
        conversions=REFERENCE_DENSE.conversions, priority=Priority(Tier.KERNEL),
    )
    seed = int(torch.randint(2**31, (1,), generator=gen))
    weights, dispatch = random_dense_layer(CONFIG, 5, torch.float32, torch.device("cpu"), seed)
    honest.bind(CONFIG, weights)(dispatch)
    with pytest.raises(BackendSelectionError, match="backend 'test-no-scaling' cannot run this layer: no output scale"):
        honest.bind(attrs.evolve(CONFIG, routed_scaling_factor=2.5), weights)


class _Buffers(torch.nn.Module):
    """A module holding a tensor as a non-persistent buffer (not in its state dict)."""

    def __init__(self, tensor: torch.Tensor) -> None:
        super().__init__()
        self.register_buffer("held", tensor, persistent=False)


HOLDERS: dict[str, Callable[[torch.Tensor], object]] = {
    "attribute": lambda w2: w2,
    "namespace": lambda w2: types.SimpleNamespace(w2=w2),
    "partial": lambda w2: functools.partial(torch.add, w2),
    "module buffer": _Buffers,
}
"""Where a plain quant info keeps its ``w2``: as an attribute, or inside a namespace, a partial or a module."""


class _PlainWeights:
    """A plugin's quant info as a plain class (the QuantInfo protocol asks for no attrs class)."""

    def __init__(self, w13: torch.Tensor, w2: torch.Tensor, how: str) -> None:
        self.w13, self._inter, self.held = w13, int(w2.shape[2]), HOLDERS[how](w2)

    @property
    def num_experts(self) -> int:
        return int(self.w13.shape[0])

    @property
    def hidden_size(self) -> int:
        return int(self.w13.shape[2])

    @property
    def intermediate_size(self) -> int:
        return self._inter

    @property
    def device(self) -> torch.device:
        return self.w13.device


class _SlotWeights(_PlainWeights):
    """The same with ``__slots__`` (no ``__dict__`` of its own beyond the base's)."""

    __slots__ = ("extra",)

    def __init__(self, w13: torch.Tensor, w2: torch.Tensor, how: str) -> None:
        super().__init__(w13, w2[:, :1], how)
        self._inter = int(w2.shape[2])
        self.extra = (w2,)


@attrs.frozen
class _PlainRunner:
    config: MoeRunnerConfig

    def run(self, dispatch: DispatchOutput, quant_info: _PlainWeights, /) -> torch.Tensor:
        return torch.zeros_like(dispatch.hidden_states)


@pytest.mark.parametrize("how", sorted(HOLDERS))
@pytest.mark.parametrize("kind", [_PlainWeights, _SlotWeights])
def test_a_plain_class_quant_info_has_its_tensors_watched(kind: type[_PlainWeights], how: str) -> None:
    """Silent (adversarial passes 14 and 15, c12, c02): a plugin's quant info of a plain or ``__slots__`` class held its
    tensors unwatched, also behind a namespace, a partial or a module's non-persistent buffer, so a staging buffer
    refilled with the next layer after binding ran that layer's weights (1.17-1.66 off). They are walked now."""
    config = MoeRunnerConfig(num_experts=2, hidden_size=8, intermediate_size_per_partition=4, top_k=1)
    w13, w2 = torch.randn(2, 8, 8), torch.randn(2, 8, 4)
    bound = BoundRunner(_PlainRunner(config), kind(w13, w2, how))
    dispatch = StandardDispatchOutput(torch.randn(3, 8), select_experts(torch.randn(3, 2), config))
    bound(dispatch)
    w2.mul_(2.0)  # the staging buffer refilled
    with pytest.raises(RuntimeError, match=rf"{kind.__name__}\.\S+: written in place"):
        bound(dispatch)


class _Workspace:
    """A plugin's scratch buffer, a plain object its runner writes on every call."""

    def __init__(self) -> None:
        self.scratch = torch.zeros(16)


@attrs.frozen(eq=False)
class _WeightsWithWorkspace:
    weights: _PlainWeights
    workspace: _Workspace

    @property
    def num_experts(self) -> int:
        return self.weights.num_experts

    @property
    def hidden_size(self) -> int:
        return self.weights.hidden_size

    @property
    def intermediate_size(self) -> int:
        return self.weights.intermediate_size

    @property
    def device(self) -> torch.device:
        return self.weights.device


@attrs.frozen
class _ScratchRunner:
    config: MoeRunnerConfig

    def run(self, dispatch: DispatchOutput, quant_info: _WeightsWithWorkspace, /) -> torch.Tensor:
        quant_info.workspace.scratch.add_(1.0)
        return torch.zeros_like(dispatch.hidden_states)


def test_a_plain_workspace_behind_an_attrs_quant_info_is_not_taken_for_weights() -> None:
    """False refusal (adversarial pass 15, c10): walking plain objects behind attrs fields took a runner's workspace
    for weights written in place. An attrs quant info says by its fields what it holds: a plain object behind one is
    not looked into, while a plain quant info is (the test above)."""
    config = MoeRunnerConfig(num_experts=2, hidden_size=8, intermediate_size_per_partition=4, top_k=1)
    weights = _PlainWeights(torch.randn(2, 8, 8), torch.randn(2, 8, 4), "attribute")
    bound = BoundRunner(_ScratchRunner(config), _WeightsWithWorkspace(weights, _Workspace()))
    dispatch = StandardDispatchOutput(torch.randn(3, 8), select_experts(torch.randn(3, 2), config))
    for _ in range(2):
        bound(dispatch)
