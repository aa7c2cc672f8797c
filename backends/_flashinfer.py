"""What the FlashInfer backends share: finding the package, telling why it cannot run, probing its signatures.

FlashInfer's public functions are typed ``Any`` (a decorator erases them), and
their signatures grew between releases (tail arguments added, some removed,
enums renumbered). So each backend calls FlashInfer from one adapter module,
through its own typed Protocol of each function; the adapter passes the
stable head of arguments by position and the rest by keyword, checks once
with :func:`require_parameters` that the installed function takes them, and
names enum members, never their numbers.

Nothing here imports FlashInfer: a backend's supports answer must come quickly, and on
machines without it.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import importlib.util
import inspect
from collections.abc import Callable, Collection, Iterable

import attrs
import torch

from moe_core.capability import DeviceSpec, LayerSpec, Support
from moe_core.config import Activation, MoeRunnerConfig
from moe_core._checks import require_dtype, require_ndim, require_positive, require_tensor
from moe_core.global_scales import _TensorScale

DISTRIBUTION = "flashinfer-python"
"""The package the ``flashinfer`` extra installs."""

SUPPORTED = ">=0.6.18,<0.8"
"""The versions the adapters are written and tested against (0.6.18 on the H200, 0.7.4 in CI)."""


class FlashinferApiError(RuntimeError):
    """The installed FlashInfer lacks an argument or function an adapter needs."""


class BackendUnavailableError(RuntimeError):
    """A FlashInfer runner was asked for where its backend cannot run; the message gives every reason."""


def require_available(name: str, device_support: Callable[[DeviceSpec], Support]) -> None:
    """Raise :class:`BackendUnavailableError` unless backend ``name`` runs on the current device.

    Runner factories call it, so ``create_runner`` says why (compute capability,
    missing package, cubins) instead of failing inside a kernel launch.
    """
    device = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")
    verdict = device_support(DeviceSpec.of(device))
    if not verdict.ok:
        raise BackendUnavailableError(f"{name} cannot run on {device}: {verdict.describe()}")


def installed_version() -> str | None:
    """The installed ``flashinfer-python`` version, or None (reads metadata only; imports nothing)."""
    try:
        return importlib.metadata.version(DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        return None


def _format_capability(capability: tuple[int, int]) -> str:
    return f"SM{capability[0]}{capability[1]}"


def device_reasons(device: DeviceSpec, capabilities: Collection[tuple[int, int]], *, minimum: bool) -> list[str]:
    """Why FlashInfer kernels built for ``capabilities`` cannot run on ``device`` (empty when they can).

    ``minimum`` reads ``capabilities`` as one lower bound (``{(9, 0)}``: SM90
    and later) instead of the exact list the kernels are built for.
    """
    reasons = []
    if not device.has("flashinfer"):
        reasons.append(f"flashinfer is not installed (pip install 'moe-core[flashinfer]', {DISTRIBUTION}{SUPPORTED})")
    wanted = (
        f"{_format_capability(min(capabilities))} or later"
        if minimum
        else " or ".join(_format_capability(c) for c in sorted(capabilities))
    )
    if device.kind != "cuda":
        reasons.append(f"needs a CUDA GPU of {wanted}, not {device.kind}")
    elif device.capability is None:
        reasons.append(f"needs a CUDA GPU of {wanted}; torch sees none")
    else:
        found = device.capability
        fits = found >= min(capabilities) if minimum else found in capabilities
        if not fits:
            reasons.append(f"needs {wanted}, found {device.describe()}")
    return reasons


def swiglu_only(layer: LayerSpec) -> list[str]:
    """Why a FlashInfer MoE kernel cannot compute ``layer``: they are built here for gated SiLU (SwiGLU) experts
    without biases, the top-k weights scaling each expert's output."""
    return swiglu_reasons(layer.config)


