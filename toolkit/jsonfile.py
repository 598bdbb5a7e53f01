"""Reading a JSON file the toolkit depends on: text that is not JSON is the toolkit's error, naming the
file and what to do, not a traceback."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from toolkit.errors import RepositoryError, ToolkitError


def read_json(path: Path, *, hint: str, error: type[ToolkitError] = RepositoryError) -> Any:
    """The parsed contents of `path` (UTF-8); `error` with `hint` when they are not JSON. OSError
    (a missing or unreadable file) is the caller's to handle."""
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise error(f"{path} is not valid JSON: {exc}", hint=hint) from exc
