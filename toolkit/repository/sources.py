"""Where the Python sources of the repository's models live (model_repo/ in a checkout, or in the wheel)."""

from __future__ import annotations

import hashlib
from pathlib import Path

from toolkit.errors import RepositoryError


def model_repo_sources() -> Path:
    package = Path(__file__).resolve().parent.parent
    for candidate in (package / "_model_repo", package.parent / "model_repo"):
        if (candidate / "common" / "textcodec.py").is_file():
            return candidate
    raise RepositoryError(
        "the model sources (model_repo/) are missing from this toolkit install",
        hint="reinstall the toolkit: pip install -e '.[cpu]' from a checkout",
    )


def sources_digest(root: Path | None = None) -> str:
    """One hash over every model source file: a repository built from other sources must be rebuilt."""
    root = root or model_repo_sources()
    digest = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        if "__pycache__" in path.parts:
            continue
        digest.update(str(path.relative_to(root)).encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()[:16]
