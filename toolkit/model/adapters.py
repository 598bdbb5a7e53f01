"""LoRA adapters of a build (`--lora NAME=PATH`): resolved to local PEFT folders and checked against the
base model before anything slow runs, then recorded in the manifest.

    parse_adapters(pairs) -> (AdapterSpec, ...)          names and sources, no disk or network
    check_adapters(specs, base) -> (CheckedAdapter, ...)   each adapter read and checked against the base

An adapter is a Hugging Face PEFT LoRA folder: adapter_config.json (peft_type LORA, r, lora_alpha,
target_modules, base_model_name_or_path) and adapter_model.safetensors, whose tensors are
`...layers.<i>.<path>.<module>.lora_A.weight` [r, in features] and `...lora_B.weight` [out features, r]
(peft's save_pretrained). Task ids are 1, 2, ... in the order given (0: the base model), the ids the
engines' `lora_task_id` input selects.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from toolkit.errors import AdapterError
from toolkit.fsutil import sha256_file
from toolkit.model.facts import ModelFacts

CONFIG_FILE = "adapter_config.json"
WEIGHTS_FILE = "adapter_model.safetensors"
ADAPTER_FILES = (CONFIG_FILE, WEIGHTS_FILE)
PICKLE_WEIGHTS = "adapter_model.bin"
HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
_HUB_CACHE = re.compile(r"models--([\w.-]+?)--([\w.-]+)/snapshots/")
# peft's tensor names: base_model.model.model.layers.3.self_attn.q_proj.lora_A.weight
_TENSOR = re.compile(r"(?:^|\.)layers\.(\d+)\.(?:[\w.]+\.)?(\w+)\.lora_([AB])\.weight$")
# The Hugging Face checkpoints the embedded models were converted from: what their adapters name as base.
EMBEDDED_BASES = {
    "smollm2-135m-instruct": "HuggingFaceTB/SmolLM2-135M-Instruct",
    "gemma3-270m": "google/gemma-3-270m",
}
# adapter_config.json settings no target serves the same way (the GPU conversion folds one alpha/r
# scale per adapter into B; the engines run plain LoRA), each with what to do instead.
_UNSUPPORTED_CONFIG = {
    "use_dora": "DoRA adapters are not served; train a plain LoRA adapter (use_dora: false)",
    "use_rslora": "rank-stabilised scaling is not served; train with use_rslora: false",
    "rank_pattern": "per-module ranks are not served; train one rank r for every module",
    "alpha_pattern": "per-module alphas are not served; train one lora_alpha for every module",
    "modules_to_save": "fully trained modules (modules_to_save) are not served; train LoRA layers only",
    "fan_in_fan_out": "fan_in_fan_out layers (GPT-2's Conv1D) are not served",
}


@dataclass(frozen=True)
class AdapterSpec:
    """One --lora NAME=PATH, parsed: a local folder (absolute) or a hub repo at an optional revision."""

    name: str
    task_id: int
    folder: Path | None = None  # a local adapter
    repo_id: str | None = None  # a hub adapter
    revision: str | None = None

    @property
    def source(self) -> str:
        """Normalised, as the manifest records it: local:/abs/path or hf:ORG/NAME."""
        return f"local:{self.folder}" if self.folder is not None else f"hf:{self.repo_id}"

    @property
    def setting_text(self) -> str:
        """The PATH of --lora NAME=PATH that names this adapter again (rebuild arguments)."""
        if self.folder is not None:
            return str(self.folder)
        return f"hf:{self.repo_id}" + (f"@{self.revision}" if self.revision else "")


@dataclass(frozen=True)
class Adapter:
    """An adapter as the manifest records it (its `adapters` section)."""

    name: str
    task_id: int
    source: str  # local:/abs/path | hf:ORG/NAME
    revision: str | None  # the hub commit, when known
    rank: int  # the largest r of its tensors
    alpha: float  # lora_alpha: the update is scaled by alpha / rank
    target_modules: tuple[str, ...]  # Hugging Face module names (q_proj, ...), sorted
    files: dict[str, str] = field(default_factory=dict)  # file name -> sha256

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "task_id": self.task_id,
            "source": self.source,
            "revision": self.revision,
            "rank": self.rank,
            "alpha": self.alpha,
            "target_modules": list(self.target_modules),
            "files": dict(self.files),
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Adapter:
        return cls(
            name=str(data["name"]),
            task_id=int(data["task_id"]),
            source=str(data["source"]),
            revision=data.get("revision"),
            rank=int(data["rank"]),
            alpha=float(data["alpha"]),
            target_modules=tuple(str(m) for m in data["target_modules"]),
            files={str(k): str(v) for k, v in dict(data["files"]).items()},
        )


@dataclass(frozen=True)
class CheckedAdapter:
    """An adapter checked against the base model, with the local folder its files are in."""

    adapter: Adapter
    folder: Path

    @property
    def name(self) -> str:
        return self.adapter.name


@dataclass(frozen=True)
class BaseModel:
    """What adapters are checked against: the base model's facts, the names it goes by, its served name."""

    facts: ModelFacts
    names: tuple[str, ...]  # hub ids, paths and names an adapter's base_model_name_or_path may give
    served_name: str  # the model id clients see (an adapter may not take it)


