"""Environment variables with the TOOLKIT_ prefix, parsed in one place."""

from __future__ import annotations

import os
from pathlib import Path


def toolkit_home() -> Path:
    """Where the toolkit keeps caches (converted checkpoints, build cache); TOOLKIT_HOME overrides."""
    env = os.environ.get("TOOLKIT_HOME")
    if env:
        return Path(env).expanduser()
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "toolkit"


def cache_dir(*parts: str) -> Path:
    path = toolkit_home().joinpath(*parts)
    path.mkdir(parents=True, exist_ok=True)
    return path
