"""Model sources: a --model value resolved to a checkpoint folder on local disk (weights included).

The hub is asked only after a quick reachability probe (seconds): without a network the cache is
used on its own instead of huggingface_hub retrying for half a minute.
"""

from __future__ import annotations

import re
import socket
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlparse

from toolkit.errors import ModelSourceError, UnsupportedModelError
from toolkit.model.spec import EMBEDDED_DEFAULT, ModelSpec, parse_model_spec
from toolkit.settings import hub_offline

# What a checkpoint needs to be served: weights as safetensors, configs, tokenizer, chat template.
HUB_ALLOW_PATTERNS = [
    "*.safetensors",
    "*.safetensors.index.json",
    "config.json",
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "tokenizer.model",
    "chat_template.jinja",
    "chat_template.json",
]
PICKLE_PATTERNS = ["*.bin", "*.pt", "*.pth", "*.bin.index.json"]
HUB_PROBE_TIMEOUT_S = 3.0

__all__ = ["EMBEDDED_DEFAULT", "ResolvedModel", "check_weights", "resolve_model", "hub_reachable"]


@dataclass(frozen=True)
class ResolvedModel:
    """A checkpoint on local disk and where it came from."""

    path: Path
    source: str  # normalised: "hf:org/name", "local:/abs/path", "embedded:name"
    revision: str | None  # the hub commit, when known


def resolve_model(
    spec: str | ModelSpec, *, allow_pickle: bool = False, progress: bool = True
) -> ResolvedModel:
    """Turn a --model value into a local checkpoint folder, downloading or converting when needed."""
    parsed = spec if isinstance(spec, ModelSpec) else parse_model_spec(spec)
    if parsed.kind == "embedded":
        from toolkit.model.embedded import materialize_embedded

        return ResolvedModel(
            materialize_embedded(parsed.value, progress=progress), parsed.source, None
        )
    if parsed.kind == "local":
        return _resolve_local(Path(parsed.value), allow_pickle=allow_pickle)
    if parsed.kind == "catalog":
        from toolkit.model.catalog import catalog_entry

        parsed = ModelSpec("hub", catalog_entry(parsed.value).hub_id)
    return _resolve_hub(parsed, allow_pickle=allow_pickle)


def check_weights(path: Path, *, allow_pickle: bool) -> None:
    """Refuse a checkpoint whose weights are only pickles (they can run code when loaded)."""
    if any(path.glob("*.safetensors")):
        return
    pickles = sorted(p.name for pattern in PICKLE_PATTERNS for p in path.glob(pattern))
    if pickles and not allow_pickle:
        raise UnsupportedModelError(
            f"{path} holds only pickle weights ({', '.join(pickles[:3])}); loading a pickle can run arbitrary code",
            hint="convert the checkpoint to safetensors, or pass --allow-pickle if you trust its author",
        )
    if not pickles:
        raise UnsupportedModelError(
            f"no weights (*.safetensors) in {path}",
            hint="point --model at a complete checkpoint folder",
        )


def _resolve_local(path: Path, *, allow_pickle: bool) -> ResolvedModel:
    if not path.is_dir():
        raise ModelSourceError(
            f"--model {path} is a file, not a checkpoint folder",
            hint="pass the folder that holds config.json",
        )
    if not (path / "config.json").is_file():
        raise ModelSourceError(
            f"no config.json in {path}",
            hint="pass the folder that holds config.json and the weights",
        )
    check_weights(path, allow_pickle=allow_pickle)
    check_links(path)
    return ResolvedModel(path, f"local:{path}", None)


def check_links(checkpoint: Path) -> None:
    """Refuse a checkpoint file that links outside the checkpoint (or, for a snapshot of the hub cache,
    outside its repo's folder, where snapshot files link to blobs): the build would copy whatever it
    names, a private file of the user's included, into the repository, readable by all."""
    in_hub_cache = (
        checkpoint.parent.name == "snapshots"
        and checkpoint.parent.parent.name.startswith("models--")
    )
    boundary = (checkpoint.parent.parent if in_hub_cache else checkpoint).resolve()
    for link in sorted(p for p in checkpoint.rglob("*") if p.is_symlink()):
        target = link.resolve()
        if not target.is_relative_to(boundary):
            raise ModelSourceError(
                f"{link} links to {target}, outside the checkpoint {checkpoint}: a build copies what a "
                "checkpoint's files name into the repository",
                hint=f"put the file itself into {checkpoint} (cp --dereference), or build from the folder "
                "that holds it",
                value=str(link),
            )