def parse_adapters(pairs: Iterable[tuple[str, str]]) -> tuple[AdapterSpec, ...]:
    """The --lora pairs as specs, task ids 1, 2, ... in order; a local PATH must be an existing folder."""
    return tuple(_parse_one(name, text, index) for index, (name, text) in enumerate(pairs, 1))


def _parse_one(name: str, text: str, task_id: int) -> AdapterSpec:
    where = text.strip()
    if where.startswith("hf:"):
        repo_id, _, revision = where[3:].partition("@")
        if not HUB_ID.match(repo_id):
            raise AdapterError(
                f"--lora {name}={text}: {where!r} is not a Hugging Face id",
                hint="write it as hf:ORG/NAME[@REV], or give the adapter's local folder",
                value=text,
            )
        return AdapterSpec(name, task_id, repo_id=repo_id, revision=revision or None)
    folder = Path(where).expanduser().resolve()
    if not folder.is_dir():
        what = "is a file, not a folder" if folder.is_file() else "does not exist"
        raise AdapterError(
            f"--lora {name}={text}: {folder} {what}",
            hint=f"give the PEFT adapter folder that holds {CONFIG_FILE} and {WEIGHTS_FILE}, or "
            "hf:ORG/NAME[@REV]",
            value=text,
        )
    return AdapterSpec(name, task_id, folder=folder)


def base_model_names(
    source_value: str, display_name: str, hub_id: str | None = None
) -> tuple[str, ...]:
    """The names a base model goes by: its --model value, display name, hub id (embedded: the checkpoint
    it was converted from)."""
    names = [source_value, display_name, *([hub_id] if hub_id else [])]
    cached = _HUB_CACHE.search(source_value)  # a local snapshot of the hub cache names its repo
    if cached:
        names.append(f"{cached[1]}/{cached[2]}")
    embedded = EMBEDDED_BASES.get(source_value.lower())
    if embedded:
        names.append(embedded)
    return tuple(dict.fromkeys(n for n in names if n))


def check_adapters(specs: tuple[AdapterSpec, ...], base: BaseModel) -> tuple[CheckedAdapter, ...]:
    """Each adapter resolved (hub adapters downloaded: two small files) and checked against `base`."""
    return tuple(check_adapter(_resolve(spec), spec, base) for spec in specs)


def _resolve(spec: AdapterSpec) -> tuple[Path, str | None]:
    """The adapter's local folder and hub commit (None for a local one)."""
    if spec.folder is not None:
        return spec.folder, None
    from toolkit.model.sources import download_snapshot

    assert spec.repo_id is not None  # a spec is a folder or a hub id (parse_adapters)
    local = download_snapshot(spec.repo_id, spec.revision, list(ADAPTER_FILES))
    commit = local.name if re.fullmatch(r"[0-9a-f]{40}", local.name) else spec.revision
    return local, commit


def check_adapter(
    resolved: tuple[Path, str | None], spec: AdapterSpec, base: BaseModel
) -> CheckedAdapter:
    """Read the adapter's config and tensor shapes (not its weights) and check them against `base`."""
    folder, revision = resolved
    where = f"--lora {spec.name}={spec.setting_text}"
    if spec.name == base.served_name:
        raise AdapterError(
            f"{where}: the name {spec.name!r} is the base model's own model id",
            hint="give the adapter another NAME (clients ask for it as `model: NAME`)",
            value=spec.name,
        )
    config = _read_config(folder, where)
    _check_base_name(config, base, where)
    rank, alpha = _check_config(config, where)
    modules = _check_tensors(folder / WEIGHTS_FILE, base.facts, rank, where)
    adapter = Adapter(
        name=spec.name,
        task_id=spec.task_id,
        source=spec.source,
        revision=revision,
        rank=rank,
        alpha=alpha,
        target_modules=modules,
        files={name: sha256_file(folder / name) for name in ADAPTER_FILES},
    )
    return CheckedAdapter(adapter, folder)


