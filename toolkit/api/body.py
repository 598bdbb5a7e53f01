"""Read a request's whole body before the app sees it: within a deadline, up to a size.

uvicorn bounds neither (h11 and httptools alike hand the app whatever arrives, whenever it
arrives), and FastAPI reads the body only inside the route, after the gate has counted the request
in flight. Reading it here first means a slow or oversized upload is refused (408, 413) without ever
holding an in-flight slot, and the app gets the body in one message.
"""

from __future__ import annotations

import asyncio
import sys
from dataclasses import dataclass

from toolkit.settings import ApiLimits


@dataclass(frozen=True)
class Refusal:
    """Why a body was not read: an HTTP status and an OpenAI-style message, code and setting."""

    status: int
    message: str
    code: str


class _TooLarge(Exception):
    pass


class ClientLeft(Exception):
    """The client disconnected before its body was complete."""


async def read_body(scope, receive, limits: ApiLimits) -> bytes | Refusal:
    """The whole body, or why not; raises ClientLeft when the client hangs up first."""
    declared = _content_length(scope)
    if declared is not None and declared > limits.max_body_bytes:
        return _too_large(f"is {declared} bytes", limits)
    try:
        return await _within(limits.body_timeout_s, _read_all(receive, limits.max_body_bytes))
    except _TooLarge:
        return _too_large("is larger than that", limits)
    except asyncio.TimeoutError:
        return Refusal(
            408,
            f"The request body did not arrive within {limits.body_timeout_s:g} s of its headers; send it "
            "faster, or raise the limit with --body-timeout (toolkit api / toolkit serve).",
            "request_timeout",
        )


def replay(body: bytes, receive):
    """A `receive` that hands the app the body in one message, then passes on (to see a disconnect)."""
    pending = [{"type": "http.request", "body": body, "more_body": False}]

    async def receive_body():
        if pending:
            return pending.pop()
        return await receive()

    return receive_body


async def _read_all(receive, max_bytes: int) -> bytes:
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ClientLeft()
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > max_bytes:
            raise _TooLarge()
        if chunk:
            chunks.append(chunk)
        if not message.get("more_body", False):
            return chunks[0] if len(chunks) == 1 else b"".join(chunks)


async def _within(seconds: float, coroutine):
    """Await `coroutine` in this task, cancelled (TimeoutError) after `seconds`. Not wait_for, which on
    Python < 3.12 runs it in a task of its own: a hop that costs a whole turn of a busy event loop."""
    if sys.version_info >= (3, 11):
        async with asyncio.timeout(seconds):
            return await coroutine
    return await asyncio.wait_for(coroutine, seconds)


def _too_large(what: str, limits: ApiLimits) -> Refusal:
    mib = limits.max_body_bytes / 2**20
    return Refusal(
        413,
        f"The request body {what}: over this server's limit of {limits.max_body_bytes} bytes "
        f"({mib:g} MiB); raise it with --max-body-mib (toolkit api / toolkit serve).",
        "request_too_large",
    )


def _content_length(scope) -> int | None:
    for name, value in scope["headers"]:
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None  # the HTTP parser has already refused a malformed length
    return None
