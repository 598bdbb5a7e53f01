"""Write a Triton model repository: the five models, the tokenizer, the engine, and a manifest.

plan (what to write, and its build key) -> execute (render into a temporary sibling) -> record
(manifest, then an atomic swap into place). An interrupted or failed build leaves the previous
repository, or nothing, never a half-made one; an unchanged rebuild is skipped. A folder that this
toolkit did not write is never touched.
"""

from __future__ import annotations

import errno
import glob
import hashlib
import json
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from toolkit import __version__
from toolkit.build_settings import BuildSettings
from toolkit.capabilities import Capabilities
from toolkit.errors import RepositoryError, ToolkitError
from toolkit.fsutil import (
    check_free_space,
    copy_file,
    copy_tree,
    disk_full_error,
    file_lock,
    folder_in_use,
    make_world_readable,
    write_text_atomic,
)
from toolkit.model.adapters import ADAPTER_FILES, CheckedAdapter
from toolkit.model.chat_template import template_from_tokenizer_dir
from toolkit.model.facts import ModelFacts, read_model_facts
from toolkit.model.sources import ResolvedModel
from toolkit.model.tokens import TokenFacts, read_token_facts
from toolkit.model.verify import checked_sha256
from toolkit.plan.memory import MemoryPlan
from toolkit.repository import configs
from toolkit.repository import contract as c
from toolkit.repository.engine import CHECKPOINT_FILES, EngineSpec, checkpoint_files
from toolkit.repository.limits import RepositoryLimits
from toolkit.repository.reader import (
    MANIFEST,
    MANIFEST_FORMAT,
    Manifest,
    ModelSection,
    is_toolkit_repository,
    open_repository,
    record_files,
)
from toolkit.repository.sources import COMMON_MODULES, model_repo_sources, sources_digest
from toolkit.signals import deferred_interrupts

TEXT_MODELS = (c.PREPROCESSING, c.POSTPROCESSING, c.BLS)
_DISK_FULL = (errno.ENOSPC, errno.EDQUOT)


@dataclass(frozen=True)
class RepositoryPlan:
    """Everything that decides the repository's content; its key names an unchanged rebuild."""

    model: ResolvedModel
    facts: ModelFacts
    tokens: TokenFacts
    engine: EngineSpec
    output: Path
    limits: RepositoryLimits
    target: str
    settings: BuildSettings  # as the build resolved them (the manifest records them)
    capabilities: Capabilities
    decoupled: bool = True
    # GPU targets: the planner's numbers (bench compares against its bounds).
    memory_plan: MemoryPlan | None = None
    preprocessing_instances: int = 1
    postprocessing_instances: int = 1
    adapters: tuple[CheckedAdapter, ...] = ()  # LoRA adapters, checked against the model

    @property
    def key(self) -> str:
        payload = {
            "toolkit": __version__,
            "sources": sources_digest(),
            "target": self.target,
            "model": self.model.source,
            "revision": self.model.revision,
            "files": checkpoint_hashes(self.model.path),
            "limits": self.limits.to_dict(),
            "tokens": self.tokens.to_dict(),
            "engine": self.engine.section().to_dict(),
            "settings": self.settings.to_dict(),
            "capabilities": self.capabilities.to_dict(),
            "decoupled": self.decoupled,
            "instances": [self.preprocessing_instances, self.postprocessing_instances],
            "memory_plan": None if self.memory_plan is None else self.memory_plan.to_dict(),
            "adapters": [
                checked.adapter.to_dict() for checked in self.adapters
            ],  # their file hashes too
        }
        return hashlib.sha256(
            json.dumps(payload, sort_keys=True, default=str).encode()
        ).hexdigest()[:20]


@dataclass(frozen=True)
class RepositoryResult:
    path: Path
    skipped: bool
    key: str
    interrupted_after_swap: bool = (
        False  # Ctrl-C or SIGTERM arrived during the swap; the new repository is whole
    )