def _read_config(folder: Path, where: str) -> dict[str, Any]:
    path = folder / CONFIG_FILE
    if not path.is_file():
        raise AdapterError(
            f"{where}: no {CONFIG_FILE} in {folder}",
            hint="give a PEFT adapter folder (peft's save_pretrained writes it)",
            value=str(folder),
        )
    if not (folder / WEIGHTS_FILE).is_file():
        pickled = (folder / PICKLE_WEIGHTS).is_file()
        raise AdapterError(
            f"{where}: no {WEIGHTS_FILE} in {folder}"
            + (
                f" (only {PICKLE_WEIGHTS}, a pickle, which can run code when loaded)"
                if pickled
                else ""
            ),
            hint="save the adapter as safetensors (peft's save_pretrained(..., safe_serialization=True))",
            value=str(folder),
        )
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as exc:
        raise AdapterError(
            f"{where}: {path} is not valid JSON ({exc})",
            hint="save the adapter again with peft's save_pretrained",
            value=str(path),
        ) from exc
    if not isinstance(config, dict):
        raise AdapterError(
            f"{where}: {path} is not a JSON object",
            hint="save the adapter again with peft's save_pretrained",
            value=str(path),
        )
    return config


def _normalised(name: str) -> str:
    """A model name without its org, revision and trailing slash, lower case: SmolLM2-135M-Instruct."""
    return name.split("@", 1)[0].rstrip("/").rsplit("/", 1)[-1].lower()


def _check_base_name(config: dict[str, Any], base: BaseModel, where: str) -> None:
    """The adapter's base_model_name_or_path must name the base model (by its hub id, path or name)."""
    named = config.get("base_model_name_or_path")
    if not named:
        return  # nothing to compare; the shapes below still must fit
    known = {_normalised(n) for n in base.names} | {n for n in base.names}
    if str(named) in known or _normalised(str(named)) in known:
        return
    raise AdapterError(
        f"{where} was trained on {named!r} (base_model_name_or_path in {CONFIG_FILE}), not on the base "
        f"model {base.names[0]!r}",
        hint=f"give an adapter trained on {base.names[-1]}, or build the adapter's base model "
        f"(--model {named}); if {base.names[0]} is that very model, set base_model_name_or_path in "
        f"{CONFIG_FILE} to {base.names[-1]!r}",
        value=named,
    )


def _check_config(config: dict[str, Any], where: str) -> tuple[int, float]:
    """rank (r) and lora_alpha of a plain LoRA adapter."""
    kind = config.get("peft_type")
    if str(kind).upper() != "LORA":
        raise AdapterError(
            f"{where} is a {kind} adapter (peft_type in {CONFIG_FILE}), not LoRA",
            hint="give a LoRA adapter (peft's LoraConfig)",
            value=kind,
        )
    for key, fix in _UNSUPPORTED_CONFIG.items():
        if config.get(key):
            raise AdapterError(
                f"{where}: {key} = {config[key]!r} in {CONFIG_FILE}", hint=fix, value=config[key]
            )
    if config.get("bias", "none") != "none":
        raise AdapterError(
            f"{where}: bias = {config['bias']!r} in {CONFIG_FILE}: trained biases are not served",
            hint="train the adapter with bias: none",
            value=config["bias"],
        )
    rank, alpha = config.get("r"), config.get("lora_alpha", config.get("r"))
    if isinstance(rank, bool) or not isinstance(rank, int) or rank < 1:
        raise AdapterError(
            f"{where}: r = {rank!r} in {CONFIG_FILE}; the rank must be a positive integer",
            hint="save the adapter again with peft's save_pretrained",
            value=rank,
        )
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or alpha <= 0:
        raise AdapterError(
            f"{where}: lora_alpha = {alpha!r} in {CONFIG_FILE}; it must be a positive number",
            hint="save the adapter again with peft's save_pretrained",
            value=alpha,
        )
    return rank, float(alpha)


