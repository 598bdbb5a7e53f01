"""The one reader of a built repository: its manifest, limits, tokens, tokenizer, engine and memory plan.

`manifest.json` is parsed here and nowhere else. Serve, the OpenAI API, bench, generate and deploy
open a repository with `open_repository` and read typed values from it.
"""

from __future__ import annotations

import json
import os
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

from toolkit.build_settings import BuildSettings
from toolkit.capabilities import Capabilities
from toolkit.errors import RepositoryError, RepositoryNotFoundError, ToolkitError
from toolkit.fsutil import sha256_file
from toolkit.model.adapters import Adapter
from toolkit.model.facts import ModelFacts
from toolkit.model.tokens import TokenFacts
from toolkit.model.verify import file_sha256, remember_sha256
from toolkit.plan.memory import MemoryPlan
from toolkit.repository import contract as c
from toolkit.repository.engine import EngineSection
from toolkit.repository.limits import RepositoryLimits

MANIFEST = "manifest.json"
MANIFEST_FORMAT = 3
GENERATOR = "toolkit"  # the marker: only a manifest with this generator is a repository the toolkit may replace
_IGNORED_PARTS = ("__pycache__",)  # the Python backend's stub writes bytecode next to model.py


class FileRecord(NamedTuple):
    """One file of the repository as the build wrote it."""

    size: int
    mtime_ns: int
    sha256: str


@dataclass(frozen=True)
class ModelSection:
    source: str  # "hf:org/name" | "local:/path" | "embedded:name"
    revision: str | None
    facts: ModelFacts

    def to_dict(self) -> dict:
        return {"source": self.source, "revision": self.revision, "facts": self.facts.to_dict()}

    @classmethod
    def from_dict(cls, data: dict) -> ModelSection:
        return cls(str(data["source"]), data.get("revision"), ModelFacts.from_dict(data["facts"]))


@dataclass(frozen=True)
class Manifest:
    format: int
    toolkit_version: str
    sources_digest: str
    build_key: str
    target: str
    created: str
    model: ModelSection
    checkpoint_files: dict[str, str]  # checkpoint file name -> sha256
    files: dict[str, FileRecord]  # repository file (relative path) -> as written
    limits: RepositoryLimits
    tokens: TokenFacts
    engine: EngineSection
    settings: BuildSettings  # every build setting as the build resolved it
    capabilities: Capabilities
    decoupled: bool = True
    memory_plan: MemoryPlan | None = None  # GPU targets: the planner's numbers
    versions: dict[str, str | None] = field(default_factory=dict)
    # LoRA adapters served beside the base model, in task id order (1, 2, ...; 0 is the base model).
    adapters: tuple[Adapter, ...] = ()
    generator: str = GENERATOR

    def to_dict(self) -> dict:
        return {
            "format": self.format,
            "toolkit_version": self.toolkit_version,
            "sources_digest": self.sources_digest,
            "build_key": self.build_key,
            "target": self.target,
            "created": self.created,
            "model": self.model.to_dict(),
            "checkpoint_files": dict(self.checkpoint_files),
            "files": {name: list(record) for name, record in self.files.items()},
            "limits": self.limits.to_dict(),
            "tokens": self.tokens.to_dict(),
            "engine": self.engine.to_dict(),
            "settings": self.settings.to_dict(),
            "capabilities": self.capabilities.to_dict(),
            "decoupled": self.decoupled,
            "memory_plan": None if self.memory_plan is None else self.memory_plan.to_dict(),
            "versions": dict(self.versions),
            "adapters": [adapter.to_dict() for adapter in self.adapters],
            "generator": self.generator,
        }

    @classmethod
    def from_dict(cls, data, path: Path) -> Manifest:
        if not isinstance(data, dict) or data.get("generator") != GENERATOR:
            raise RepositoryError(
                f'{path} was not written by this toolkit (no "generator": "{GENERATOR}" in it)',
                hint="this folder is not a toolkit model repository; build one with toolkit build -o NEW_DIR",
            )
        if data.get("format") != MANIFEST_FORMAT:
            raise RepositoryError(
                f"{path} has manifest format {data.get('format')!r}; this toolkit reads format {MANIFEST_FORMAT}",
                hint=f"rebuild it: {rebuild_command(data, path.parent)}",
            )
        try:
            plan = data.get("memory_plan")
            return cls(
                format=data["format"],
                toolkit_version=str(data["toolkit_version"]),
                sources_digest=str(data["sources_digest"]),
                build_key=str(data["build_key"]),
                target=str(data["target"]),
                created=str(data["created"]),
                model=ModelSection.from_dict(data["model"]),
                checkpoint_files=dict(data["checkpoint_files"]),
                files={name: FileRecord(*record) for name, record in data["files"].items()},
                limits=RepositoryLimits.from_dict(data["limits"], str(path)),
                tokens=TokenFacts.from_dict(data["tokens"]),
                engine=EngineSection.from_dict(data["engine"]),
                settings=BuildSettings.from_dict(data["settings"], str(path)),
                capabilities=Capabilities.from_dict(data["capabilities"]),
                decoupled=bool(data.get("decoupled", True)),
                memory_plan=None if plan is None else MemoryPlan(**plan),
                versions=dict(data.get("versions") or {}),
                adapters=tuple(Adapter.from_dict(a) for a in data.get("adapters") or ()),
            )
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            if isinstance(exc, ToolkitError):
                raise
            raise RepositoryError(
                f"{path} is malformed ({type(exc).__name__}: {exc})",
                hint=f"rebuild it: {rebuild_command(data, path.parent)}",
            ) from exc