def plan_repository(
    model: ResolvedModel,
    engine: EngineSpec,
    output: Path,
    limits: RepositoryLimits,
    *,
    target: str,
    settings: BuildSettings,
    capabilities: Capabilities,
    memory_plan: MemoryPlan | None = None,
    adapters: tuple[CheckedAdapter, ...] = (),
) -> RepositoryPlan:
    """What to write for `model` with this engine and these limits (checked against the model)."""
    facts = read_model_facts(model.path)
    tokens = read_token_facts(model.path)
    return RepositoryPlan(
        model=model,
        facts=facts,
        tokens=tokens,
        engine=engine.prepared(model.path, tokens),
        output=Path(output).resolve(),
        limits=limits.check(facts.max_position_embeddings),
        target=target,
        settings=settings,
        capabilities=capabilities,
        decoupled=settings.decoupled is not False,
        memory_plan=memory_plan,
        adapters=adapters,
    )


def write_repository(
    plan: RepositoryPlan,
    progress: Callable[[str], None] = lambda _: None,
    *,
    discard_changes: bool = False,
) -> RepositoryResult:
    output = plan.output
    output.parent.mkdir(parents=True, exist_ok=True)
    with file_lock(output.parent / f".{output.name}.lock"):
        _remove_leftovers(output)
        key = plan.key
        if _up_to_date(output, key):
            return RepositoryResult(output, True, key)
        check_output_folder(output, discard_changes=discard_changes)
        check_free_space(output.parent, _bytes_needed(plan), f"writing the repository {output}")
        staging = Path(
            tempfile.mkdtemp(prefix=f".{output.name}.building-{os.getpid()}-", dir=output.parent)
        )
        try:
            make_world_readable(staging)
            _render(plan, staging, key, progress)
            with deferred_interrupts() as arrived:
                _swap_into_place(staging, output)
        except OSError as exc:
            if exc.errno in _DISK_FULL:
                raise disk_full_error(
                    exc, output.parent, f"writing the repository {output}"
                ) from exc
            raise
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    return RepositoryResult(output, False, key, interrupted_after_swap=bool(arrived))


def checkpoint_hashes(path: Path) -> dict[str, str]:
    """sha256 of every file the repository takes from the checkpoint (weights, configs, tokenizer)."""
    return {p.name: checked_sha256(p) for p in checkpoint_files(path)}


# --- what may be replaced ----------------------------------------------------------------------
def _up_to_date(output: Path, key: str) -> bool:
    if not is_toolkit_repository(output):
        return False
    try:
        repo = open_repository(output)
    except ToolkitError:
        return False  # ours, but of another format or half-made: rebuilt
    return repo.manifest.build_key == key and not repo.file_changes()


def check_output_folder(output: Path, *, discard_changes: bool = False) -> None:
    """Only an empty folder or a repository this toolkit wrote, as it wrote it, may be replaced (a
    repository whose files were edited, added or removed only with `discard_changes`). Checked before
    anything slow (a download, a conversion, an engine build) and again under the output's lock."""
    if not output.exists():
        _check_can_create(output)
        return
    if not output.is_dir():
        raise RepositoryError(
            f"--output {output} is a file, not a folder; refusing to replace it",
            hint="choose another --output",
        )
    if is_toolkit_repository(output):
        if folder_in_use(output):
            raise RepositoryError(
                f"{output} is being served (a tritonserver or an OpenAI API of toolkit serve or toolkit "
                "api has it open); refusing to replace it under them: the stubs and API workers that "
                "start again would read the new build while the rest run the old one",
                hint="stop that server first, or build to another --output and serve that",
            )
        if not discard_changes:
            _refuse_changed_repository(output)
        return
    if not any(output.iterdir()):
        return
    marker = (
        " (its manifest.json was not written by this toolkit)"
        if (output / MANIFEST).exists()
        else ""
    )
    raise RepositoryError(
        f"{output} exists and is not a toolkit repository{marker}; refusing to overwrite it, nothing in it was touched",
        hint="choose another --output, or remove that folder yourself",
    )


def _check_can_create(output: Path) -> None:
    """The nearest existing folder above `output` must be a folder this process may write in."""
    above = output.parent
    while not above.exists() and above != above.parent:
        above = above.parent
    if not above.is_dir() or not os.access(above, os.W_OK | os.X_OK):
        what = "is not a folder" if not above.is_dir() else "is not writable"
        raise RepositoryError(
            f"cannot write in {above}: it {what}, so --output {output} cannot be created",
            hint="choose an --output in a folder you can write to",
        )


