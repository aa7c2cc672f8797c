"""Read one MoE layer of a Hugging Face safetensors checkpoint into a scheme, as an engine does.

:class:`MoeCheckpoint` reads ``config.json`` (the layer's sizes, named as
each architecture names them, and ``quantization_config``; ModelOpt's
``hf_quant_config.json`` where ``config.json`` has none), the shard index
``model.safetensors.index.json`` (or a single ``model.safetensors``), picks
the scheme that takes the quantization config, and hands the layer's expert
tensors to the scheme's loader one expert and one shard at a time (an
architecture that stacks its experts, gpt-oss, is split per expert and its
interleaved gate/up rows reordered first; its routing, activation and
biases come from ``config.json`` too, :class:`LayerSemantics`). A
safetensors file that cannot be read raises :class:`CorruptCheckpoint`,
naming the file and its damage.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TypeVar, final

import attrs
import torch
from safetensors import SafetensorError, safe_open

from moe_core._checks import FLOAT8_DTYPES
from moe_core.config import (
    Activation,
    ClampedSwiglu,
    ExpertActivation,
    HIDDEN_ACTS,
    GroupedTopK,
    MoeRunnerConfig,
    Routing,
    RoutingMethod,
)
from moe_core.expert_params import ExpertShard
from moe_core.fp8 import (
    ExpertFp8Scales,
    Fp8BlockExpertWeights,
    Fp8BlockScales,
    Fp8ChannelExpertWeights,
    Fp8ChannelScales,
    Fp8ExpertWeights,
)
from moe_core.formats.dense.weights import GateUpLayout
from moe_core.layer import SharedExpert
from moe_core.routing import Router
from moe_core.scheme import MoeScheme, SchemeOptions, SchemeSpec, UnsupportedCheckpoint

INDEX_FILE = "model.safetensors.index.json"
SINGLE_FILE = "model.safetensors"
S = TypeVar("S", bound=MoeScheme)

DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


@final
@attrs.frozen(kw_only=True)
class LayerSemantics:
    """What an architecture's ``config.json`` says its MoE layers compute, beyond their sizes."""

    routing: Routing
    activation: ExpertActivation = Activation.SILU_GATED
    routed_scaling_factor: float = 1.0
    expert_biases: bool = False
    correction_bias: bool = False
    """The router chooses with a score correction bias (DeepSeek-V3's ``noaux_tc``): a checkpoint without it is
    refused, since routing without it picks other experts for about a quarter of the tokens."""
    router_bias: bool = False
    """The router adds a bias to its logits (gpt-oss): a checkpoint without it is refused, and one with it where the
    architecture has none (its model would not add it) too (adversarial pass 20, d10: 0.17 off without it)."""


def _float_field(config: Mapping[str, object], key: str, default: float) -> float:
    value = config.get(key, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"config.json: expected a number at {key!r}, got {value!r}")
    return float(value)


def _bool_field(config: Mapping[str, object], key: str, default: bool) -> bool:
    """A JSON boolean; a string such as ``"false"`` (which ``bool()`` reads as True) is refused by name."""
    value = config.get(key, default)
    if not isinstance(value, bool):
        raise ValueError(f"config.json: expected true or false at {key!r}, got {value!r}")
    return value


def _choice_field(config: Mapping[str, object], key: str, expected: str) -> None:
    """Refuse a ``config.json`` value the loader does not compute (absent: the architecture's own ``expected``)."""
    value = config.get(key, expected)
    if value != expected:
        raise UnsupportedCheckpoint(f"config.json: {key} {value!r} is not computed here (only {expected!r})")


def _hidden_act(config: Mapping[str, object]) -> Activation:
    """The experts' gated activation from ``hidden_act`` (default ``silu``); a name moe-core does not compute, or a
    non-gated one (these experts load w1 and w3), is refused by name."""
    name = config.get("hidden_act", "silu")
    activation = HIDDEN_ACTS.get(name) if isinstance(name, str) else None
    if activation is None or not activation.gated:
        gated = sorted(key for key, value in HIDDEN_ACTS.items() if value.gated)
        raise UnsupportedCheckpoint(f"config.json: hidden_act {name!r} is not a gated activation computed here ({', '.join(gated)})")
    return activation


