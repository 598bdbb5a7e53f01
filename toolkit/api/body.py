"""Read a request's whole body before the app sees it: within a deadline, up to a size, within a budget.

uvicorn bounds neither (h11 and httptools alike hand the app whatever arrives, whenever it
arrives), and FastAPI reads the body only inside the route, after the gate has counted the request
in flight. Reading it here first means a slow or oversized upload is refused (408, 413) without ever
holding an in-flight slot, and the app gets the body in one message. The bodies being read at once
share one ReadBudget of the bytes that have arrived: a body whose next bytes would pass it is refused
(503), so what slow uploads hold in memory is bounded however many connections send them. A declared
Content-Length reserves nothing (only one over --max-body-mib is refused at once, 413): a client that
announces megabytes and sends none holds no budget that other requests need.
"""

from __future__ import annotations

import asyncio
import re
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


class _OverBudget(Exception):
    pass


class ClientLeft(Exception):
    """The client disconnected before its body was complete."""


class ReadBudget:
    """Bytes of request bodies being read at once, across all connections: at most `limit` (one per app).

    Every body reserves what has arrived, chunk by chunk, whether it declared a Content-Length or is
    chunked: an announced length costs nothing until its bytes come. The reservation ends when the body
    is complete (it then belongs to a request that counts against --max-in-flight, or is dropped with a
    429) or refused.
    """

    def __init__(self, limit: int, on_change=lambda held: None):
        self.limit = limit
        self.held = 0
        self.on_change = on_change  # told the bytes held after each change (a gauge)

    def take(self, size: int) -> bool:
        if self.held + size > self.limit:
            return False
        self.held += size
        self.on_change(self.held)
        return True

    def give_back(self, size: int) -> None:
        self.held -= size
        self.on_change(self.held)


class _Reservation:
    """One body's share of the budget: grows to what the body needs, given back once."""

    def __init__(self, budget: ReadBudget):
        self.budget = budget
        self.size = 0

    def cover(self, size: int) -> bool:
        """Reserve up to `size` bytes in all; False (nothing more reserved) when the budget has no room."""
        if size <= self.size:
            return True
        if not self.budget.take(size - self.size):
            return False
        self.size = size
        return True

    def release(self) -> None:
        self.budget.give_back(self.size)
        self.size = 0


async def read_body(scope, receive, limits: ApiLimits, budget: ReadBudget) -> bytes | Refusal:
    """The whole body, or why not; raises ClientLeft when the client hangs up first."""
    declared = _content_length(scope)
    if declared is not None and declared > limits.max_body_bytes:
        return _too_large(f"is {declared} bytes", limits)
    reservation = _Reservation(budget)
    try:
        reading = _read_all(receive, limits.max_body_bytes, reservation.cover)
        return await _within(limits.body_timeout_s, reading)
    except _TooLarge:
        return _too_large("is larger than that", limits)
    except _OverBudget:
        return _busy(budget)
    except asyncio.TimeoutError:
        return Refusal(
            408,
            f"The request body did not arrive within {limits.body_timeout_s:g} s of its headers; send it "
            "faster, or raise the limit with --body-timeout (toolkit api / toolkit serve).",
            "request_timeout",
        )
    finally:
        reservation.release()


# --- what a body costs to parse ---------------------------------------------------------------
# Parsing and validating costs per JSON value, not per byte: 8 MB of 460k empty messages held the event
# loop 2.4 s (580k unknown keys: 3.7 s; every process of the API waits meanwhile, /health included).
# Real requests hold a few thousand values at most (a long chat: keys and content per message; tools'
# schemas; a logit_bias), and nest a dozen levels. A body past either bound is refused before it is parsed.
MAX_JSON_VALUES = 32768
MAX_JSON_DEPTH = 64
_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"')
_INNERMOST = re.compile(rb"\[[^\[\]{}]*\]|\{[^\[\]{}]*\}")


def check_structure(body: bytes) -> Refusal | None:
    """Why `body` holds too many JSON values or nests too deep to be parsed, or None. Counts bytes in C
    (bytes.count: ~1 ms a MB); only a body whose raw counts pass a bound is looked at without its strings."""
    if _values(body) <= MAX_JSON_VALUES and _containers(body) <= MAX_JSON_DEPTH:
        return None  # every normal request: commas and brackets inside strings counted too
    # Each JSON string is delimited by two unescaped quotes: a lower bound on how many there are.
    strings = (body.count(b'"') - body.count(b'\\"')) // 2
    if strings > MAX_JSON_VALUES:
        return _too_complex(f"more than {MAX_JSON_VALUES} JSON values (it holds {strings} strings)")
    structure = _STRING.sub(b'""', body)  # what is left once the text is out: keys, items, brackets
    values = _values(structure)
    if values > MAX_JSON_VALUES:
        return _too_complex(
            f"{values} JSON values (keys and list items), over the bound of {MAX_JSON_VALUES}"
        )
    if _containers(structure) > MAX_JSON_DEPTH and _deeper_than(structure, MAX_JSON_DEPTH):
        return _too_complex(f"JSON nested more than {MAX_JSON_DEPTH} levels deep")
    return None


def _values(data: bytes) -> int:
    """An upper bound on keys and list items: each but the first of a container follows a comma."""
    return data.count(b",") + _containers(data)


def _containers(data: bytes) -> int:
    return data.count(b"[") + data.count(b"{")


def _deeper_than(structure: bytes, depth: int) -> bool:
    """Whether brackets nest past `depth`: each pass replaces the innermost containers by a value."""
    for _ in range(depth):
        structure, found = _INNERMOST.subn(b"0", structure)
        if not found:
            return False
    return bool(_INNERMOST.search(structure))


def _too_complex(what: str) -> Refusal:
    return Refusal(
        400,
        f"The request body holds {what}: no request needs that many, and parsing them would stall "
        "the server; send fewer messages or values.",
        "request_too_complex",
    )


def replay(body: bytes, receive):
    """A `receive` that hands the app the body in one message, then passes on (to see a disconnect)."""
    pending = [{"type": "http.request", "body": body, "more_body": False}]

    async def receive_body():
        if pending:
            return pending.pop()
        return await receive()

    return receive_body


async def _read_all(receive, max_bytes: int, cover) -> bytes:
    """The body's chunks joined; `cover(size)` must reserve the bytes read so far, else _OverBudget."""
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
        if not cover(size):
            raise _OverBudget()
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


def _busy(budget: ReadBudget) -> Refusal:
    return Refusal(
        503,
        f"The server holds as many bytes of request bodies being read as it may ({budget.limit} bytes); retry "
        "shortly, or raise the limit with --body-read-budget-mib (toolkit api / toolkit serve).",
        "server_busy",
    )


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
