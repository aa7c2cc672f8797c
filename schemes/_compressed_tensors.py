"""Reading a compressed-tensors ``quantization_config``: one walk over its config groups for every such scheme."""

from __future__ import annotations

from collections.abc import Callable, Mapping


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