def _softmax(renormalize: str | None) -> Callable[[Mapping[str, object]], LayerSemantics]:
    """Softmax top-k routing (renormalized where the flag ``renormalize`` says, always where it is None), the
    activation ``hidden_act`` names."""

    def semantics(config: Mapping[str, object]) -> LayerSemantics:
        renormalized = True if renormalize is None else _bool_field(config, renormalize, False)
        routing = RoutingMethod.TOPK_RENORMALIZE if renormalized else RoutingMethod.SOFTMAX_TOPK
        return LayerSemantics(routing=routing, activation=_hidden_act(config))

    return semantics


def _gpt_oss(config: Mapping[str, object]) -> LayerSemantics:
    """gpt-oss: softmax over the top-k logits, clamped SwiGLU, biases after both expert GEMMs."""
    activation = ClampedSwiglu(alpha=_float_field(config, "swiglu_alpha", 1.702), limit=_float_field(config, "swiglu_limit", 7.0))
    return LayerSemantics(routing=RoutingMethod.TOPK_RENORMALIZE, activation=activation, expert_biases=True, router_bias=True)


def _deepseek_v3(config: Mapping[str, object]) -> LayerSemantics:
    """DeepSeek-V3: sigmoid scores, grouped top-k with the router's correction bias (``noaux_tc``), a routed scaling
    factor (2.5 where absent, as transformers reads the config); another scoring function or top-k method
    (DeepSeek-V2's) is refused by name."""
    _choice_field(config, "scoring_func", "sigmoid")
    _choice_field(config, "topk_method", "noaux_tc")
    routing = GroupedTopK(
        n_group=_int_field(config, "n_group", "config.json"),
        topk_group=_int_field(config, "topk_group", "config.json"),
        renormalize=_bool_field(config, "norm_topk_prob", True),
    )
    return LayerSemantics(
        routing=routing,
        activation=_hidden_act(config),
        routed_scaling_factor=_float_field(config, "routed_scaling_factor", 2.5),  # transformers' default
        correction_bias=True,
    )


@final
@attrs.frozen
class ArchitectureNames:
    """How one architecture's ``config.json`` and tensor names describe its MoE layers."""

    num_experts: tuple[str, ...]
    """Keys of the expert count, the first present wins (Hub Qwen3-MoE configs say ``num_experts``,
    transformers 5 writes ``num_local_experts``)."""
    intermediate_size: str
    """Key of one expert's intermediate size."""
    block: str
    """The MoE block's module name inside a decoder layer (``mlp``, ``block_sparse_moe``)."""
    router: str = attrs.field(default="gate", kw_only=True)
    """The router's module name inside the block (``gate``; gpt-oss: ``router``)."""
    fused_experts: GateUpLayout | None = attrs.field(default=None, kw_only=True)
    """None: one tensor per expert and projection (``experts.{e}.{proj}.{name}``); a layout: stacks over the experts,
    ``experts.{gate_up_proj|down_proj}[_{name}]`` ``[E, ...]``, whose fused gate/up rows are in that layout (gpt-oss)."""
    semantics: Callable[[Mapping[str, object]], LayerSemantics] = attrs.field(kw_only=True)
    """The layer's routing, activation, scaling and biases from ``config.json``."""
    float32_router: bool = attrs.field(default=False, kw_only=True)
    """The architecture computes its router logits in float32 whatever the model's dtype (DeepSeek-V3)."""
    shared_expert: str | None = attrs.field(default=None, kw_only=True)
    """The shared expert's module name inside the block (DeepSeek-V3: ``shared_experts``), None where it has none."""


ARCHITECTURES: Mapping[str, ArchitectureNames] = {
    "qwen3_moe": ArchitectureNames(
        ("num_experts", "num_local_experts"), "moe_intermediate_size", "mlp", semantics=_softmax("norm_topk_prob")
    ),
    "mixtral": ArchitectureNames(("num_local_experts",), "intermediate_size", "block_sparse_moe", semantics=_softmax(None)),
    "gpt_oss": ArchitectureNames(
        ("num_local_experts",), "intermediate_size", "mlp",
        router="router", fused_experts=GateUpLayout.INTERLEAVED, semantics=_gpt_oss,
    ),
    "deepseek_v3": ArchitectureNames(
        ("n_routed_experts",), "moe_intermediate_size", "mlp", semantics=_deepseek_v3, float32_router=True,
        shared_expert="shared_experts",
    ),
}
"""The architectures (``config.json``'s ``model_type``) whose MoE layers the loader knows."""

