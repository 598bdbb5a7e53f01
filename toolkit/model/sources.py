"""Model sources: a Hugging Face repo, a local folder, or the embedded default, resolved to a local checkpoint."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from toolkit.errors import ModelSourceError, UnsupportedModelError

EMBEDDED_DEFAULT = "smollm2-135m-instruct"

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
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


@dataclass(frozen=True)
class ResolvedModel:
    """A checkpoint on local disk and where it came from."""

    path: Path
    source: str  # what the user asked for, normalised: "hf:org/name", "local:/abs/path", "embedded:name"
    revision: str | None  # the hub commit, when known


def resolve_model(spec: str, *, allow_pickle: bool = False, progress: bool = True) -> ResolvedModel:
    """Turn a --model value into a local checkpoint folder, downloading or converting when needed."""
    spec = spec.strip()
    if spec == EMBEDDED_DEFAULT or spec == f"embedded:{EMBEDDED_DEFAULT}":
        from toolkit.model.embedded import materialize_embedded

        return ResolvedModel(materialize_embedded(progress=progress), f"embedded:{EMBEDDED_DEFAULT}", None)
    if spec.startswith("hf:"):
        return _resolve_hub(spec[3:], allow_pickle=allow_pickle)
    path = Path(spec).expanduser()
    if path.exists():
        return _resolve_local(path, allow_pickle=allow_pickle)
    if _HUB_ID.match(spec.split("@", 1)[0]):
        return _resolve_hub(spec, allow_pickle=allow_pickle)
    raise ModelSourceError(
        f"unknown model source {spec!r}: not a folder, not a Hugging Face id, not the embedded default",
        hint=f"use --model {EMBEDDED_DEFAULT}, --model hf:ORG/NAME[@REVISION], or --model /path/to/checkpoint",
    )


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
    path = path.resolve()
    if not path.is_dir():
        raise ModelSourceError(f"--model {path} is a file, not a checkpoint folder", hint="pass the folder that holds config.json")
    if not (path / "config.json").is_file():
        raise ModelSourceError(f"no config.json in {path}", hint="pass the folder that holds config.json and the weights")
    check_weights(path, allow_pickle=allow_pickle)
    return ResolvedModel(path, f"local:{path}", None)


def _resolve_hub(spec: str, *, allow_pickle: bool) -> ResolvedModel:
    repo_id, _, revision = spec.partition("@")
    if not _HUB_ID.match(repo_id):
        raise ModelSourceError(f"{repo_id!r} is not a Hugging Face model id", hint="write it as ORG/NAME, e.g. hf:HuggingFaceTB/SmolLM2-135M-Instruct")
    patterns = HUB_ALLOW_PATTERNS + (PICKLE_PATTERNS if allow_pickle else [])
    local = download_snapshot(repo_id, revision or None, patterns)
    check_weights(local, allow_pickle=allow_pickle)
    commit = local.name if re.fullmatch(r"[0-9a-f]{40}", local.name) else (revision or None)
    return ResolvedModel(local, f"hf:{repo_id}", commit)


def download_snapshot(repo_id: str, revision: str | None, patterns: list[str]) -> Path:
    """Download (or, with HF_HUB_OFFLINE=1, find in the cache) the files of a hub repo.

    huggingface_hub reads HF_TOKEN itself, resumes interrupted downloads from its .incomplete
    files, and shows a progress bar per file; the token is never passed through our code.
    """
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import (
        GatedRepoError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    try:
        return Path(snapshot_download(repo_id, revision=revision, allow_patterns=patterns))
    except GatedRepoError as exc:
        raise ModelSourceError(f"hf:{repo_id} is gated", hint="accept its licence on the hub and set HF_TOKEN") from exc
    except RepositoryNotFoundError as exc:
        raise ModelSourceError(f"hf:{repo_id} was not found (or is private)", hint="check the id; for a private repo set HF_TOKEN") from exc
    except RevisionNotFoundError as exc:
        raise ModelSourceError(f"revision {revision!r} of hf:{repo_id} was not found", hint="use a branch, tag or commit that exists") from exc
    except LocalEntryNotFoundError as exc:
        offline = os.environ.get("HF_HUB_OFFLINE", "") not in ("", "0")
        hint = "download it once with network access, or unset HF_HUB_OFFLINE" if offline else "check the network and the id"
        raise ModelSourceError(f"hf:{repo_id} is not in the local cache and cannot be downloaded", hint=hint) from exc
