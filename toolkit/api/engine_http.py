"""The engine's responses over Triton's HTTP generate_stream (the generate extension's server-sent events).

`toolkit serve --engine-transport http` (its default): the OpenAI API sends engine-contract requests to
`POST /v2/models/tensorrt_llm/generate_stream` and reads one SSE event per engine response, on kept-alive
connections it pools, instead of one grpc.aio ModelStreamInfer message per response. grpc.aio's receive is
most of a Python relay's cost per streamed token: the same bare relay costs 0.35-0.44x the CPU per token
with this transport (perf/results/api_floor.md). The extension is Triton's own ("provisional"): its JSON
carries each of the request's tensors flat (Triton fills the model's declared shape from them), the
request parameters under "parameters", and each response's outputs by name, a one-element output as a
bare number.

A stream ends when the HTTP response does (the final response); closing its connection first cancels the
request in Triton, as cancelling the gRPC call does. Log prob outputs (arrays whose shapes the JSON drops)
stay on gRPC: TritonBackend.generate picks the transport per request.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncGenerator
from typing import Any

import httptools
import numpy as np

READ_BYTES = 65536
IDLE_KEPT = 256  # idle connections kept for the next requests; more are closed


class HttpEngineError(Exception):
    """Triton's HTTP endpoint cannot be reached, or broke the stream off (not the model's own error)."""


def request_body(tensors: list[tuple[str, np.ndarray, str]], parameters: dict[str, Any]) -> bytes:
    """A generate request: each tensor (batch-first, batch 1) as its one item's values, flat in row-major
    order, and the parameters. BYTES tensors go as text.

    Flat, because Triton's generate extension takes a JSON array's top-level length as its element count
    and fills the model's declared shape from that: a nested [2, N] stop_words_list of N > 1 was refused
    ("Shape does not match true shape of 'data' field")."""
    body: dict[str, Any] = {}
    for name, array, datatype in tensors:
        item = array[0].reshape(-1)
        if datatype == "BYTES":
            body[name] = [v.decode("utf-8") if isinstance(v, bytes) else str(v) for v in item]
        else:
            body[name] = item.tolist()
    if parameters:
        body["parameters"] = parameters
    return json.dumps(body, separators=(",", ":")).encode()


class _Response:
    """httptools callbacks for one generate_stream response: its status, its events as they come."""

    def __init__(self) -> None:
        self.parser = httptools.HttpResponseParser(self)
        self.status = 0
        self.sse = False
        self.buffer = bytearray()
        self.events: list[dict] = []
        self.complete = False

    def on_header(self, name: bytes, value: bytes) -> None:
        if name.lower() == b"content-type":
            self.sse = value.startswith(b"text/event-stream")

    def on_headers_complete(self) -> None:
        self.status = self.parser.get_status_code()

    def on_body(self, data: bytes) -> None:
        self.buffer.extend(data)
        if not self.sse:
            return  # a JSON error body, read whole at the end
        while (end := self.buffer.find(b"\n\n")) >= 0:
            event = bytes(self.buffer[:end])
            del self.buffer[: end + 2]
            if event.startswith(b"data: "):
                self.events.append(json.loads(event[6:]))

    def on_message_complete(self) -> None:
        self.complete = True
        if not self.sse and self.buffer:
            try:
                self.events.append(json.loads(bytes(self.buffer)))
            except ValueError:
                self.events.append({"error": bytes(self.buffer).decode("utf-8", "replace")[:500]})
            self.buffer.clear()


def _feed(response: _Response, data: bytes) -> None:
    try:
        response.parser.feed_data(data)
    except httptools.HttpParserError as exc:
        # a callback's own error (an event that is not JSON) is the parser error's context
        cause = exc.__context__ or exc
        raise HttpEngineError(
            f"not a valid generate_stream answer ({cause}): is the Triton HTTP address right? "
            f"The bytes read: {data[:60]!r}"
        ) from exc


class HttpStream:
    """One generate_stream request: `events()` yields its events (dicts); `cancel()` closes its connection,
    which cancels the request in Triton and ends `events()` with asyncio.CancelledError."""

    def __init__(self, pool: HttpEnginePool, path: bytes, body: bytes, headers: bytes):
        self.pool = pool
        self.request = (
            b"POST %s HTTP/1.1\r\nHost: triton\r\nContent-Type: application/json\r\n%s"
            b"Content-Length: %d\r\n\r\n%s" % (path, headers, len(body), body)
        )
        self.connection: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None
        self.cancelled = False
        self.finished = False

    def cancel(self) -> None:
        self.cancelled = True
        if self.connection is not None:
            self.connection[1].transport.abort()

    async def events(self) -> AsyncGenerator[dict, None]:
        response = await self._send()
        reader, writer = self.connection  # type: ignore[misc]
        try:
            while True:
                if response.events:
                    events, response.events = response.events, []
                    for event in events:
                        yield event
                if response.complete:
                    break
                _feed(response, await self._read(reader))
            self.finished = True
        finally:
            self.connection = None
            if self.finished and not self.cancelled and response.status == 200:
                self.pool.give_back(reader, writer)
            else:
                writer.transport.abort()  # mid-stream: closing it is what cancels the request

    async def _send(self) -> _Response:
        """Write the request on a pooled connection (a fresh one when Triton had closed that one before
        answering a byte) and read up to its first bytes."""
        while True:
            reader, writer, reused = await self.pool.take()
            self.connection = (reader, writer)
            if self.cancelled:
                writer.transport.abort()
                raise asyncio.CancelledError
            writer.write(self.request)
            response = _Response()
            try:
                data = await self._read(reader)
            except HttpEngineError:
                writer.transport.abort()
                if reused:
                    continue  # an idle connection Triton had closed: it never got the request
                raise
            _feed(response, data)
            return response

    async def _read(self, reader: asyncio.StreamReader) -> bytes:
        try:
            data = await reader.read(READ_BYTES)
        except (ConnectionError, OSError) as exc:
            if self.cancelled:
                raise asyncio.CancelledError from exc
            raise HttpEngineError(f"the connection broke: {exc}") from exc
        if not data:
            if self.cancelled:
                raise asyncio.CancelledError
            raise HttpEngineError("tritonserver closed the connection mid-response")
        return data


def http_address(url: str) -> tuple[str, int]:
    """HOST:PORT (an http:// in front is taken) as (host, port); ValueError naming the value otherwise."""
    host, _, port = url.removeprefix("http://").rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536 or "/" in host:
        raise ValueError(
            f"a Triton HTTP address is HOST:PORT (e.g. 127.0.0.1:8000, tritonserver's --http-port), "
            f"not {url!r}"
        )
    return host.strip("[]"), int(port)


class HttpEnginePool:
    """Kept-alive connections to one tritonserver's HTTP port, for generate_stream requests."""

    def __init__(self, url: str):
        self.url = url
        self.host, self.port = http_address(url)
        self._idle: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []

    def stream(self, model: str, body: bytes, traceparent: str | None = None) -> HttpStream:
        headers = b"traceparent: %s\r\n" % traceparent.encode() if traceparent else b""
        return HttpStream(self, b"/v2/models/%s/generate_stream" % model.encode(), body, headers)

    async def take(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter, bool]:
        """An idle connection (reused: True) or a new one."""
        while self._idle:
            reader, writer = self._idle.pop()
            if not writer.is_closing() and not reader.at_eof():
                return reader, writer, True
            writer.transport.abort()
        try:
            reader, writer = await asyncio.open_connection(self.host, self.port)
        except OSError as exc:
            raise HttpEngineError(
                f"cannot connect to Triton's HTTP port {self.url}: {exc}"
            ) from exc
        return reader, writer, False

    async def ready(self, timeout_s: float) -> str | None:
        """None when the port answers Triton's readiness check (GET /v2/health/ready) with 200; else what
        it did. A connection of its own, closed after: the pool's are for streams."""
        try:
            reader, writer = await asyncio.wait_for(
                asyncio.open_connection(self.host, self.port), timeout_s
            )
        except (OSError, asyncio.TimeoutError) as exc:
            return f"takes no connection ({exc or 'no answer in time'})"
        try:
            writer.write(
                b"GET /v2/health/ready HTTP/1.1\r\nHost: triton\r\nConnection: close\r\n\r\n"
            )
            line = await asyncio.wait_for(reader.readline(), timeout_s)
        except (OSError, asyncio.TimeoutError) as exc:
            return f"does not answer ({exc or 'no answer in time'})"
        finally:
            writer.transport.abort()
        status = line.split()[1:2]
        if status != [b"200"]:
            shown = line.decode("latin-1").strip()[:80] or "nothing"
            return f"answered its readiness check with {shown!r}, not 200"
        return None

    def give_back(self, reader, writer) -> None:
        if len(self._idle) >= IDLE_KEPT or writer.is_closing():
            writer.transport.abort()
            return
        self._idle.append((reader, writer))

    async def close(self) -> None:
        for _, writer in self._idle:
            writer.transport.abort()
        self._idle.clear()
