"""Build cache: an engine is reused when checkpoint, recipe, TensorRT-LLM version and GPU SM are unchanged."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from toolkit.fsutil import sha256_file, write_text_atomic
from toolkit.settings import cache_dir

# Files whose bytes decide the engine; tokenizer files do not.
CHECKPOINT_PATTERNS = ("config.json", "*.safetensors", "*.safetensors.index.json")
RECORD = "toolkit_build.json"  # written into each engine folder


def checkpoint_hash(checkpoint: Path) -> str:
    """One digest over the checkpoint's config and weights."""
    digest = hashlib.sha256()
    files = sorted({p for pattern in CHECKPOINT_PATTERNS for p in checkpoint.glob(pattern)})
    for path in files:
        digest.update(f"{path.name}\0{_file_digest(path)}\n".encode())
    return digest.hexdigest()


def _file_digest(path: Path) -> str:
    """A file's sha256; a Hugging Face cache symlink already names it (blobs/<sha256>)."""
    target = path.resolve()
    if path.is_symlink() and target.parent.name == "blobs" and len(target.name) == 64:
        return target.name
    stat = target.stat()
    memo = cache_dir("hashes") / hashlib.sha256(f"{target}\0{stat.st_size}\0{stat.st_mtime_ns}".encode()).hexdigest()
    if memo.is_file():
        return memo.read_text().strip()
    value = sha256_file(target)  # weights are read once; the memo keys on path, size and mtime
    write_text_atomic(memo, value)
    return value


def cache_key(checkpoint_digest: str, build_inputs: dict, trtllm_version: str, gpu_sm: str) -> str:
    canonical = json.dumps(
        {"checkpoint": checkpoint_digest, "build": build_inputs, "trtllm": trtllm_version, "sm": gpu_sm},
        sort_keys=True,
    )
    return hashlib.sha256(canonical.encode()).hexdigest()


def read_record(engine_dir: Path) -> dict | None:
    path = engine_dir / RECORD
    try:
        return json.loads(path.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None


def is_cached(engine_dir: Path, key: str, world_size: int) -> bool:
    record = read_record(engine_dir)
    ranks_present = all((engine_dir / f"rank{r}.engine").is_file() for r in range(world_size))
    return bool(record) and record.get("cache_key") == key and (engine_dir / "config.json").is_file() and ranks_present
