"""``moe-core check`` varies every config field a backend may claim: a backend that ignores one fails."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from importlib.metadata import EntryPoint, entry_points

import pytest
import torch

from moe_core import Activation, ClampedSwiglu, LimitedSwiglu, Llama4Sigmoid, MoeRunnerConfig, RoutingMethod, registry
from moe_core.check import QUANTIZATION_TIES, VARIANT_SCALING_FACTOR, backend_tolerance, config_variants, oracle_tolerance
from moe_core.config import EXAMPLE_ACTIVATIONS, example_routings
from moe_core.cli import main
from moe_core.registry import ENTRY_POINT_GROUP
from tests.test_cli import SMALL, table_lines, table_rows


@pytest.fixture
def ignoring_plugins(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The plugins of ``tests/plugins/ignores_config.py`` beside the real entry points, gone after the test."""
    monkeypatch.setattr(registry, "_REGISTRY", dict(registry._REGISTRY))
    monkeypatch.setattr(registry, "_DISCOVERY", registry._Discovered())
    extra = [EntryPoint("ignores", "tests.plugins.ignores_config", ENTRY_POINT_GROUP)]
    real = list(entry_points(group=ENTRY_POINT_GROUP))
    monkeypatch.setattr(registry, "entry_points", lambda group: [*extra, *real])
    yield
    sys.modules.pop("tests.plugins.ignores_config", None)


def test_variants_cover_every_activation_and_routing_a_scaling_factor_and_expert_parallelism() -> None:
    config = MoeRunnerConfig(num_experts=8, hidden_size=64, intermediate_size_per_partition=64, top_k=2)
    variants = dict(config_variants(config))
    activations = [variant.activation for variant in variants.values() if variant.activation != config.activation]
    assert set(activations) == set(EXAMPLE_ACTIVATIONS) - {config.activation}
    assert len(activations) == len(EXAMPLE_ACTIVATIONS) - 1  # every example activation but the default
    routings = [variant.routing_method for variant in variants.values() if variant.routing_method != config.routing_method]
    assert set(routings) == set(example_routings(8, 2)) - {config.routing_method}
    names = {routing.value for routing in routings}
    assert {"sigmoid_topk", "grouped_topk", "grouped_topk_softmax", "llama4_sigmoid", "sparsemixer"} <= names
    assert len(names) == len(routings), "each routing variant has a name of its own in the table"
    assert variants[f"routed_scaling_factor={VARIANT_SCALING_FACTOR:g}"].routed_scaling_factor == VARIANT_SCALING_FACTOR
    parallel, odd = variants["local_experts=4-7/8"], variants["local_experts=1-4/8"]
    assert (parallel.num_local_experts, parallel.local_expert_offset) == (4, 4)
    assert (odd.num_local_experts, odd.local_expert_offset) == (4, 1)
    assert variants["top_k=1"].top_k == 1 and variants["top_k=8"].top_k == 8
    assert variants["expert_biases=True"].expert_biases
    for variant in variants.values():  # one field at a time (a slice of the experts is one)
        changed = [name for name in ("activation", "routing_method", "routed_scaling_factor", "num_local_experts",
                                     "expert_biases", "top_k")
                   if getattr(variant, name) != getattr(config, name)]
        assert len(changed) == 1


def test_a_layer_already_split_across_ranks_is_not_split_again() -> None:
    config = MoeRunnerConfig(num_experts=8, hidden_size=64, intermediate_size_per_partition=64, top_k=2,
                             num_local_experts=4, local_expert_offset=4)
    assert not [name for name, _ in config_variants(config) if name.startswith("local_experts")]


@pytest.mark.usefixtures("ignoring_plugins")
def test_a_backend_that_ignores_the_activation_the_routing_or_the_scaling_factor_fails(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["check", *SMALL]) == 1
    out = capsys.readouterr().out
    rows = table_rows(out)
    for plugin in ("ignores-activation", "ignores-limits", "ignores-scaling-factor", "ignores-biases", "ignores-routing"):
        assert rows[f"dense {plugin}"][-1] == "ok", "on the default config it computes the right thing"
    for activation in set(EXAMPLE_ACTIVATIONS) - {Activation.SILU_GATED}:
        verdict = rows[f"dense[activation={activation.value}] ignores-activation"][-1]
        assert verdict.startswith("FAILED"), (activation, verdict)  # a wrong value, or a non-gated layer's w13 refused
        assert rows[f"dense[activation={activation.value}] ignores-scaling-factor"][-1] == "ok"
        limits = rows[f"dense[activation={activation.value}] ignores-limits"][-1]
        if isinstance(activation, (ClampedSwiglu, LimitedSwiglu)):  # the example limits are within the layer's range
            assert limits.startswith("FAILED: error above"), (activation, limits)
        else:
            assert limits == "ok", (activation, limits)
    for routing in example_routings(4, 2):  # SMALL's experts and top-k
        if routing == RoutingMethod.TOPK_RENORMALIZE:
            continue  # the default config's
        verdict = rows[f"dense[routing={routing.value}] ignores-routing"][-1]
        if isinstance(routing, Llama4Sigmoid):
            assert verdict.startswith("FAILED: error above"), verdict
        else:
            assert verdict == "ok", (routing, verdict)
    assert rows["dense[expert_biases=True] ignores-biases"][-1].startswith("FAILED: error above")
    assert rows["dense[expert_biases=True] ignores-scaling-factor"][-1] == "ok"
    assert rows["dense[expert_biases=True] reference-dense"][-1] == "ok", "the oracle adds the biases, as float64 does"
    assert rows["fp8[expert_biases=True] reference-fp8"][-1] == "skipped: the fp8 weights hold no expert biases"
    scaled = f"dense[routed_scaling_factor={VARIANT_SCALING_FACTOR:g}]"
    assert rows[f"{scaled} ignores-scaling-factor"][-1].startswith("FAILED: error above")
    assert rows[f"{scaled} ignores-activation"][-1] == "ok"
    failed = {" ".join(cells[:2]) for cells in table_lines(out) if cells[-1].startswith("FAILED")}
    assert all("ignores-" in key or "drops-small-slots" in key for key in failed), failed


