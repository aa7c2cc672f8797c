"""Reading a compressed-tensors ``quantization_config``: one walk over its config groups for every such scheme."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence


def compressed_tensors_reason(
    quantization_config: Mapping[str, object] | None,
    *,
    format_name: str,
    group_problem: Callable[[Mapping[str, object]], str | None],
    what: str,
) -> str | None:
    """Why no config group of ``quantization_config`` is ``what`` (None: one is).

    A group qualifies when its ``format`` (or the config's) is ``format_name``
    and ``group_problem`` finds nothing wrong with it; otherwise each group's
    problem is listed.
    """
    if quantization_config is None:
        return "the checkpoint is not quantized"
    method = quantization_config.get("quant_method")
    if method != "compressed-tensors":
        return f"quant_method is {method!r}, not 'compressed-tensors'"
    groups = quantization_config.get("config_groups")
    if not isinstance(groups, Mapping) or not groups:
        return "quantization_config has no config_groups"
    problems = []
    for name, group in groups.items():
        if not isinstance(group, Mapping):
            problems.append(f"{name}: not a mapping")
            continue
        fmt = group.get("format", quantization_config.get("format"))
        problem = f"format is {fmt!r}, not {format_name!r}" if fmt != format_name else group_problem(group)
        if problem is None:
            return None
        problems.append(f"{name}: {problem}")
    return f"no {what} config group (" + "; ".join(problems) + ")"


def targets_module(target: str, module: str) -> bool:
    """Whether a compressed-tensors ``targets`` or ``ignore`` entry names ``module``, an expert projection (a
    ``Linear``): by class name ``Linear``, by a ``re:`` pattern matched from the name's start, or by the name itself."""
    if target.startswith("re:"):
        return re.match(target[3:], module) is not None
    return target in ("Linear", module)


def expert_groups(quantization_config: Mapping[str, object], modules: Sequence[str]) -> Mapping[str, object] | None:
    """``quantization_config`` with only the config groups that quantize the expert projections ``modules``: those
    naming them (by name or pattern) where any does, else those taking every ``Linear``. A mixed-precision checkpoint
    quantizes its attention and its experts by different groups, and only the experts' says how their tensors are
    stored (adversarial pass 16, c10). None where ``ignore`` leaves every one of them unquantized (attention-only
    quantization: the experts are unquantized).

    Raises ``ValueError`` naming a projection that ``ignore`` leaves unquantized while others are not: experts
    stored in two formats.
    """
    ignore = quantization_config.get("ignore")
    ignored = [module for module in modules if isinstance(ignore, list) and any(targets_module(str(t), module) for t in ignore)]
    if ignored and len(ignored) == len(modules):
        return None
    if ignored:
        raise ValueError(
            f"quantization_config.ignore leaves {len(ignored)} of {len(modules)} expert projections unquantized "
            f"({ignored[0]}, ...): experts stored in more than one format are not supported"
        )
    groups = quantization_config.get("config_groups")
    if not isinstance(groups, Mapping) or not modules:
        return quantization_config

    def targets(group: object) -> list[str]:
        found = group.get("targets") if isinstance(group, Mapping) else None
        return [str(target) for target in found] if isinstance(found, list) else []

    projections = list({module.rsplit(".", 1)[-1]: module for module in reversed(modules)}.values())  # one of each
    named = {
        name: group for name, group in groups.items()
        if any(target != "Linear" and targets_module(target, module) for target in targets(group) for module in projections)
    }
    kept = named or {name: group for name, group in groups.items() if "Linear" in targets(group)}
    return {**quantization_config, "config_groups": kept}
