"""Write a Triton model repository: the five models, the tokenizer, the engine, and a manifest.

plan (what to write, and its build key) -> execute (render into a temporary sibling) -> record
(manifest, then an atomic swap into place). An interrupted or failed build leaves the previous
repository, or nothing, never a half-made one; an unchanged rebuild is skipped.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from toolkit import __version__
from toolkit.errors import RepositoryError
from toolkit.fsutil import file_lock, sha256_file
from toolkit.model.chat_template import template_from_tokenizer_dir
from toolkit.model.facts import ModelFacts, read_model_facts
from toolkit.model.sources import ResolvedModel
from toolkit.repository import configs
from toolkit.repository import contract as c
from toolkit.repository.sources import model_repo_sources, sources_digest

MANIFEST = "manifest.json"
MANIFEST_FORMAT = 1
TOKENIZER_FILES = (
    "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja",
    "chat_template.json", "generation_config.json", "config.json", "tokenizer.model",
)
ENGINE_SOURCES = {"cpu": "tensorrt_llm_cpu", "synthetic": "tensorrt_llm_synthetic"}
TEXT_MODELS = (c.PREPROCESSING, c.POSTPROCESSING, c.BLS)


@dataclass(frozen=True)
class RepositoryLimits:
    max_batch_size: int = 64
    max_input_len: int = 1536
    max_output_len: int = 1024
    max_seq_len: int = 2048
    max_num_tokens: int = 256  # tokens per engine step (prefill chunks + decodes)
    kv_cache_tokens: int = 32768  # paged KV pool, in tokens (the CPU engine's memory bound)
    kv_block_size: int = 64  # tokens per KV page


@dataclass(frozen=True)
class RepositoryPlan:
    """Everything that decides the repository's content; its key names an unchanged rebuild."""

    model: ResolvedModel
    facts: ModelFacts
    target: str
    output: Path
    limits: RepositoryLimits
    end_id: int
    engine_parameters: dict = field(default_factory=dict)
    preprocessing_instances: int = 1
    postprocessing_instances: int = 1
    engine_config: object = None  # GPU targets: the tensorrtllm ModelConfig of a compiled engine
    memory_plan: dict | None = None  # GPU targets: the planner's numbers (bench compares against its bounds)

    @property
    def engine_pbtxt(self) -> str:
        return configs.to_pbtxt(self.engine_config) if self.engine_config is not None else ""

    @property
    def key(self) -> str:
        payload = {
            "toolkit": __version__, "sources": sources_digest(), "target": self.target,
            "model": self.model.source, "revision": self.model.revision, "files": checkpoint_hashes(self.model.path),
            "limits": self.limits.__dict__, "end_id": self.end_id, "engine": self.engine_parameters,
            "instances": [self.preprocessing_instances, self.postprocessing_instances], "engine_config": self.engine_pbtxt,
            "memory_plan": self.memory_plan,
        }
        return hashlib.sha256(json.dumps(payload, sort_keys=True, default=str).encode()).hexdigest()[:20]


@dataclass(frozen=True)
class RepositoryResult:
    path: Path
    skipped: bool
    key: str
    manifest: dict


def plan_repository(model: ResolvedModel, target: str, output: Path, limits: RepositoryLimits | None = None,
                    engine_parameters: dict | None = None, engine_config=None, memory_plan: dict | None = None) -> RepositoryPlan:
    if target not in ENGINE_SOURCES and engine_config is None:
        raise RepositoryError(f"target {target!r} needs a compiled engine", hint=f"use toolkit build --target {target}, or one of: {', '.join(ENGINE_SOURCES)}")
    facts = read_model_facts(model.path)
    limits = _fit_limits(limits or RepositoryLimits(), facts)
    return RepositoryPlan(model=model, facts=facts, target=target, output=output.resolve(), limits=limits,
                          end_id=_end_id(model.path, facts), engine_parameters=dict(engine_parameters or {}),
                          engine_config=engine_config, memory_plan=memory_plan)


def write_repository(plan: RepositoryPlan, progress: Callable[[str], None] = lambda _: None) -> RepositoryResult:
    output = plan.output
    output.parent.mkdir(parents=True, exist_ok=True)
    with file_lock(output.parent / f".{output.name}.lock"):
        key = plan.key
        existing = read_manifest(output) if (output / MANIFEST).is_file() else None
        if existing and existing.get("build_key") == key:
            return RepositoryResult(output, True, key, existing)
        if output.exists() and existing is None and any(output.iterdir()):
            raise RepositoryError(
                f"{output} exists and is not a toolkit repository (no {MANIFEST}); refusing to overwrite it",
                hint="choose another --output, or remove that folder yourself",
            )
        staging = Path(tempfile.mkdtemp(prefix=f".{output.name}.building-", dir=output.parent))
        try:
            manifest = _render(plan, staging, key, progress)
            _swap_into_place(staging, output)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    return RepositoryResult(output, False, key, manifest)