def module_shapes(facts: ModelFacts) -> dict[str, tuple[int, int]]:
    """The decoder's linear layers an adapter may target, by Hugging Face name: (in, out) features."""
    q = facts.num_attention_heads * facts.head_dim
    kv = facts.num_kv_heads * facts.head_dim
    hidden, inner = facts.hidden_size, facts.intermediate_size
    if facts.model_type == "phi3":  # fused layers (transformers' Phi3Attention / Phi3MLP)
        return {
            "qkv_proj": (hidden, q + 2 * kv),
            "o_proj": (q, hidden),
            "gate_up_proj": (hidden, 2 * inner),
            "down_proj": (inner, hidden),
        }
    shapes = {
        "q_proj": (hidden, q),
        "k_proj": (hidden, kv),
        "v_proj": (hidden, kv),
        "o_proj": (q, hidden),
    }
    # A mixture of experts' MLPs are its experts, which these adapters do not reach.
    if not facts.num_experts:
        shapes |= {
            "gate_proj": (hidden, inner),
            "up_proj": (hidden, inner),
            "down_proj": (inner, hidden),
        }
    return shapes


def _read_shapes(path: Path, where: str) -> dict[str, list[int]]:
    """Every tensor's shape from the safetensors header; AdapterError for a file that is not whole."""
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(str(path), framework="numpy") as handle:
            names = handle.keys()  # the handle is not iterable
            return {key: list(handle.get_slice(key).get_shape()) for key in names}
    except (SafetensorError, OSError, ValueError) as exc:
        raise AdapterError(
            f"{where}: {path} is not a readable safetensors file ({exc})",
            hint="the file is corrupt or incomplete: download or save the adapter again",
            value=str(path),
        ) from exc


def _check_tensors(path: Path, facts: ModelFacts, rank: int, where: str) -> tuple[str, ...]:
    """The target modules the tensors hold, each tensor's shape checked against the base; sorted names."""
    shapes = module_shapes(facts)
    found: dict[tuple[int, str], dict[str, list[int]]] = {}
    for key, shape in _read_shapes(path, where).items():
        match = _TENSOR.search(key)
        if match is None:
            raise AdapterError(
                f"{where}: tensor {key!r} in {path.name} is not a LoRA layer of a decoder layer",
                hint="give an adapter with LoRA layers only (target_modules among "
                f"{', '.join(shapes)})",
                value=key,
            )
        layer, module, side = int(match[1]), match[2], match[3]
        _check_module(layer, module, facts, shapes, where)
        found.setdefault((layer, module), {})[side] = shape
    if not found:
        raise AdapterError(
            f"{where}: {path.name} holds no LoRA tensors",
            hint="save the adapter again with peft's save_pretrained",
            value=str(path),
        )
    for (layer, module), pair in sorted(found.items()):
        _check_pair(layer, module, pair, shapes[module], rank, where)
    return tuple(sorted({module for _, module in found}))


def _check_module(
    layer: int, module: str, facts: ModelFacts, shapes: dict[str, tuple[int, int]], where: str
) -> None:
    if module not in shapes:
        raise AdapterError(
            f"{where} targets {module!r}, which the base model ({facts.architecture}) has no LoRA-able "
            f"layer of",
            hint=f"give an adapter whose target_modules are among {', '.join(shapes)}",
            value=module,
        )
    if layer >= facts.num_layers:
        raise AdapterError(
            f"{where} has a layer {layer}, but the base model has {facts.num_layers} layers",
            hint="give an adapter trained on this base model",
            value=layer,
        )


def _check_pair(
    layer: int,
    module: str,
    pair: dict[str, list[int]],
    features: tuple[int, int],
    rank: int,
    where: str,
) -> None:
    """lora_A [rank, in] and lora_B [out, rank] of one layer's module."""
    name = f"layers.{layer}.{module}"
    if set(pair) != {"A", "B"}:
        missing = "lora_B" if "A" in pair else "lora_A"
        raise AdapterError(
            f"{where}: {name} has no {missing} tensor",
            hint="the adapter file is incomplete: save it again with peft's save_pretrained",
            value=name,
        )
    expected = {"A": [rank, features[0]], "B": [features[1], rank]}
    for side in ("A", "B"):
        if pair[side] != expected[side]:
            raise AdapterError(
                f"{where}: {name}.lora_{side} has shape {pair[side]}, the base model needs "
                f"{expected[side]} ([rank, in features], [out features, rank] with r = {rank})",
                hint="give an adapter trained on this base model (its hidden sizes differ), saved with "
                "the r its adapter_config.json says",
                value=pair[side],
            )
