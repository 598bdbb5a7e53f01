"""File helpers: one lock per artifact, atomic writes, owned copies, content hashes."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

from toolkit.errors import ToolkitError

FICLONE = (
    0x40049409  # linux/fs.h: _IOW(0x94, 9, int), clone a whole file (reflink) on btrfs, XFS, ...
)


@contextlib.contextmanager
def file_lock(path: Path) -> Iterator[None]:
    """An exclusive advisory lock held while the block runs (other processes wait).

    The lock file is removed on release, so nothing is left beside the artifact. A waiter may then
    hold a lock on the removed file's inode: after locking, it checks that the path still names the
    inode it locked, and otherwise tries again on the new file.
    """
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as exc:
        raise ToolkitError(
            f"cannot write in {path.parent}: {exc.strerror}",
            hint="choose a folder you can write to, or fix its permissions",
        ) from exc
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            locked = os.fstat(fd)
            with contextlib.suppress(FileNotFoundError):
                current = os.stat(path)
                if (current.st_dev, current.st_ino) == (locked.st_dev, locked.st_ino):
                    break
        except BaseException:
            os.close(fd)
            raise
        os.close(fd)  # the file was removed (and maybe recreated) while we waited: lock anew
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        yield
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)  # still holding the lock: no one can be inside the block on this path
        os.close(fd)  # releases the lock


@contextlib.contextmanager
def shared_folder_lock(path: Path) -> Iterator[int]:
    """A shared advisory lock on the folder `path` while the block runs; yields its descriptor, which a
    child given it (subprocess's pass_fds) keeps holding for as long as the child lives."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_SH)
        yield fd
    finally:
        os.close(fd)


def folder_in_use(path: Path) -> bool:
    """Whether some process holds a lock on the folder `path` (shared_folder_lock)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)  # and with it the lock, when it was taken
    return False


def write_text_atomic(path: Path, text: str) -> None:
    """Write to a temporary sibling, then os.replace: readers see the old or the new file, never half."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as handle:
            handle.write(text)
        os.chmod(tmp, 0o644 & ~_umask())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def copy_file(source: Path, target: Path) -> None:
    """A copy the target owns: a reflink where the filesystem clones files, else a byte copy.

    Never a hard link: a repository that shares an inode with a cache or a user's checkpoint is
    damaged by anything that damages the other (truncating one truncates both).
    """
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(source, "rb") as src, open(target, "wb") as dst:
        try:
            fcntl.ioctl(dst.fileno(), FICLONE, src.fileno())
        except OSError:
            shutil.copyfileobj(src, dst, 1 << 20)
    os.chmod(target, 0o644 & ~_umask())


def sha256_file(path: Path, chunk: int = 1 << 20) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while block := handle.read(chunk):
            digest.update(block)
    return digest.hexdigest()


def make_world_readable(folder: Path) -> None:
    """mkdtemp makes 0700 folders; a repository is read by servers running as other users (umask applies)."""
    os.chmod(folder, 0o755 & ~_umask())


def check_free_space(
    folder: Path,
    needed_bytes: int,
    what: str,
    hint: str = "free some space there, or write somewhere else",
) -> None:
    """Refuse before writing when the filesystem cannot hold `needed_bytes`, naming both numbers."""
    free = shutil.disk_usage(folder).free
    if free < needed_bytes:
        raise ToolkitError(
            f"{what} needs {needed_bytes / 1e6:,.1f} MB in {folder}, but only {free / 1e6:,.1f} MB are free",
            hint=hint,
        )


def disk_full_error(
    exc: Exception,
    where: Path,
    what: str,
    hint: str = "free some space there, or write somewhere else; nothing was changed",
) -> ToolkitError:
    """A readable error for ENOSPC/EDQUOT while writing `what` under `where`."""
    reason = getattr(exc, "strerror", None) or "no space left on device"
    return ToolkitError(f"{what} failed: the filesystem of {where} is full ({reason})", hint=hint)


def is_disk_full(exc: BaseException) -> bool:
    """ENOSPC/EDQUOT, also when a library wrapped it in an error of its own (safetensors' writer says
    "No space left on device (os error 28)" in a SafetensorError)."""
    if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return True
    text = str(exc)
    return "No space left on device" in text or "Disk quota exceeded" in text


def copy_tree(source: Path, target: Path, skip: tuple[str, ...] = ("__pycache__",)) -> None:
    """Copy a folder of files with copy_file (no hard links); an OSError (a full disk) is raised as
    itself, not gathered into shutil.Error as copytree does, so its errno tells what happened."""
    for folder, dirs, files in os.walk(source):
        dirs[:] = [d for d in dirs if d not in skip]
        relative = Path(folder).relative_to(source)
        (target / relative).mkdir(parents=True, exist_ok=True)
        for name in files:
            copy_file(Path(folder) / name, target / relative / name)


def _umask() -> int:
    current = os.umask(0)
    os.umask(current)
    return current
