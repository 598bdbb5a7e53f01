"""Build cache: an engine is reused when checkpoint, recipe, TensorRT-LLM version and GPU SM are unchanged."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from toolkit.engine.layout import rank_engine_files
from toolkit.model.verify import checked_sha256

# Files whose bytes decide the engine; tokenizer files do not.
CHECKPOINT_PATTERNS = ("config.json", "*.safetensors", "*.safetensors.index.json")
RECORD = "toolkit_build.json"  # written into each engine folder


def checkpoint_hash(checkpoint: Path) -> str:
    """One digest over the checkpoint's config and weights."""
    digest = hashlib.sha256()
    files = sorted({p for pattern in CHECKPOINT_PATTERNS for p in checkpoint.glob(pattern)})
    for path in files:
        digest.update(f"{path.name}\0{checked_sha256(path)}\n".encode())
    return digest.hexdigest()


def cache_key(checkpoint_digest: str, build_inputs: dict, trtllm_version: str, gpu_sm: str) -> str:
    canonical = json.dumps(
        {
            "checkpoint": checkpoint_digest,
            "build": build_inputs,
            "trtllm": trtllm_version,
            "sm": gpu_sm,
        },
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
    ranks_present = all(path.is_file() for path in rank_engine_files(engine_dir, world_size))
    return (
        record is not None
        and record.get("cache_key") == key
        and (engine_dir / "config.json").is_file()
        and ranks_present
    )