def read_manifest(repo: Path) -> Manifest:
    """The manifest of `repo`; RepositoryError when it is missing, not JSON, foreign or of another format."""
    path = Path(repo) / MANIFEST
    if not path.is_file():
        raise RepositoryError(
            f"{repo} is not a toolkit model repository (no {MANIFEST})",
            hint="build one with: toolkit build --target cpu --model smollm2-135m-instruct --output DIR",
        )
    from toolkit.jsonfile import read_json

    try:
        data = read_json(path, hint="rebuild the repository with toolkit build")
    except OSError as exc:
        raise RepositoryError(
            f"cannot read {path}: {exc.strerror}", hint="check the folder's permissions"
        ) from exc
    return Manifest.from_dict(data, path)


def is_toolkit_repository(folder: Path) -> bool:
    """Whether `folder` holds a manifest this toolkit wrote (strict: generator marker and a JSON object)."""
    try:
        data = json.loads((Path(folder) / MANIFEST).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    if not isinstance(data, dict) or not isinstance(data.get("build_key"), str):
        return False
    if data.get("generator") == GENERATOR:
        return True
    # Format 1 (toolkit 0.1 before the marker): every one of its own keys, with their types.
    legacy = ("toolkit_version", "sources_digest", "target", "created")
    return (
        data.get("format") == 1
        and all(isinstance(data.get(k), str) for k in legacy)
        and isinstance(data.get("model"), dict)
    )


def rebuild_command(data: dict, repo: Path) -> str:
    """The `toolkit build` command that makes this repository again: its model, target and every build
    setting it recorded (a manifest too damaged to read them gives the model and target only)."""
    model = data.get("model") if isinstance(data, dict) else None
    source = model.get("source", "") if isinstance(model, dict) else ""
    kind, _, value = str(source).partition(":")
    model_arg = {"embedded": value, "hf": f"hf:{value}", "local": value, "catalog": value}.get(
        kind, "MODEL"
    )
    target = data.get("target", "TARGET") if isinstance(data, dict) else "TARGET"
    try:
        settings = BuildSettings.from_dict(data.get("settings") or {}).rebuild_arguments()
    except (ToolkitError, AttributeError, TypeError, ValueError):
        settings = []
    words = ["toolkit", "build", "--target", str(target), "--model", model_arg, *settings]
    return " ".join(shlex.quote(w) for w in [*words, "--output", str(repo)])


@dataclass(frozen=True)
class FileChange:
    path: str
    change: str  # "missing", "modified", "added"


class Repository:
    """A built repository, read through its manifest."""

    def __init__(self, path: Path, manifest: Manifest):
        self.path = Path(path)
        self.manifest = manifest

    @property
    def target(self) -> str:
        return self.manifest.target

    @property
    def limits(self) -> RepositoryLimits:
        return self.manifest.limits

    @property
    def tokens(self) -> TokenFacts:
        return self.manifest.tokens

    @property
    def decoupled(self) -> bool:
        return self.manifest.decoupled

    @property
    def capabilities(self) -> Capabilities:
        return self.manifest.capabilities

    @property
    def trtllm_version(self) -> str | None:
        """The TensorRT-LLM release whose tensor names the engine reads (None: the pinned one)."""
        return self.manifest.engine.trtllm_version

    @property
    def tokenizer_dir(self) -> Path:
        return self.path / c.PREPROCESSING / "1" / "tokenizer"

    @property
    def tokenizer_json(self) -> Path:
        path = self.tokenizer_dir / "tokenizer.json"
        if not path.is_file():
            raise RepositoryError(
                f"{self.path} is missing its tokenizer: {path} does not exist",
                hint=f"rebuild it: {self.rebuild_command}",
            )
        return path

    @property
    def adapters(self) -> tuple[Adapter, ...]:
        """The LoRA adapters it serves (task ids 1, 2, ...), empty when none."""
        return self.manifest.adapters

    @property
    def memory_plan(self) -> MemoryPlan | None:
        """The planner's numbers of a GPU repository; None for the Python engines."""
        return self.manifest.memory_plan

    @property
    def model_source(self) -> str:
        return self.manifest.model.source

    @property
    def served_model_name(self) -> str:
        """The model id clients see: the last part of the model source
        (SmolLM2-135M-Instruct, Llama-3.1-8B-Instruct)."""
        name = self.model_source.split(":", 1)[-1].rstrip("/").rsplit("/", 1)[-1]
        return name or self.path.resolve().name

    @property
    def rebuild_command(self) -> str:
        return rebuild_command(self.manifest.to_dict(), self.path)

    def file_changes(self) -> list[FileChange]:
        """Files that differ from what the build wrote: by size, else by sha256. Hashes are memoised by
        inode and change stamps (toolkit.model.verify), so an unchanged repository costs a stat per
        file; a copied or touched one is hashed once."""
        recorded = self.manifest.files
        changes = []
        for relative, (size, _mtime_ns, digest) in sorted(recorded.items()):
            path = self.path / relative
            try:
                stat = path.stat()
            except OSError:
                changes.append(FileChange(relative, "missing"))
                continue
            if stat.st_size != size or file_sha256(path) != digest:
                changes.append(FileChange(relative, "modified"))
        changes += [
            FileChange(p, "added")
            for p in sorted(set(repository_file_names(self.path)) - set(recorded) - {MANIFEST})
        ]
        return changes


def repository_file_names(root: Path) -> list[str]:
    """Every file of a repository, relative, without the bytecode the Python backend writes."""
    names = []
    for folder, dirs, files in os.walk(root):
        dirs[:] = [d for d in dirs if d not in _IGNORED_PARTS]
        for name in files:
            if not name.endswith(".pyc"):
                names.append(str((Path(folder) / name).relative_to(root)))
    return names


def record_files(root: Path, known: dict[str, str] | None = None) -> dict[str, FileRecord]:
    """The `files` table of a manifest: relative path -> (size, mtime_ns, sha256).

    `known` gives digests already computed (a weights file copied from a hashed checkpoint file).
    """
    known = known or {}
    table = {}
    for relative in sorted(repository_file_names(root)):
        if relative == MANIFEST:
            continue
        path = root / relative
        digest = known.get(relative) or sha256_file(path)
        remember_sha256(path, digest)
        stat = path.stat()
        table[relative] = FileRecord(stat.st_size, stat.st_mtime_ns, digest)
    return table


def open_repository(path: Path) -> Repository:
    """Open a built repository: RepositoryError for a missing, foreign, half-made or other-format one."""
    path = Path(path)
    if not path.is_dir():
        raise RepositoryNotFoundError(
            f"model repository {path} does not exist",
            hint=f"build it with: toolkit build --target cpu --output {path}",
        )
    repo = Repository(path, read_manifest(path))
    missing = [name for name in c.MODEL_NAMES if not (path / name / "config.pbtxt").is_file()]
    if missing:
        raise RepositoryError(
            f"{path} is incomplete: no config.pbtxt for {', '.join(missing)}",
            hint=f"rebuild: {repo.rebuild_command}",
        )
    return repo
