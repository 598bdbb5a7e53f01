"""Well-known checkpoints whose config the toolkit carries, so planning works offline.

Each entry (`catalog/<name>.json`) holds the hub id it came from, the revision and source we read,
the config.json and generation_config.json values that planning and packaging need, and the
tokenizer facts that decide the end of an assistant turn. Building still downloads the weights
(and tokenizer) from the hub; only planning and dry runs are served from here.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from pathlib import Path

CATALOG_DIR = Path(__file__).resolve().parent / "catalog"


@dataclass(frozen=True)
class CatalogEntry:
    name: str
    hub_id: str
    config: dict  # config.json, as published
    generation_config: dict
    tokenizer: dict  # eos_token, eos_token_id, bos_token, bos_token_id, adds_bos, turn_end_token, turn_end_id
    sources: tuple[str, ...]

    @property
    def reasoning_parser(self) -> str | None:
        """How its answers carry their reasoning (toolkit.model.facts.detect_reasoning_parser reads the same
        from a downloaded tokenizer)."""
        return self.tokenizer.get("reasoning_parser")


@functools.lru_cache(maxsize=1)
def _entries() -> dict[str, CatalogEntry]:
    entries = {}
    for path in sorted(CATALOG_DIR.glob("*.json")):
        data = json.loads(path.read_text())
        entries[path.stem] = CatalogEntry(
            name=path.stem,
            hub_id=data["hub_id"],
            config=data["config"],
            generation_config=data.get("generation_config", {}),
            tokenizer=data.get("tokenizer", {}),
            sources=tuple(data.get("sources", ())),
        )
    return entries


def catalog_names() -> list[str]:
    return list(_entries())


def catalog_entry(name: str) -> CatalogEntry:
    return _entries()[name.lower()]


def entry_for_hub_id(repo_id: str) -> CatalogEntry | None:
    return next((e for e in _entries().values() if e.hub_id.lower() == repo_id.lower()), None)
