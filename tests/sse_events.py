"""The OpenAI API's event streams as the tests read them: the payload of each `data:` line, parsed by
the toolkit's own reader (toolkit/client/sse.py), from any iterator of lines (httpx's iter_lines)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from toolkit.client.sse import DONE, sse_data

__all__ = ["DONE", "chunk_text", "sse_events", "stream_errors"]


def sse_events(lines: Iterable[str | bytes]) -> Iterator[dict | str]:
    """Each event's payload in order: a chunk (dict), an error event (dict), or DONE; blank lines and
    other fields are skipped."""
    for line in lines:
        event = sse_data(line)
        if event is not None:
            yield event


def chunk_text(event: dict | str) -> str | None:
    """The text a chunk carries (a completion's `text`, a chat delta's `content`, "" included);
    None for DONE, error events and chunks without a choice (the usage chunk)."""
    if not isinstance(event, dict) or not event.get("choices"):
        return None
    choice = event["choices"][0]
    return choice["text"] if "text" in choice else choice.get("delta", {}).get("content")


def stream_errors(events: Iterable[dict | str]) -> list[dict]:
    """The `error` objects of the error events among `events` (other items are passed over)."""
    return [event["error"] for event in events if isinstance(event, dict) and "error" in event]
