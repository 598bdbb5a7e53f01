"""A checkpoint's chat template: found in its tokenizer files, compiled in a sandbox, rendered like transformers does.

transformers 4.43+ saves the template as chat_template.jinja; older versions inline it in
tokenizer_config.json, as a string or as a list of named templates.
"""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path


def template_from_tokenizer_dir(tokenizer_dir: Path, name: str = "default") -> str | None:
    """The chat template's source (or, `name`, one of a checkpoint's named templates: "tool_use"), or None
    when the checkpoint has none."""
    jinja = Path(tokenizer_dir) / "chat_template.jinja"
    if jinja.is_file():
        return jinja.read_text(encoding="utf-8") if name == "default" else None
    template = _tokenizer_config(tokenizer_dir).get("chat_template")
    if isinstance(template, list):  # named templates: [{"name": "default", "template": ...}, ...]
        template = {
            item.get("name"): item.get("template") for item in template if isinstance(item, dict)
        }.get(name)
    elif name != "default":
        return None
    return template if isinstance(template, str) else None


class ChatTemplate:
    """A compiled chat template and the special tokens templates refer to (bos_token, eos_token, ...)."""

    def __init__(
        self, source: str, special_tokens: dict | None = None, tool_source: str | None = None
    ):
        self.source = source
        self.special_tokens = special_tokens or {}
        self._template = _compile(source)
        # A checkpoint's "tool_use" template (Hermes, Mistral, Cohere name one), used when tools are given.
        self._tool_template = _compile(tool_source) if tool_source else None

    @classmethod
    def from_tokenizer_dir(cls, tokenizer_dir: Path) -> ChatTemplate | None:
        source = template_from_tokenizer_dir(tokenizer_dir)
        if source is None:
            return None
        config = _tokenizer_config(tokenizer_dir)
        special = {
            key: _token_text(config.get(key))
            for key in ("bos_token", "eos_token", "unk_token", "pad_token")
        }
        return cls(source, special, template_from_tokenizer_dir(tokenizer_dir, "tool_use"))

    def render(
        self,
        messages: list[dict],
        *,
        add_generation_prompt: bool = True,
        tools: list[dict] | None = None,
    ) -> str:
        """The prompt text for `messages` (and the `tools` the model may call, as transformers passes them),
        ending with the assistant's generation prompt.

        A template's own refusal (raise_exception, a jinja error) propagates: it is the caller's bad input.
        """
        template = self._tool_template if tools and self._tool_template else self._template
        extra = {"tools": tools} if tools else {}
        return template.render(
            messages=messages,
            add_generation_prompt=add_generation_prompt,
            **extra,
            **self.special_tokens,
        )


def _compile(source: str):
    """Compile in a sandbox, with the whitespace settings and helpers chat templates are written for."""
    from jinja2.ext import loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message: str):
        raise ValueError(f"chat template: {message}")

    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols]
    )
    env.filters["tojson"] = lambda value, indent=None: json.dumps(
        value, ensure_ascii=False, indent=indent
    )
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    return env.from_string(source)


def _tokenizer_config(tokenizer_dir: Path) -> dict:
    path = Path(tokenizer_dir) / "tokenizer_config.json"
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _token_text(value) -> str | None:
    if isinstance(value, dict):  # older tokenizer_config.json: {"content": "<s>", ...}
        return value.get("content")
    return value