_EXPERT_KEY = re.compile(r"\.experts\.(\d+)\.(gate_proj|up_proj|down_proj|w1|w2|w3)\.(\w+)$")
_FUSED_KEY = re.compile(r"\.experts\.(gate_up_proj|down_proj)(?:_(\w+))?$")
"""Stacked experts' tensors: ``experts.{gate_up_proj|down_proj}_{name}``, or the bare projection (its weight, as
transformers saves an unquantized gpt-oss: ``[E, in_features, out_features]``, which its forward multiplies from the
right)."""


class CorruptCheckpoint(ValueError):
    """A checkpoint file that is damaged: truncated, not safetensors, or without a tensor its index places there.

    The message names the file and the damage (for a truncated file, its size
    against the size its header describes, and the first tensor cut off), so
    that a user knows which file to fetch again.
    """


def _damage(path: Path) -> str | None:
    """What the size and header of ``path`` say is wrong with it; None where they agree.

    safetensors says only that its header does not cover the file; the size
    the header describes and the tensors past the end say how much is missing.
    """
    size = path.stat().st_size
    with path.open("rb") as file:
        prefix = file.read(8)
        length = int.from_bytes(prefix, "little")
        if len(prefix) < 8:
            return f"not a safetensors file: {size} bytes, fewer than the 8 that give its header's length"
        if length > size - 8:
            return f"not a safetensors file, or cut inside its header: {size} bytes, its first 8 announce a {length}-byte header"
        header = file.read(length)
    try:
        spans = sorted(
            (int(entry["data_offsets"][0]), int(entry["data_offsets"][1]), name)
            for name, entry in json.loads(header).items()
            if name != "__metadata__"
        )
    except (ValueError, TypeError, KeyError, IndexError, AttributeError):
        return f"not a safetensors file: its {length}-byte header is not JSON tensor entries with data_offsets"
    expected = 8 + length + max((end for _, end, _ in spans), default=0)
    if size < expected:
        cut = [name for _, end, name in spans if 8 + length + end > size]
        return (
            f"truncated: {size} bytes where its header describes {expected}; "
            f"the tensors from {cut[0]!r} on ({len(cut)} of {len(spans)}) read past the end"
        )
    if size > expected:
        return f"{size} bytes where its header describes {expected}: bytes after its last tensor"
    return None


def _open(path: Path) -> safe_open:
    """``path`` opened by safetensors; one it refuses raises :class:`CorruptCheckpoint`, naming the damage."""
    try:
        return safe_open(str(path), "pt")
    except SafetensorError as error:
        damage = _damage(path)
        raise CorruptCheckpoint(f"{path}: {damage} (safetensors: {error})" if damage else f"{path}: {error}") from None


def _read_json(path: Path) -> dict[str, object]:
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise FileNotFoundError(f"{path}: not found (is {path.parent} a Hugging Face checkpoint?)") from None
    except json.JSONDecodeError as error:
        raise ValueError(f"{path}: not valid JSON ({error})") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a JSON object, got {type(data).__name__}")
    return data


def _int_field(config: Mapping[str, object], key: str, where: str) -> int:
    value = config.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"{where}: expected a positive int at {key!r}, got {value!r}")
    return value


def _quantization_config(directory: Path, config: Mapping[str, object]) -> Mapping[str, object] | None:
    quant = config.get("quantization_config")
    if quant is not None:
        if not isinstance(quant, Mapping):
            raise ValueError(f"{directory / 'config.json'}: quantization_config is not an object")
        return quant
    modelopt = directory / "hf_quant_config.json"
    if modelopt.exists():
        section = _read_json(modelopt).get("quantization")
        if not isinstance(section, Mapping):
            raise ValueError(f"{modelopt}: expected a 'quantization' object")
        return {"quant_method": "modelopt", **section}
    return None