def test_the_default_check_passes_its_variants(capsys: pytest.CaptureFixture[str]) -> None:
    """Every oracle, and every backend that runs here (Triton under its interpreter), honours every variant it takes."""
    assert main(["check", *SMALL]) == 0
    lines = table_lines(capsys.readouterr().out)
    variant_rows = [cells for cells in lines if "[" in cells[0]]
    assert {cells[0].split("[")[0] for cells in variant_rows} >= {"dense", "nvfp4", "nvfp4-w4a16", "fp8", "fp8-channel"}
    oracle_rows = [cells for cells in variant_rows if cells[1].startswith("reference-") and cells[-1] == "ok"]
    assert len(oracle_rows) >= 5 * 5
    triton = [cells for cells in variant_rows if cells[1].startswith("triton-") and cells[-1] == "ok"]
    assert triton, "Triton's interpreter runs the variants it takes"


@pytest.mark.usefixtures("ignoring_plugins")
def test_a_backend_wrong_on_some_slots_or_past_some_tokens_fails(capsys: pytest.CaptureFixture[str]) -> None:
    """Silent in ``moe-core check`` (adversarial pass 6): a plugin that skips slots weighted under 0.1 passed every row
    (its variants ran 4 tokens, its main row 9.8e-3 under a flat 5e-2; router logits N(0, 1) seldom weight a slot
    that low), then ran 3e-2 off in production (c13); a plugin wrong past 64 tokens passed the 64-token check (c29).
    Variants run the whole batch, router logits are as spread as trained routers', dense formats default to two
    epsilons of the dtype, and every format also runs 1 and ``4 T + 1`` tokens."""
    assert main(["check", "--tokens", "32", "--experts", "8", "--hidden", "32", "--intermediate", "32", "--iters", "1"]) == 1
    rows = table_rows(capsys.readouterr().out)
    assert rows["dense chunks-wrong"][-1] == rows["dense[tokens=1] chunks-wrong"][-1] == "ok", "right within its chunk"
    assert rows["dense[tokens=129] chunks-wrong"][-1].startswith("FAILED: error above 0.0156")
    assert rows["dense[tokens=129] ignores-biases"][-1] == "ok"
    assert rows["dense drops-small-slots"][-1].startswith("FAILED: error above 0.0156")
    assert rows["dense[routing=softmax_topk] drops-small-slots"][-1].startswith("FAILED: error above 0.0156")


@pytest.mark.usefixtures("ignoring_plugins")
def test_a_backend_wrong_on_a_slice_of_experts_small_batches_edits_or_more_slots_fails(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Silent in ``moe-core check`` (adversarial pass 19, k01): four plugins passed every row of the default check,
    then ran 0.42-1.56 off: one taking its experts to be the layer's last ones (the only slice checked), one wrong on
    2 to 32 tokens, one routing again from the router logits a top-k carries, one computing two slots a token. The
    check now also runs a middle slice of the experts, five tokens, a top-k edited after routing and another top-k."""
    assert main(["check", *SMALL]) == 1
    rows = table_rows(capsys.readouterr().out)
    for plugin in ("ignores-expert-offset", "ignores-topk-edits", "ignores-extra-slots"):
        assert rows[f"dense {plugin}"][-1] == "ok", "right on the default config and batch"
    assert rows["dense[tokens=1] ignores-small-batches"][-1] == "ok"
    assert rows["dense[local_experts=2-3/4] ignores-expert-offset"][-1] == "ok", "right for the last experts"
    assert rows["dense[local_experts=1-2/4] ignores-expert-offset"][-1].startswith("FAILED: error above")
    assert rows["dense[tokens=5] ignores-small-batches"][-1].startswith("FAILED: error above")
    assert rows["dense[topk=edited_after_routing] ignores-topk-edits"][-1].startswith("FAILED: error above")
    assert rows["dense[top_k=4] ignores-extra-slots"][-1].startswith("FAILED: error above")
    assert rows["dense[topk=edited_after_routing] reference-dense"][-1] == "ok"


def test_the_default_check_in_float32_passes_its_quantized_oracles(capsys: pytest.CaptureFixture[str]) -> None:
    """A correct program refused (adversarial pass 7, c08): ``moe-core check --dtype fp32`` failed moe-core's own FP8
    and NVFP4 references against the float64 MoE at a float32 epsilon (2e-4 to 7e-3: inputs at rounding midpoints
    take the other code in float32 and in float64). Formats that quantize activations allow such ties."""
    assert oracle_tolerance(torch.float32, quantizes_activations=True) == QUANTIZATION_TIES
    # no TF32 on a CPU: a plugin rounding its GEMM inputs to bf16 (3e-3 off) passed a floor of 5e-3 (pass 8, c11)
    assert backend_tolerance(torch.float32, False, torch.device("cpu")) == 1e-5
    assert backend_tolerance(torch.float32, False, torch.device("cuda")) == 5e-3
    assert main(["check", "--dtype", "fp32", "--iters", "1"]) == 0, capsys.readouterr().out[-3000:]
