"""Where the Python sources of the repository's models live (model_repo/ in a checkout, or in the wheel).

`model_repo/common/` holds what several models share (the text codec, parameter and tensor helpers);
the writer copies those modules into each Python model's version folder, so a repository is
self-contained, and the toolkit imports the same files through `common_module`.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import sys
from pathlib import Path
from types import ModuleType

from toolkit.errors import RepositoryError

COMMON_MODULES = (
    "textcodec",
    "params",
    "engine_metrics",
    "engine_requests",
    "guides",
    "lifetime",
    "tracing",
    "lora_tasks",
)


def model_repo_sources() -> Path:
    package = Path(__file__).resolve().parent.parent
    for candidate in (package / "_model_repo", package.parent / "model_repo"):
        if (candidate / "common" / "textcodec.py").is_file():
            return candidate
    raise RepositoryError(
        "the model sources (model_repo/) are missing from this toolkit install",
        hint="reinstall the toolkit: pip install -e '.[cpu]' from a checkout",
    )


@functools.cache
def common_module(name: str) -> ModuleType:
    """A module of model_repo/common/ (e.g. textcodec), imported once from the toolkit's own sources."""
    if name not in COMMON_MODULES:
        raise ValueError(f"{name!r} is not one of the shared model modules {COMMON_MODULES}")
    path = model_repo_sources() / "common" / f"{name}.py"
    qualified = f"toolkit._model_common.{name}"
    spec = importlib.util.spec_from_file_location(qualified, path)
    if spec is None or spec.loader is None:
        raise RepositoryError(f"cannot load the model source {path}", hint="reinstall the toolkit")
    module = importlib.util.module_from_spec(spec)
    sys.modules[qualified] = module
    spec.loader.exec_module(module)
    return module


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