def require_swiglu(owner: str, config: MoeRunnerConfig) -> None:
    """``ValueError`` naming ``owner`` and every :func:`swiglu_reasons` of ``config``: the runners' own check, for
    runners made by key (``create_runner``, ``key.bind``) that selection's ``supports`` never saw."""
    reasons = swiglu_reasons(config)
    if reasons:
        raise ValueError(f"{owner}: {'; '.join(reasons)}")


def swiglu_reasons(config: MoeRunnerConfig) -> list[str]:
    """:func:`swiglu_only`'s reasons, from the config alone."""
    reasons = []
    if config.activation is not Activation.SILU_GATED:
        reasons.append(f"the adapter passes SwiGLU only, not {config.activation.value}")
    if config.routing_method.scales_input:
        reasons.append(f"the kernels weight each expert's output, not its input ({config.routing_method.value} routing)")
    if config.expert_biases:
        reasons.append("the adapter passes no per-expert biases")
    return reasons


def row_alignment_reasons(layer: LayerSpec) -> list[str]:
    """Why ``layer``'s sizes do not fit the FP4 kernels' 128-row tiles (empty when they do)."""
    config = layer.config
    sizes = {"hidden_size": config.hidden_size, "intermediate_size": config.intermediate_size_per_partition}
    return [f"{name} must be a multiple of {ROW_ALIGNMENT}, got {size}" for name, size in sizes.items() if size % ROW_ALIGNMENT]


ROW_ALIGNMENT = 128
"""The FP4 kernels tile expert weights, and their swizzled scales, in 128-row blocks: I and H must be multiples of it."""


def require_row_alignment(owner: str, **sizes: int) -> None:
    """``ValueError`` naming ``owner`` and the size unless each of ``sizes`` is a multiple of :data:`ROW_ALIGNMENT`."""
    for name, size in sizes.items():
        if size % ROW_ALIGNMENT:
            raise ValueError(f"{owner}: {name} must be a multiple of {ROW_ALIGNMENT}, got {size}")


def autotuning() -> contextlib.AbstractContextManager[None]:
    """FlashInfer's autotuner, on: kernels called inside profile their tactics once per shape and keep the fastest.

    Run one forward per token count under it at warm-up, before timing or
    CUDA-graph capture: on the H200 the default CUTLASS tactic was 4.5-7x
    slower than the tuned one (``../shared/flashinfer-h200``).
    """
    import flashinfer

    tuner: contextlib.AbstractContextManager[None] = flashinfer.autotune(True)
    return tuner


def require_parameters(function: Callable[..., object], qualname: str, needed: Iterable[str]) -> frozenset[str]:
    """The installed ``function``'s parameter names; :class:`FlashinferApiError` if any of ``needed`` is missing."""
    parameters = frozenset(inspect.signature(function).parameters)
    missing = [name for name in needed if name not in parameters]
    if missing:
        raise FlashinferApiError(
            f"{qualname} of the installed flashinfer {installed_version()} takes no {', '.join(missing)}; "
            f"moe-core's adapter supports {DISTRIBUTION}{SUPPORTED}"
        )
    return parameters


@attrs.frozen(eq=False)
class ExpertKernelScalars(_TensorScale):
    """Base of the per-expert float32 ``[local_num_experts]`` scalars FlashInfer's kernels multiply by.

    Each kernel argument of this kind is its own subclass with named
    constructors from typed global scales, so neither a raw tensor nor one
    scalar in place of another can be handed to a quant info (``__init__``
    takes nothing: see :class:`~moe_core.global_scales._TensorScale`).
    """

    @classmethod
    def _check(cls, value: torch.Tensor) -> None:
        name = f"{cls.__name__}.value"
        require_tensor(name, value)
        require_dtype(name, value, (torch.float32,))
        require_ndim(name, value, 1, "[local_num_experts]")
        require_positive(name, value)

    @property
    def num_experts(self) -> int:
        """Local experts covered."""
        return int(self.value.shape[0])