def _resolve_hub(spec: ModelSpec, *, allow_pickle: bool) -> ResolvedModel:
    patterns = HUB_ALLOW_PATTERNS + (PICKLE_PATTERNS if allow_pickle else [])
    local = download_snapshot(spec.value, spec.revision, patterns)
    check_weights(local, allow_pickle=allow_pickle)
    check_links(local)
    commit = local.name if re.fullmatch(r"[0-9a-f]{40}", local.name) else spec.revision
    return ResolvedModel(local, spec.source, commit)


def hub_reachable() -> str | None:
    """None when the hub answers a TCP connect within seconds, else why not (offline mode, DNS, refused)."""
    from huggingface_hub import constants

    if hub_offline():
        return "HF_HUB_OFFLINE is set"
    url = urlparse(constants.ENDPOINT)
    try:
        with socket.create_connection((url.hostname, url.port or 443), timeout=HUB_PROBE_TIMEOUT_S):
            return None
    except OSError as exc:
        return f"{url.hostname} cannot be reached ({exc.strerror or exc})"


def download_snapshot(repo_id: str, revision: str | None, patterns: list[str]) -> Path:
    """Download (or, offline, find in the cache) the files of a hub repo.

    huggingface_hub reads HF_TOKEN itself, resumes interrupted downloads from its .incomplete
    files, and shows a progress bar per file; the token is never passed through our code.
    """
    from huggingface_hub import snapshot_download

    offline_reason = hub_reachable()
    with _hub_errors(repo_id, revision, offline_reason):
        return Path(
            snapshot_download(
                repo_id,
                revision=revision,
                allow_patterns=patterns,
                local_files_only=offline_reason is not None,
            )
        )


def download_config(repo_id: str, revision: str | None) -> Path:
    """Only config.json (planning needs no weights); its snapshot folder is where the weights will land."""
    from huggingface_hub import hf_hub_download

    offline_reason = hub_reachable()
    with _hub_errors(repo_id, revision, offline_reason):
        return Path(
            hf_hub_download(
                repo_id,
                "config.json",
                revision=revision,
                local_files_only=offline_reason is not None,
            )
        )


class _hub_errors:
    """Map huggingface_hub's errors to ModelSourceError with the id, the revision and the next step."""

    def __init__(self, repo_id: str, revision: str | None, offline_reason: str | None):
        self.repo_id, self.revision, self.offline_reason = repo_id, revision, offline_reason

    def __enter__(self):
        return self

    def __exit__(self, kind, exc, tb):
        from huggingface_hub.errors import (
            GatedRepoError,
            HfHubHTTPError,
            LocalEntryNotFoundError,
            RepositoryNotFoundError,
            RevisionNotFoundError,
        )

        if exc is None:
            return False
        name = f"hf:{self.repo_id}"
        if isinstance(exc, GatedRepoError):
            raise ModelSourceError(
                f"{name} is gated", hint="accept its licence on the hub and set HF_TOKEN"
            ) from exc
        if isinstance(exc, RepositoryNotFoundError):
            raise ModelSourceError(
                f"{name} was not found (or is private)",
                hint="check the id; for a private repo set HF_TOKEN",
            ) from exc
        if isinstance(exc, RevisionNotFoundError):
            raise ModelSourceError(
                f"revision {self.revision!r} of {name} was not found",
                hint="use a branch, tag or commit that exists",
            ) from exc
        if isinstance(exc, LocalEntryNotFoundError):
            why = self.offline_reason or "the download failed"
            raise ModelSourceError(
                f"{name} is not in the local Hugging Face cache, and {why}",
                hint=_offline_hint(self.repo_id),
            ) from exc
        if isinstance(exc, HfHubHTTPError):
            raise ModelSourceError(
                f"cannot fetch {name}: {exc}", hint="check the id; for a gated repo set HF_TOKEN"
            ) from exc
        return False


def _offline_hint(repo_id: str) -> str:
    from toolkit.model.catalog import entry_for_hub_id

    entry = entry_for_hub_id(repo_id)
    planning = f"; to plan without a network use the catalog name: -m {entry.name}" if entry else ""
    return "download it once with network access (or unset HF_HUB_OFFLINE)" + planning
