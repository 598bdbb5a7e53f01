"""Server-sent events of the OpenAI API, read in one place: by tests (any line iterator) and by the perf
scripts' lean load generator (raw asyncio streams, HTTP/1.1 chunked, keep-alive).
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from dataclasses import dataclass

DONE = "[DONE]"
_COMPLETION_TOKENS = re.compile(rb'"completion_tokens":(\d+)[,}]')
_FIRST_TEXT = re.compile(rb'"(?:text|content)":"[^"]')


def sse_data(line: str | bytes) -> dict | str | None:
    """One SSE line: its JSON payload, DONE for `data: [DONE]`, None for anything else (other fields, blanks)."""
    text = line.decode() if isinstance(line, bytes) else line
    if not text.startswith("data:"):
        return None
    data = text[5:].strip()
    return DONE if data == DONE else json.loads(data)


@dataclass(frozen=True)
class TimedStream:
    """One streamed request as its client saw it."""

    start_ns: int
    chunk_ns: tuple[int, ...]  # each HTTP chunk that carried text
    completion_tokens: int  # from the usage chunk (stream_options.include_usage)


class SseProtocolError(RuntimeError):
    """The API answered something other than a 200 event stream."""


class LeanStreamClient:
    """Streaming POSTs over raw asyncio streams: the cheapest load generator for a 2-core machine.

    httpx and a json.loads per chunk cost the client more CPU per token than the server spends on
    it; this client only looks for the first text and the usage chunk. `stream()` returns
    (seconds to the first text or None, usage.completion_tokens or None).
    """

    def __init__(self, url: str, path: str, body: dict):
        self.host, port = url.removeprefix("http://").rsplit(":", 1)
        self.port = int(port)
        self.payload = json.dumps(body).encode()
        self.head = (
            f"POST {path} HTTP/1.1\r\nHost: {self.host}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(self.payload)}\r\n"
        )
        self.request = f"{self.head}\r\n".encode() + self.payload
        self.idle: list = []

    async def stream(self) -> tuple[float | None, int | None]:
        loop = asyncio.get_running_loop()
        start = loop.time()
        reader, writer = await self._send(self.request)
        first, tail = None, b""
        async for data in self._chunks(reader):
            if first is None and _FIRST_TEXT.search(data):
                first = loop.time() - start
            tail = (tail + data)[-4096:]
        self.idle.append((reader, writer))
        match = _COMPLETION_TOKENS.search(tail)
        return first, int(match.group(1)) if match else None

    async def stream_timed(self, headers: dict[str, str]) -> TimedStream:
        """One streaming request with these extra headers; when it started and when each HTTP chunk
        that carries text arrived (ns since the epoch, to set beside the server's spans)."""
        extra = "".join(f"{name}: {value}\r\n" for name, value in headers.items())
        start = time.time_ns()
        reader, writer = await self._send(f"{self.head}{extra}\r\n".encode() + self.payload)
        chunks, tail = [], b""
        async for data in self._chunks(reader):
            if _FIRST_TEXT.search(data):
                chunks.append(time.time_ns())
            tail = (tail + data)[-4096:]
        self.idle.append((reader, writer))
        match = _COMPLETION_TOKENS.search(tail)
        return TimedStream(start, tuple(chunks), int(match.group(1)) if match else 0)

    async def _send(self, request: bytes):
        reader, writer = (
            self.idle.pop() if self.idle else await asyncio.open_connection(self.host, self.port)
        )
        writer.write(request)
        status = await reader.readline()
        if not status:  # the server closed an idle keep-alive connection: open a new one
            writer.close()
            reader, writer = await asyncio.open_connection(self.host, self.port)
            writer.write(request)
            status = await reader.readline()
        if b" 200 " not in status:
            raise SseProtocolError(f"the API answered {status!r}: {await reader.read(2000)!r}")
        while (await reader.readline()) not in (b"\r\n", b""):
            pass
        return reader, writer

    @staticmethod
    async def _chunks(reader):
        """The HTTP/1.1 chunks of a response body (the API writes one SSE chunk at a time)."""
        while True:
            size = int((await reader.readline()).split(b";")[0], 16)
            data = await reader.readexactly(size + 2)
            if size == 0:
                return
            yield data

    def close(self) -> None:
        for _, writer in self.idle:
            writer.close()
        self.idle.clear()
