"""Checking cached files against the hashes they were written with, without rereading gigabytes each time.

A file's verified hash is memoised under its path, size and mtime in the toolkit's cache: a file
that changes (truncated, rewritten) changes its size or mtime and is hashed again.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from toolkit.fsutil import sha256_file, write_text_atomic
from toolkit.settings import cache_dir


def file_sha256(path: Path) -> str:
    """The sha256 of a file, memoised by (resolved path, size, mtime)."""
    target = Path(path).resolve()
    stat = target.stat()
    memo = (
        cache_dir("hashes")
        / hashlib.sha256(f"{target}\0{stat.st_size}\0{stat.st_mtime_ns}".encode()).hexdigest()
    )
    if memo.is_file():
        return memo.read_text().strip()
    value = sha256_file(target)
    write_text_atomic(memo, value)
    return value


def matches_recorded_hash(path: Path, digest: str) -> bool:
    try:
        return file_sha256(path) == digest
    except OSError:
        return False


def checked_sha256(path: Path) -> str:
    """A checkpoint file's sha256; a Hugging Face cache blob must hash to its own name (LFS blobs are named by
    their sha256), or the cache is damaged and nothing is built from it."""
    from toolkit.errors import ModelSourceError

    target = Path(path).resolve()
    digest = file_sha256(target)
    named = (
        target.name
        if Path(path).is_symlink() and target.parent.name == "blobs" and len(target.name) == 64
        else None
    )
    if named is not None and named != digest:
        raise ModelSourceError(
            f"{path} is damaged in the Hugging Face cache: its content hashes to {digest[:12]}..., not {named[:12]}...",
            hint=f"delete {target} and {path}, then build again (the file is downloaded anew)",
        )
    return digest