def _refuse_changed_repository(output: Path) -> None:
    try:
        changes = open_repository(output).file_changes()
    except ToolkitError:
        return  # ours, but of another format or half-made: nothing of the user's to keep
    if not changes:
        return
    listed = ", ".join(f"{c.path} ({c.change})" for c in changes[:8])
    more = f" and {len(changes) - 8} more" if len(changes) > 8 else ""
    raise RepositoryError(
        f"{output} has changed since it was built: {listed}{more}; rebuilding would lose "
        "these changes, so nothing was touched",
        hint="copy what you want to keep, then rebuild with --discard-changes (or choose another --output)",
    )


def _remove_leftovers(output: Path) -> None:
    """Staging and retired folders of builds that were killed; we hold the output's lock, so none is live."""
    name = glob.escape(output.name)  # an output named "a[b]" must not match another's folders
    for pattern in (f".{name}.building-*", f".{name}.old-*"):
        for leftover in output.parent.glob(pattern):
            shutil.rmtree(leftover, ignore_errors=True)


def _bytes_needed(plan: RepositoryPlan) -> int:
    files = checkpoint_files(plan.model.path)
    weights = (
        sum(p.stat().st_size for p in files if p.name not in CHECKPOINT_FILES)
        if plan.engine.copies_weights
        else 0
    )
    tokenizer = sum(p.stat().st_size for p in files if p.name in CHECKPOINT_FILES)
    adapters = sum(
        (a.folder / name).stat().st_size for a in plan.adapters for name in ADAPTER_FILES
    )
    return weights + tokenizer * (len(TEXT_MODELS) + 1) + adapters + (1 << 20)


# --- rendering ---------------------------------------------------------------------------------
def _render(plan: RepositoryPlan, root: Path, key: str, progress) -> None:
    sources = model_repo_sources()
    limits, tokens = plan.limits, plan.tokens
    text_params = {
        "tokenizer_dir": "tokenizer",
        "add_special_tokens": tokens.add_special_tokens,
        "bos_id": -1 if tokens.bos_id is None else tokens.bos_id,
        "end_id": tokens.end_id,
        "pad_id": tokens.pad_id,
        "stop_ids": ",".join(str(i) for i in tokens.stop_ids),
        "max_input_len": limits.max_input_len,
        "max_output_len": limits.max_output_len,
        "max_seq_len": limits.max_seq_len,
    }
    # TensorRT-LLM takes runtime LoRA weights only in the engine's own dtype (tests/data/upstream).
    lora_type = plan.engine.lora_weights_type
    progress("text models")
    for name in TEXT_MODELS:
        version = root / name / "1"
        copy_tree(sources / name / "1", version)
        for module in COMMON_MODULES:
            copy_file(sources / "common" / f"{module}.py", version / f"{module}.py")
        _copy_tokenizer(plan.model.path, version / "tokenizer")
    template = template_from_tokenizer_dir(plan.model.path)
    _write_config(
        root,
        configs.python_model(
            c.PREPROCESSING,
            c.PREPROCESSING_INPUTS,
            c.PREPROCESSING_OUTPUTS,
            max_batch_size=limits.max_batch_size,
            instances=plan.preprocessing_instances,
            dynamic_batching=True,
            parameters={**text_params, **({"chat_template": template} if template else {})},
        ),
    )
    _write_config(
        root,
        configs.python_model(
            c.POSTPROCESSING,
            c.POSTPROCESSING_INPUTS,
            c.POSTPROCESSING_OUTPUTS,
            max_batch_size=limits.max_batch_size,
            instances=plan.postprocessing_instances,
            # Not dynamically batched (NVIDIA's is): Triton 2.51's batcher fails a queued request whose
            # ensemble was cancelled, and an ensemble whose step fails while its engine step still streams
            # never ends (it stops counting its steps' final responses): it stays in flight for good and
            # every later stop waits the whole drain timeout. Unbatched, a cancelled step runs (its text
            # goes nowhere) and the ensemble ends with its engine step. tests/test_faults.py
            dynamic_batching=False,
            parameters={"tokenizer_dir": "tokenizer", "skip_special_tokens": True},
        ),
    )
    _write_config(
        root,
        configs.python_model(
            c.BLS,
            c.text_inputs(plan.engine.trtllm_version, bls=True),
            c.TEXT_OUTPUTS,
            max_batch_size=limits.max_batch_size,
            decoupled=plan.decoupled,
            parameters={
                **text_params,
                "tensorrt_llm_model_name": c.ENGINE,
                "max_concurrent_requests": limits.max_batch_size,
                "decoupled": plan.decoupled,
                "engine_tensor_names": json.dumps(
                    _bls_passthrough(plan.engine.trtllm_version), sort_keys=True
                ),
                "engine_outputs": ",".join(t.name for t in c.ENGINE_OUTPUTS),
            },
        ),
        lora_type,
    )
    (root / c.ENSEMBLE / "1").mkdir(parents=True)
    _write_config(
        root, configs.ensemble_model(limits.max_batch_size, plan.engine.trtllm_version), lora_type
    )
    progress("engine")
    plan.engine.install(root / c.ENGINE / "1", plan.model.path)
    if plan.adapters:
        progress("LoRA adapters")
        plan.engine.install_adapters(root / c.ENGINE / "1", plan.adapters)
    _write_config(root, plan.engine.config(plan), lora_type)
    progress("manifest")
    hashes = checkpoint_hashes(plan.model.path)
    known = {f"{c.ENGINE}/1/weights/{name}": digest for name, digest in hashes.items()}
    manifest = Manifest(
        format=MANIFEST_FORMAT,
        toolkit_version=__version__,
        sources_digest=sources_digest(),
        build_key=key,
        target=plan.target,
        created=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        model=ModelSection(plan.model.source, plan.model.revision, plan.facts),
        checkpoint_files=hashes,
        files=record_files(root, known),
        limits=limits,
        tokens=tokens,
        engine=plan.engine.section(),
        settings=plan.settings,
        capabilities=plan.capabilities,
        decoupled=plan.decoupled,
        memory_plan=plan.memory_plan,
        versions=_library_versions(),
        adapters=tuple(checked.adapter for checked in plan.adapters),
    )
    write_text_atomic(root / MANIFEST, json.dumps(manifest.to_dict(), indent=2) + "\n")