@final
class ReadOnlyConfig(Mapping[str, object]):
    """``config.json`` as a mapping that takes no writes (a write after opening would change nothing the checkpoint
    already read), and that copies and pickles like the dict it holds."""

    def __init__(self, values: Mapping[str, object]) -> None:
        self._values = dict(values)

    def __getitem__(self, key: str) -> object:
        return self._values[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)

    def __repr__(self) -> str:
        return f"ReadOnlyConfig({self._values!r})"


@final
class MoeCheckpoint:
    """A checkpoint directory: its MoE architecture, quantization config, scheme and tensors."""

    def __init__(self, directory: str | Path) -> None:
        """Read ``config.json`` and the shard index of ``directory``; raises naming what is missing or wrong."""
        self.directory = Path(directory)
        """The checkpoint directory."""
        if self.directory.is_file():
            raise NotADirectoryError(
                f"{self.directory}: expected a checkpoint directory (holding config.json and the safetensors shards), "
                "got a file"
            )
        config = _read_json(self.directory / "config.json")
        self.config: Mapping[str, object] = ReadOnlyConfig(config)
        """``config.json`` as read, read-only: what it says is taken as the checkpoint is opened, so a write into it
        later would change nothing (an override goes into the file, or the layer's config)."""
        where = str(self.directory / "config.json")
        model_type = config.get("model_type")
        names = ARCHITECTURES.get(str(model_type))
        if names is None:
            raise UnsupportedCheckpoint(
                f"{where}: model_type {model_type!r} is not an MoE architecture the loader knows "
                f"({', '.join(sorted(ARCHITECTURES))})"
            )
        self.model_type = str(model_type)
        """``config.json``'s ``model_type``."""
        self.names = names
        """How this architecture names its MoE parts."""
        experts_key = next((key for key in names.num_experts if key in config), names.num_experts[0])
        self.num_experts = _int_field(config, experts_key, where)
        """Routed experts per MoE layer."""
        self.top_k = _int_field(config, "num_experts_per_tok", where)
        """Experts per token."""
        self.hidden_size = _int_field(config, "hidden_size", where)
        """H."""
        self.intermediate_size = _int_field(config, names.intermediate_size, where)
        """One expert's intermediate size I."""
        self.semantics = names.semantics(config)
        """The layer's routing, activation, routed scaling and expert biases, as ``config.json`` says."""
        self.routing_method = self.semantics.routing
        """How the architecture's router picks and weights experts."""
        dtype_name = config.get("dtype", config.get("torch_dtype", "bfloat16"))
        if dtype_name not in DTYPES:
            raise UnsupportedCheckpoint(f"{where}: dtype {dtype_name!r} is not one of {sorted(DTYPES)}")
        self.dtype = DTYPES[str(dtype_name)]
        """The unquantized tensors' dtype."""
        self.quantization_config = _quantization_config(self.directory, config)
        """``quantization_config`` (None for an unquantized checkpoint)."""
        self.weight_map = self._weight_map()
        """Each tensor's name and the shard file holding it."""

    def _weight_map(self) -> dict[str, str]:
        index = self.directory / INDEX_FILE
        if index.exists():
            weight_map = _read_json(index).get("weight_map")
            if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
                raise ValueError(f"{index}: expected a 'weight_map' of tensor name to file name")
            return {str(key): str(value) for key, value in weight_map.items()}
        single = self.directory / SINGLE_FILE
        if not single.exists():
            raise FileNotFoundError(f"{self.directory}: neither {INDEX_FILE} nor {SINGLE_FILE} is there")
        with _open(single) as handle:
            return {key: SINGLE_FILE for key in handle.keys()}

    def scheme(self, schemes: Sequence[SchemeSpec] | None = None) -> SchemeSpec:
        """The first of ``schemes`` (default: every shipped scheme) that takes this quantization config."""
        if schemes is None:
            from moe_core.schemes import SCHEMES

            schemes = SCHEMES
        quantization_config = self.quantization_config
        if quantization_config is not None and quantization_config.get("quant_method") == "compressed-tensors":
            from moe_core.schemes._compressed_tensors import expert_groups

            modules = [
                key.rsplit(".", 1)[0] for layer in self.moe_layers() if self.names.fused_experts is None
                for key, _, _, name in self.expert_keys(layer) if name == "weight" or name.startswith("weight_packed")
            ]
            try:
                quantization_config = expert_groups(quantization_config, modules)
            except ValueError as error:
                raise UnsupportedCheckpoint(f"{self.directory}: {error}") from None
        reasons = []
        for spec in schemes:
            reason = spec.unsupported_reason(quantization_config)
            if reason is None:
                return spec
            reasons.append(f"{spec.name}: {reason}")
        raise UnsupportedCheckpoint(f"{self.directory}: no scheme takes this checkpoint ({'; '.join(reasons)})")

    def block_prefix(self, layer: int) -> str:
        """The tensor-name prefix of decoder layer ``layer``'s MoE block."""
        return f"model.layers.{layer}.{self.names.block}"

    def moe_layers(self) -> list[int]:
        """The decoder layers that hold routed experts, in order."""
        pattern = re.compile(rf"^model\.layers\.(\d+)\.{re.escape(self.names.block)}\.experts\.")
        return sorted({int(match[1]) for key in self.weight_map if (match := pattern.match(key))})

    def runner_config(self, *, num_local_experts: int | None = None, local_expert_offset: int = 0) -> MoeRunnerConfig:
        """The layer's :class:`MoeRunnerConfig` (this rank's experts under expert parallelism)."""
        return MoeRunnerConfig(
            num_experts=self.num_experts,
            hidden_size=self.hidden_size,
            intermediate_size_per_partition=self.intermediate_size,
            top_k=self.top_k,
            num_local_experts=self.num_experts if num_local_experts is None else num_local_experts,
            local_expert_offset=local_expert_offset,
            routing_method=self.routing_method,
            activation=self.semantics.activation,
            routed_scaling_factor=self.semantics.routed_scaling_factor,
            expert_biases=self.semantics.expert_biases,
        )

    def _require_agreement(self, config: MoeRunnerConfig) -> None:
        """Refuse a config that computes another layer than this checkpoint's. The caller's own: this rank's experts,
        and a slot-row config (:func:`~moe_core.distributed.slot_config`: ``top_k`` 1 over a dispatcher's slot
        rows); any other ``top_k``, 1 included, routes the model otherwise."""
        if config.top_k != self.top_k and not config.slot_rows:
            raise ValueError(
                f"config.top_k: {self.directory / 'config.json'} routes each token to {self.top_k} experts, got "
                f"{config.top_k} (a dispatcher's slot rows, one slot each, take moe_core.distributed.slot_config(config))"
            )
        own = attrs.evolve(
            self.runner_config(num_local_experts=config.num_local_experts, local_expert_offset=config.local_expert_offset),
            top_k=config.top_k, slot_rows=config.slot_rows,
        )
        differ = [
            f"{field.name} {getattr(config, field.name)!r} (the checkpoint's: {getattr(own, field.name)!r})"
            for field in attrs.fields(MoeRunnerConfig)
            if getattr(config, field.name) != getattr(own, field.name)
        ]
        if differ:
            raise ValueError(
                f"config: {self.directory / 'config.json'} describes another layer: {'; '.join(differ)}; only "
                "num_local_experts, local_expert_offset (this rank's experts) and slot rows (slot_config) are the caller's"
            )

    def _require_layer(self, layer: int) -> None:
        layers = self.moe_layers()
        if layer not in layers:
            raise ValueError(f"layer: {self.directory} has MoE experts in layers {layers}, not in layer {layer}")

    def _read(self, keys: Sequence[str]) -> Iterator[tuple[str, torch.Tensor]]:
        """The tensors ``keys``, one shard file open at a time."""
        by_file: dict[str, list[str]] = {}
        for key in keys:
            by_file.setdefault(self.weight_map[key], []).append(key)
        for file_name, file_keys in by_file.items():
            path = self.directory / file_name
            if not path.exists():
                raise FileNotFoundError(f"{path}: listed in {INDEX_FILE} but not there")
            with _open(path) as handle:
                held = set(handle.keys())
                for key in file_keys:
                    if key not in held:
                        raise CorruptCheckpoint(f"{path}: holds no tensor {key!r}, which {INDEX_FILE} places there")
                    yield key, handle.get_tensor(key)

    def router_weight(self, layer: int) -> torch.Tensor:
        """The router's ``[num_experts, hidden]`` weight of ``layer``, for a router that is its weight alone; where the
        checkpoint's router also adds a logit bias (gpt-oss), ``ValueError`` naming :meth:`router`, which takes the
        whole router (a ``Router`` of the weight alone picked other experts and weights, silently: adversarial pass
        6, c28)."""
        bias = f"{self.block_prefix(layer)}.{self.names.router}.bias"
        if bias in self.weight_map:
            raise ValueError(
                f"router_weight: layer {layer}'s router also adds a logit bias ({bias}); a router of its weight alone "
                "routes other experts: take the whole router with router(layer)"
            )
        return self._router_weight(layer)

    def _router_weight(self, layer: int) -> torch.Tensor:
        """The router's weight of ``layer``, whatever else the router holds."""
        key = f"{self.block_prefix(layer)}.{self.names.router}.weight"
        if key not in self.weight_map:
            raise KeyError(f"{key}: not in {self.directory}")
        ((_, tensor),) = self._read([key])
        return tensor

    def router(self, layer: int, *, device: torch.device | None = None) -> Router:
        """``layer``'s whole router: its weight, its logit bias (gpt-oss) and its score correction bias
        (DeepSeek-V3's ``e_score_correction_bias``) where the checkpoint holds them, in float32 where the
        architecture computes its router so (DeepSeek-V3); on ``device`` (default: the CPU). Route with
        :func:`~moe_core.routing.route`: the bias that chooses DeepSeek-V3's experts comes with it."""
        prefix = f"{self.block_prefix(layer)}.{self.names.router}"
        weight = self._router_weight(layer)
        extra = {name: f"{prefix}.{name}" for name in ("bias", "e_score_correction_bias")}
        present = {name: key for name, key in extra.items() if key in self.weight_map}
        tensors = dict(self._read(list(present.values())))
        bias, correction = (tensors.get(extra[name]) for name in ("bias", "e_score_correction_bias"))
        if (bias is None) == self.semantics.router_bias:
            raise ValueError(
                f"{extra['bias']}: "
                + (f"not in {self.directory}, and the {self.model_type} router adds it to its logits"
                   if bias is None else f"the {self.model_type} router has no bias, which its model would not add")
            )
        if correction is None and self.semantics.correction_bias:
            raise ValueError(
                f"{extra['e_score_correction_bias']}: not in {self.directory}, and its topk_method noaux_tc chooses "
                "experts with it (routing without it picks other experts for about a quarter of the tokens)"
            )
        if self.names.float32_router:
            weight = weight.float()
            bias = None if bias is None else bias.float()
        on = torch.device("cpu") if device is None else device
        return Router(
            weight=weight.to(on),
            bias=None if bias is None else bias.to(on),
            score_correction_bias=None if correction is None else correction.float().to(on),
        )

    def shared_expert(self, layer: int, *, device: torch.device | None = None) -> SharedExpert | None:
        """``layer``'s shared expert (DeepSeek-V3's ``shared_experts``), None where the layer has none.

        Schemes and :meth:`load_layer` compute the routed experts only, as
        engines' fused MoE kernels do; the model's block adds this MLP's
        output once per token: ``layer.apply(...) + shared(x)``. Projections
        stored in FP8 (128x128 blocks, ``weight_scale_inv``; or compressed-tensors'
        per-tensor or per-channel ``weight_scale``) are dequantized to the
        checkpoint's dtype and computed there; other quantized projections are
        refused by name.
        """
        keys = self.shared_expert_keys(layer)
        if not keys:
            said = self.config.get("n_shared_experts") if self.names.shared_expert is not None else None
            if isinstance(said, int) and not isinstance(said, bool) and said > 0:
                raise ValueError(
                    f"{self.block_prefix(layer)}.{self.names.shared_expert}: not in {self.directory}, and config.json's "
                    f"n_shared_experts={said} adds it to every token (adversarial pass 21, a02: 0.58 off without it)"
                )
            return None
        prefix = f"{self.block_prefix(layer)}.{self.names.shared_expert}."
        tensors = dict(self._read(keys))
        projections = {}
        for projection in ("gate_proj", "up_proj", "down_proj"):
            names = {key[len(prefix) + len(projection) + 1 :] for key in keys if key.startswith(f"{prefix}{projection}.")}
            weight = tensors.get(f"{prefix}{projection}.weight")
            if weight is None or not (names <= {"weight", "weight_scale_inv"} or names <= {"weight", "weight_scale", "input_scale"}):
                raise ValueError(
                    f"{prefix}{projection}: expected weight, with FP8 block scales weight_scale_inv or FP8 weight_scale "
                    f"(and input_scale), got {sorted(names)}"
                )
            block_scales = tensors.get(f"{prefix}{projection}.weight_scale_inv")
            scale = tensors.get(f"{prefix}{projection}.weight_scale")
            if weight.dtype in FLOAT8_DTYPES and block_scales is None and scale is None:
                raise ValueError(f"{prefix}{projection}.weight: FP8 codes without their weight_scale or weight_scale_inv")
            codes: Fp8BlockExpertWeights | Fp8ExpertWeights | Fp8ChannelExpertWeights | None = None
            try:  # the FP8 types check the scales' convention and shape, and the codes
                if block_scales is not None:
                    codes = Fp8BlockExpertWeights(weight[None], Fp8BlockScales.from_checkpoint(block_scales[None]))
                elif scale is not None and scale.numel() == 1:
                    codes = Fp8ExpertWeights(weight[None], ExpertFp8Scales.from_checkpoint(scale.reshape(1)))
                elif scale is not None:
                    codes = Fp8ChannelExpertWeights(weight[None], Fp8ChannelScales.from_checkpoint(scale.reshape(1, -1)))
            except (TypeError, ValueError) as error:  # named by the checkpoint's tensor, as the routed experts' are
                raise type(error)(f"{prefix}{projection}: {error}") from None
            if codes is not None:
                weight = codes.dequantize(self.dtype)[0]
            projections[projection] = weight.to(self.dtype).to(torch.device("cpu") if device is None else device)
        return SharedExpert.from_projections(
            gate=projections["gate_proj"], up=projections["up_proj"], down=projections["down_proj"],
            activation=self.semantics.activation,
        )

    def shared_expert_keys(self, layer: int) -> list[str]:
        """The names of ``layer``'s shared-expert tensors (none where the architecture or the layer has none): whether
        :meth:`shared_expert` has one to read, without reading it."""
        self._require_layer(layer)
        if self.names.shared_expert is None:
            return []
        prefix = f"{self.block_prefix(layer)}.{self.names.shared_expert}."
        return sorted(key for key in self.weight_map if key.startswith(prefix))

    def expert_keys(self, layer: int) -> list[tuple[str, int, ExpertShard, str]]:
        """``(tensor name, expert id, shard, name after the projection)`` of every expert tensor of ``layer``."""
        self._require_layer(layer)
        if self.names.fused_experts is not None:
            raise ValueError(f"{self.model_type}: its experts are stacked tensors ([E, ...]), not one per expert")
        prefix = f"{self.block_prefix(layer)}.experts."
        found = []
        for key in self.weight_map:
            if key.startswith(prefix) and (match := _EXPERT_KEY.search(key)):
                found.append((key, int(match[1]), ExpertShard.from_projection(match[2]), match[3]))
        self._require_read(layer, _EXPERT_KEY, "experts.{e}.{gate_proj|up_proj|down_proj|w1|w3|w2}.{name}")
        return found

    def _require_read(self, layer: int, pattern: re.Pattern[str], layout: str) -> None:
        """Raise ``ValueError`` naming a tensor under ``layer``'s experts that the loader would not read (``pattern``
        is what it reads): stacked experts beside per-expert ones, with other values, loaded silently as the
        per-expert ones (adversarial pass 18, c09), or another architecture's layout."""
        prefix = f"{self.block_prefix(layer)}.experts."
        unread = sorted(key for key in self.weight_map if key.startswith(prefix) and not pattern.search(key))
        if unread:
            more = f" and {len(unread) - 1} more" if len(unread) > 1 else ""
            raise ValueError(
                f"{unread[0]}{more}: under layer {layer}'s experts, where the {self.model_type} loader reads "
                f"{layout} only (experts stored twice, or in another architecture's layout?)"
            )

    def _expert_tensors(self, layer: int) -> Iterator[tuple[str, int, ExpertShard, str, torch.Tensor]]:
        """``(tensor name, expert id, shard, name after the projection, tensor)`` of each expert projection of ``layer``.

        Stacked experts (gpt-oss) are split into one tensor per expert and shard, their fused gate/up rows
        (dim 1) reordered from the architecture's layout to ``[gate | up]`` first.
        """
        layout = self.names.fused_experts
        if layout is None:
            names = {key: (expert, shard, name) for key, expert, shard, name in self.expert_keys(layer)}
            for key, tensor in self._read(list(names)):
                yield (key, *names[key], tensor)
            return
        self._require_layer(layer)
        self._require_read(layer, _FUSED_KEY, "experts.{gate_up_proj|down_proj}[_{name}]")
        prefix = f"{self.block_prefix(layer)}.experts."
        fused = {key: match for key in self.weight_map if key.startswith(prefix) and (match := _FUSED_KEY.search(key))}
        for key, tensor in self._read(list(fused)):
            projection, name = fused[key][1], fused[key][2] or "weight"
            if fused[key][2] is None:
                if tensor.dim() != 3:
                    raise ValueError(f"{key}: expected [num_experts, in_features, out_features], got {tuple(tensor.shape)}")
                tensor = tensor.transpose(1, 2)
            if projection == "down_proj":
                for expert in range(tensor.shape[0]):
                    yield key, expert, ExpertShard.DOWN, name, tensor[expert]
                continue
            if tensor.dim() < 2 or tensor.shape[1] % 2:
                raise ValueError(f"{key}: expected [num_experts, 2 * intermediate_size, ...], got {tuple(tensor.shape)}")
            gate, up = layout.to_concatenated(tensor, 1).chunk(2, dim=1)
            for expert in range(tensor.shape[0]):
                yield key, expert, ExpertShard.GATE, name, gate[expert]
                yield key, expert, ExpertShard.UP, name, up[expert]

    def load_layer(
        self,
        layer: int,
        *,
        device: torch.device = torch.device("cpu"),
        config: MoeRunnerConfig | None = None,
        scheme: SchemeSpec | None = None,
        backend: str | None = None,
        strict: bool = False,
        keep_canonical: bool = False,
        activation_dtype: torch.dtype | None = None,
    ) -> MoeScheme:
        """Layer ``layer`` through its scheme: created, loaded expert by expert, processed, ready to apply.

        ``config`` defaults to :meth:`runner_config` (all experts local);
        ``scheme`` to :meth:`scheme`; ``backend`` names one (default: chosen
        by capability), ``strict`` forbids degradation between formats,
        ``keep_canonical`` keeps the canonical weights beside the backend's;
        ``activation_dtype`` is the hidden states' dtype the backend is chosen
        for (default: the checkpoint's own, :attr:`dtype`: an fp16 model runs
        fp16 hidden states). :meth:`load_into` does the same for a scheme
        object the caller made (and keeps its type).
        """
        spec = self.scheme() if scheme is None else scheme
        dtype = self.dtype if activation_dtype is None else activation_dtype
        options = SchemeOptions(backend=backend, strict=strict, activation_dtype=dtype)
        made = spec.for_layer(self.runner_config() if config is None else config, device, self.dtype, options)
        return self.load_into(layer, made, keep_canonical=keep_canonical)

    def load_into(self, layer: int, scheme: S, *, keep_canonical: bool = False) -> S:
        """Hand ``layer``'s expert tensors to ``scheme``'s loader one at a time, then process them; returns ``scheme``.

        A tensor the scheme refuses is reported by its name in the checkpoint;
        a scheme whose config says other than the checkpoint does (sizes,
        routing, activation, scaling, biases: anything but this rank's experts)
        is refused before any tensor is read.
        """
        self._require_agreement(scheme.config)
        for key, expert, shard, name, tensor in self._expert_tensors(layer):
            try:
                scheme.load_expert_weight(name, tensor, expert_id=expert, shard=shard)
            except (TypeError, ValueError) as error:
                short, message = f"experts.{expert}.{shard.projection}.{name}", str(error)
                raise type(error)(key + message[len(short):] if message.startswith(short) else f"{key}: {message}") from None
        try:
            scheme.process_weights_after_loading(keep_canonical=keep_canonical)
        except (TypeError, ValueError) as error:
            raise type(error)(f"{self.block_prefix(layer)} of {self.directory}: {error}") from None
        return scheme
