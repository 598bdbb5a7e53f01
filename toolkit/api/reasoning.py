"""Reasoning models' answers: the <think> part as `reasoning_content`, the rest as `content`.

As vLLM's `deepseek_r1` reasoning parser reads DeepSeek-R1 and its distills: the answer opens inside the
reasoning (their chat template ends the prompt with `<think>`, so the model may or may not repeat it), a
leading `<think>` is dropped, everything up to the first `</think>` is reasoning and what follows is content;
without a `</think>` the whole answer is reasoning (it was cut before the model finished thinking).

Which parser a repository gets: its model's (the manifest's model facts, detected from the tokenizer's
<think>/</think> tokens or the catalog), unless `toolkit api --reasoning-parser` says otherwise (`none`
turns it off). Chat completions only, as vLLM does.
"""

from __future__ import annotations

from dataclasses import dataclass

from toolkit.errors import ToolkitError

AUTO, NONE = "auto", "none"


@dataclass(frozen=True)
class ReasoningParser:
    name: str
    start: str
    end: str

    def split(self, text: str) -> tuple[str | None, str | None]:
        """(reasoning_content, content) of a whole answer."""
        reasoning, found, content = text.removeprefix(self.start).partition(self.end)
        if not found:
            return reasoning, None
        return reasoning, content or None

    def stream(self) -> ReasoningStream:
        return ReasoningStream(self)


PARSERS = {p.name: p for p in (ReasoningParser("deepseek_r1", "<think>", "</think>"),)}
CHOICES = (AUTO, NONE, *PARSERS)


def reasoning_parser(choice: str | None, model_default: str | None) -> ReasoningParser | None:
    """The parser for `--reasoning-parser` (auto: the model's own, if any)."""
    name = model_default if choice in (None, AUTO) else choice
    if name in (None, NONE):
        return None
    if name not in PARSERS:
        raise ToolkitError(
            f"unknown reasoning parser {name!r}",
            hint=f"use one of: {', '.join(CHOICES)}",
            value=name,
        )
    return PARSERS[name]


class ReasoningStream:
    """Splits streamed pieces as `split` splits the whole: a tag cut across pieces is held back until the
    next piece shows whether it is one."""

    def __init__(self, parser: ReasoningParser):
        self.parser = parser
        self.pending = ""
        self.opened = False  # past any leading <think>
        self.thinking = True

    def feed(self, text: str) -> list[tuple[str, str]]:
        """[(field, text)] to send for this piece: field is "reasoning_content" or "content"."""
        self.pending += text
        out: list[tuple[str, str]] = []
        if not self.opened:
            if len(self.pending) < len(self.parser.start) and self.parser.start.startswith(
                self.pending
            ):
                return out  # could still become the opening tag
            self.pending = self.pending.removeprefix(self.parser.start)
            self.opened = True
        if self.thinking:
            reasoning, found, rest = self.pending.partition(self.parser.end)
            if found:
                self.thinking, self.pending = False, rest
                out.append(("reasoning_content", reasoning))
            else:
                keep = _tag_prefix_at_end(self.pending, self.parser.end)
                out.append(("reasoning_content", self.pending[: len(self.pending) - keep]))
                self.pending = self.pending[len(self.pending) - keep :]
                return [(f, t) for f, t in out if t]
        out.append(("content", self.pending))
        self.pending = ""
        return [(f, t) for f, t in out if t]

    def flush(self) -> list[tuple[str, str]]:
        """What is still held back when the answer ends."""
        text, self.pending = self.pending, ""
        field = "reasoning_content" if self.thinking else "content"
        return [(field, text)] if text else []


def _tag_prefix_at_end(text: str, tag: str) -> int:
    """The length of the longest end of `text` that starts `tag` (0: none)."""
    for size in range(min(len(tag) - 1, len(text)), 0, -1):
        if tag.startswith(text[-size:]):
            return size
    return 0
