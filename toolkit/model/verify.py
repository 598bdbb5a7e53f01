"""Checking files against the hashes they were written with, without rereading gigabytes each time.

A file's hash is memoised in the toolkit's cache under its identity and change stamps: device,
inode, size, mtime and ctime. Any write (a truncation, an edit that restores the mtime with utime,
a replacement) changes the ctime, which no user call can set back, so a memo never vouches for
changed bytes; renaming the folder around the file keeps it.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from toolkit.fsutil import sha256_file, write_text_atomic
from toolkit.settings import cache_dir


def _memo_file(stat: os.stat_result) -> Path:
    key = f"{stat.st_dev}\0{stat.st_ino}\0{stat.st_size}\0{stat.st_mtime_ns}\0{stat.st_ctime_ns}"
    return cache_dir("hashes") / hashlib.sha256(key.encode()).hexdigest()


def file_sha256(path: Path) -> str:
    """The sha256 of a file, memoised by its identity and change stamps."""
    target = Path(path).resolve()
    memo = _memo_file(target.stat())
    if memo.is_file():
        return memo.read_text().strip()
    value = sha256_file(target)
    write_text_atomic(memo, value)
    return value


def remember_sha256(path: Path, digest: str) -> None:
    """Record the hash of a file we have just written (its bytes are known), so checking it later is free."""
    write_text_atomic(_memo_file(Path(path).resolve().stat()), digest)


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
