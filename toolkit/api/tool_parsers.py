"""Tool calls in generated tokens, per model family, as the families' chat templates ask models to write them.

- `hermes` (Qwen2.5, Hermes): `<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`, one block per call.
- `mistral`: `[TOOL_CALLS]` then a JSON list of `{"name": ..., "arguments": {...}}`.
- `llama3_json` (Llama 3.1-3.3): a JSON object `{"name": ..., "parameters": {...}}` as the whole answer
  (several separated by `;`), optionally after `<|python_tag|>`.

They read token ids, not the text clients get: a family's markers are special tokens, which the text
leaves out. Text before a marker streams as content; from the marker on the output is held back, never
sent as a partial marker, and parsed when the output ends. Output that does not parse as calls of the
request's tools comes back as content, as it was written (markers included), not as an error.
The parser is chosen from the model (the markers its tokenizer has) and can be overridden
(`toolkit api --tool-parser`).
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass

PARSERS = ("hermes", "mistral", "llama3_json")
AUTO, NONE = "auto", "none"
CHOICES = (AUTO, NONE, *PARSERS)  # what --tool-parser takes
# The family's start marker, as the token's text in the vocabulary.
MARKERS = {"hermes": "<tool_call>", "mistral": "[TOOL_CALLS]", "llama3_json": "<|python_tag|>"}
HERMES_CALL = re.compile(r"<tool_call>\s*(.*?)\s*(?:</tool_call>|$)", re.S)


@dataclass(frozen=True)
class ParsedCall:
    name: str
    arguments: str  # JSON text
    id: str

    def to_dict(self) -> dict:
        return {
            "id": self.id,
            "type": "function",
            "function": {"name": self.name, "arguments": self.arguments},
        }


def new_call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


def detect_parser(vocab: dict[str, int], template: str | None) -> str:
    """The family parser for a tokenizer: the first whose marker is one of its tokens; `none` if none is."""
    for name in PARSERS:
        if MARKERS[name] in vocab:
            return name
    return NONE


class ToolCallParser:
    """One choice's output, fed token by token; `content` to send now, `finish` for the calls at the end."""

    def __init__(
        self,
        family: str,
        marker_id: int | None,
        token_text,
        tool_names: set[str],
        parallel: bool = True,
    ):
        self.family = family
        self.marker_id = marker_id
        self.token_text = token_text  # id -> its text, special tokens included
        self.tool_names = tool_names
        self.parallel = parallel  # parallel_tool_calls false: the first call only
        self.held: list[int] = []  # the ids from the marker (or a leading "{") on
        self.held_text: list[str] = []  # what the client would have got for them
        self.raw: list[
            str
        ] = []  # the held output as text, when the marker is no token of the vocabulary
        self.pending = ""  # text that may be the start of a marker written in several tokens
        self.sent_any = False

    @property
    def holding(self) -> bool:
        return bool(self.held or self.raw)

    def feed(self, ids, text: str) -> str:
        """The content to send for these new tokens (their text as the client gets it: `text`)."""
        if self.holding:
            self.held.extend(ids)
            self.held_text.append(text)
            if self.raw:
                self.raw.append(text)
            return ""
        if self.marker_id is None and self.family != "llama3_json":
            return self._feed_text(text)
        for offset, token in enumerate(ids):
            if token == self.marker_id or self._json_start(text):
                self.held.extend(ids[offset:] if token == self.marker_id else ids)
                self.held_text.append(text)
                return ""
        if text.strip():
            self.sent_any = True
        return text

    def _feed_text(self, text: str) -> str:
        """A marker that the tokenizer splits into several tokens (a parser chosen for a model whose
        vocabulary lacks it): found in the text, any start of it held back until it is clear."""
        marker = MARKERS[self.family]
        combined = self.pending + text
        found = combined.find(marker)
        if found >= 0:
            self.pending = ""
            self.raw.append(combined[found:])
            self.held_text.append(combined[found:])
            return combined[:found]
        keep = next(
            (
                n
                for n in range(min(len(marker) - 1, len(combined)), 0, -1)
                if marker.startswith(combined[-n:])
            ),
            0,
        )
        self.pending = combined[len(combined) - keep :]
        return combined[: len(combined) - keep]

    def _json_start(self, text: str) -> bool:
        """Llama 3's calls come without a marker: an answer that starts as a JSON object may be one."""
        return self.family == "llama3_json" and not self.sent_any and text.lstrip().startswith("{")

    def finish(self) -> tuple[str, list[ParsedCall]]:
        """(content still held back, the calls) when the output ends; no calls: it is content."""
        if not self.holding:
            held, self.pending = self.pending, ""
            return held, []
        raw = "".join(self.raw) if self.raw else "".join(self.token_text(i) for i in self.held)
        calls = self._parse(raw)
        if calls and all(call.name in self.tool_names for call in calls):
            return "", calls if self.parallel else calls[:1]
        return "".join(self.held_text), []

    def _parse(self, raw: str) -> list[ParsedCall]:
        if self.family == "hermes":
            return _calls([_json(block) for block in HERMES_CALL.findall(raw)], "arguments")
        if self.family == "mistral":
            body = _json(raw.split(MARKERS["mistral"], 1)[-1].strip())
            return _calls(body if isinstance(body, list) else [body], "arguments")
        body = raw.split(MARKERS["llama3_json"], 1)[-1].strip()
        return _calls([_json(part) for part in body.split(";") if part.strip()], "parameters")


def _json(text: str):
    try:
        return json.loads(text)
    except ValueError:
        return None


def _calls(objects: list, arguments_key: str) -> list[ParsedCall]:
    """Calls from parsed objects; [] when any is not a call ({"name": str, <arguments>: object})."""
    calls = []
    for item in objects:
        if not isinstance(item, dict) or not isinstance(item.get("name"), str):
            return []
        arguments = item.get(arguments_key, item.get("arguments", {}))
        if isinstance(arguments, str):
            arguments = _json(arguments)
        if not isinstance(arguments, dict):
            return []
        calls.append(
            ParsedCall(item["name"], json.dumps(arguments, ensure_ascii=False), new_call_id())
        )
    return calls