def _bls_passthrough(trtllm_version: str | None) -> dict[str, str]:
    """Text input -> the engine input it feeds, under the names this engine's release reads."""
    return {
        text: c.engine_name(engine, trtllm_version)
        for text, engine in c.BLS_PASSTHROUGH.items()
        if c.has_input(engine, trtllm_version)  # guided decoding from 0.19 on
    }


def _write_config(root: Path, config, lora_weights_type: str | None = None) -> None:
    """config.pbtxt of one model; `lora_weights_type`: the engine's dtype for the lora_weights input, which
    the ensemble and the BLS pass on to it as they get it."""
    if lora_weights_type is not None:
        configs.set_input_type(config, "lora_weights", lora_weights_type)
    (root / config.name).mkdir(parents=True, exist_ok=True)
    (root / config.name / "config.pbtxt").write_text(configs.to_pbtxt(config))


def _copy_tokenizer(checkpoint: Path, target: Path) -> None:
    target.mkdir(parents=True)
    for name in CHECKPOINT_FILES:
        if (checkpoint / name).is_file():
            copy_file((checkpoint / name).resolve(), target / name)
    if not (target / "tokenizer.json").is_file():
        raise RepositoryError(
            f"{checkpoint} has no tokenizer.json (fast tokenizer)",
            hint="save the tokenizer with transformers' AutoTokenizer(...).save_pretrained() into the checkpoint",
        )


def _swap_into_place(staging: Path, output: Path) -> None:
    """Two renames; the retired repository is removed after (a leftover of a kill is removed by the next build)."""
    if output.exists() and not any(output.iterdir()):
        output.rmdir()
    if not output.exists():
        staging.rename(output)
        return
    retired = output.with_name(f".{output.name}.old-{os.getpid()}")
    output.rename(retired)
    staging.rename(output)
    shutil.rmtree(retired, ignore_errors=True)


def _library_versions() -> dict:
    import platform
    from importlib.metadata import PackageNotFoundError, version

    found: dict[str, str | None] = {"python": platform.python_version()}
    for name in ("torch", "transformers", "tokenizers", "tritonclient", "nvidia-pytriton"):
        try:
            found[name] = version(name)
        except PackageNotFoundError:
            found[name] = None
    return found
