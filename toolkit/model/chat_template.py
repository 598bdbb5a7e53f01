"""A checkpoint's chat template: chat_template.jinja, or the `chat_template` key of tokenizer_config.json."""

from __future__ import annotations

import json
from pathlib import Path


def template_from_tokenizer_dir(tokenizer_dir: Path) -> str | None:
    jinja = tokenizer_dir / "chat_template.jinja"
    if jinja.is_file():
        return jinja.read_text(encoding="utf-8")
    config = tokenizer_dir / "tokenizer_config.json"
    if config.is_file():
        template = json.loads(config.read_text(encoding="utf-8")).get("chat_template")
        return template if isinstance(template, str) else None
    return None