def read_manifest(repo: Path) -> dict:
    path = repo / MANIFEST
    if not path.is_file():
        raise RepositoryError(
            f"{repo} is not a toolkit model repository (no {MANIFEST})",
            hint="build one with: toolkit build --target cpu --model smollm2-135m-instruct --output DIR",
        )
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise RepositoryError(f"{path} is corrupt: {exc}", hint="rebuild the repository with toolkit build") from exc


def checkpoint_hashes(path: Path) -> dict[str, str]:
    """sha256 of every file the repository takes from the checkpoint (weights, configs, tokenizer)."""
    files = sorted(p for p in path.iterdir() if p.is_file() and (p.suffix == ".safetensors" or p.name in TOKENIZER_FILES or p.name.endswith(".index.json")))
    return {p.name: _cached_hash(p) for p in files}


_HASH_CACHE: dict[tuple, str] = {}


def _cached_hash(path: Path) -> str:
    stat = path.stat()
    key = (str(path), stat.st_size, stat.st_mtime_ns)
    if key not in _HASH_CACHE:
        _HASH_CACHE[key] = sha256_file(path)
    return _HASH_CACHE[key]


# --- rendering ---------------------------------------------------------------------------------
def _render(plan: RepositoryPlan, root: Path, key: str, progress) -> dict:
    sources = model_repo_sources()
    limits = plan.limits
    text_params = {
        "tokenizer_dir": "tokenizer", "add_special_tokens": False, "end_id": plan.end_id, "pad_id": plan.end_id,
        "max_input_len": limits.max_input_len, "max_output_len": limits.max_output_len, "max_seq_len": limits.max_seq_len,
    }
    progress("text models")
    for name in TEXT_MODELS:
        version = root / name / "1"
        shutil.copytree(sources / name / "1", version, ignore=shutil.ignore_patterns("__pycache__"))
        shutil.copy2(sources / "common" / "textcodec.py", version / "textcodec.py")
        _copy_tokenizer(plan.model.path, version / "tokenizer")
    template = template_from_tokenizer_dir(plan.model.path)
    _write_config(root, configs.python_model(c.PREPROCESSING, c.PREPROCESSING_INPUTS, c.PREPROCESSING_OUTPUTS,
                  max_batch_size=limits.max_batch_size, instances=plan.preprocessing_instances, dynamic_batching=True,
                  parameters={**text_params, **({"chat_template": template} if template else {})}))
    _write_config(root, configs.python_model(c.POSTPROCESSING, c.POSTPROCESSING_INPUTS, c.POSTPROCESSING_OUTPUTS,
                  max_batch_size=limits.max_batch_size, instances=plan.postprocessing_instances, dynamic_batching=True,
                  parameters={"tokenizer_dir": "tokenizer", "skip_special_tokens": True}))
    _write_config(root, configs.python_model(c.BLS, c.TEXT_INPUTS, c.TEXT_OUTPUTS, max_batch_size=limits.max_batch_size,
                  decoupled=True, parameters={**text_params, "tensorrt_llm_model_name": c.ENGINE,
                                              "max_concurrent_requests": limits.max_batch_size}))
    (root / c.ENSEMBLE / "1").mkdir(parents=True)
    _write_config(root, configs.ensemble_model(limits.max_batch_size))
    progress("engine")
    _render_engine(plan, root, sources)
    manifest = _manifest(plan, key)
    (root / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
    return manifest


def _render_engine(plan: RepositoryPlan, root: Path, sources: Path) -> None:
    version = root / c.ENGINE / "1"
    if plan.engine_config is not None:  # GPU: the engine stays where it was built; gpt_model_path names it
        version.mkdir(parents=True)
        _write_config(root, plan.engine_config)
        return
    shutil.copytree(sources / ENGINE_SOURCES[plan.target] / "1", version, ignore=shutil.ignore_patterns("__pycache__"))
    limits = plan.limits
    parameters = {
        "max_seq_len": limits.max_seq_len, "max_output_len": limits.max_output_len, "max_num_tokens": limits.max_num_tokens,
        "end_id": plan.end_id, "exclude_input_in_output": True, "vocab_size": plan.facts.vocab_size,
        "kv_block_size": limits.kv_block_size, "kv_cache_blocks": -(-limits.kv_cache_tokens // limits.kv_block_size),
        "cancellation_check_period_ms": 100,
        **plan.engine_parameters,
    }
    if plan.target == "cpu":
        parameters["checkpoint_dir"] = "weights"
        _link_checkpoint(plan.model.path, version / "weights")
    if plan.target == "synthetic" and "token_ids" not in parameters:
        parameters["token_ids"] = ",".join(str(i) for i in _plain_word_ids(plan.model.path, plan.end_id))
    _write_config(root, configs.python_model(c.ENGINE, c.ENGINE_INPUTS, c.ENGINE_OUTPUTS, max_batch_size=limits.max_batch_size,
                  decoupled=True, parameters=parameters))


def _plain_word_ids(checkpoint: Path, end_id: int) -> list[int]:
    """Ids of ordinary words for the synthetic engine to emit, so its text looks like text."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(checkpoint / "tokenizer.json"))
    ids = tokenizer.encode(SYNTHETIC_TEXT, add_special_tokens=False).ids
    return [i for i in ids if i != end_id]


SYNTHETIC_TEXT = (" The quick brown fox jumps over the lazy dog while a patient engineer measures every layer of"
                  " the serving stack, one streamed token at a time.")


def _write_config(root: Path, config) -> None:
    (root / config.name).mkdir(parents=True, exist_ok=True)
    (root / config.name / "config.pbtxt").write_text(configs.to_pbtxt(config))


def _copy_tokenizer(checkpoint: Path, target: Path) -> None:
    target.mkdir(parents=True)
    for name in TOKENIZER_FILES:
        if (checkpoint / name).is_file():
            shutil.copy2(checkpoint / name, target / name)
    if not (target / "tokenizer.json").is_file():
        raise RepositoryError(
            f"{checkpoint} has no tokenizer.json (fast tokenizer)",
            hint="save the tokenizer with transformers' AutoTokenizer(...).save_pretrained() into the checkpoint",
        )


def _link_checkpoint(checkpoint: Path, target: Path) -> None:
    """Hard-link the weights when on the same filesystem (no second copy of GBs), else copy."""
    target.mkdir(parents=True)
    for path in checkpoint.iterdir():
        if path.is_file() and (path.suffix == ".safetensors" or path.name in TOKENIZER_FILES or path.name.endswith(".index.json")):
            try:
                os.link(path.resolve(), target / path.name)
            except OSError:
                shutil.copy2(path, target / path.name)


def _swap_into_place(staging: Path, output: Path) -> None:
    if not output.exists():
        staging.rename(output)
        return
    retired = output.with_name(f".{output.name}.old-{os.getpid()}")
    output.rename(retired)
    staging.rename(output)
    shutil.rmtree(retired, ignore_errors=True)


def _manifest(plan: RepositoryPlan, key: str) -> dict:
    return {
        "format": MANIFEST_FORMAT,
        "toolkit_version": __version__,
        "sources_digest": sources_digest(),
        "build_key": key,
        "target": plan.target,
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "model": {"source": plan.model.source, "revision": plan.model.revision, "facts": plan.facts.to_dict()},
        "files": checkpoint_hashes(plan.model.path),
        "limits": plan.limits.__dict__,
        "end_id": plan.end_id,
        "engine_parameters": plan.engine_parameters,
        "memory_plan": plan.memory_plan,
        "versions": _library_versions(),
    }


def _library_versions() -> dict:
    from importlib.metadata import PackageNotFoundError, version
    import platform

    found = {"python": platform.python_version()}
    for name in ("torch", "transformers", "tokenizers", "tritonclient", "nvidia-pytriton"):
        try:
            found[name] = version(name)
        except PackageNotFoundError:
            found[name] = None
    return found


def _fit_limits(limits: RepositoryLimits, facts: ModelFacts) -> RepositoryLimits:
    for name in ("max_batch_size", "max_input_len", "max_output_len", "max_seq_len", "max_num_tokens", "kv_cache_tokens", "kv_block_size"):
        if getattr(limits, name) <= 0:
            raise RepositoryError(f"--{name.replace('_', '-')}={getattr(limits, name)} must be positive", hint="pass a positive number")
    if limits.max_seq_len > facts.max_position_embeddings:
        raise RepositoryError(
            f"--max-seq-len={limits.max_seq_len} is over the model's max_position_embeddings {facts.max_position_embeddings}",
            hint=f"pass --max-seq-len {facts.max_position_embeddings} or less",
        )
    if limits.max_input_len >= limits.max_seq_len:
        raise RepositoryError(
            f"--max-input-len={limits.max_input_len} leaves no room to generate within --max-seq-len={limits.max_seq_len}",
            hint="make --max-input-len smaller than --max-seq-len",
        )
    if limits.kv_cache_tokens < limits.max_seq_len:
        raise RepositoryError(
            f"--kv-cache-tokens={limits.kv_cache_tokens} cannot hold one sequence of --max-seq-len={limits.max_seq_len}",
            hint=f"pass --kv-cache-tokens {limits.max_seq_len} or more",
        )
    return limits


def _end_id(checkpoint: Path, facts: ModelFacts) -> int:
    path = checkpoint / "generation_config.json"
    if path.is_file():
        eos = json.loads(path.read_text()).get("eos_token_id")
        if isinstance(eos, list) and eos:
            return int(eos[0])
        if isinstance(eos, int):
            return eos
    if facts.eos_token_ids:
        return facts.eos_token_ids[0]
    raise RepositoryError(f"{checkpoint} names no eos_token_id", hint="add eos_token_id to its generation_config.json")
