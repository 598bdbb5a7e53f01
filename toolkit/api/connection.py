"""uvicorn's HTTP protocols with a deadline and a size bound on request headers, and a deadline on writes.

uvicorn has neither header bound for httptools (h11 bounds the size, at 16 KiB, but not the time): a
connection that opens and sends nothing, or sends its headers a byte at a time, is held forever, and
httptools takes megabytes of headers. Here the headers of each request must be complete within
`header_timeout_s` of the connection opening (or of the previous response, on a kept-alive
connection) and within MAX_HEADER_BYTES; else the connection is answered 408 or 431 and closed
(closed silently when nothing at all was sent, as an idle kept-alive connection is).

A request pipelined while the previous one is answered gets the same bounds from its first byte:
httptools parses it at once (into memory, without limit) while the previous response streams. Its
bytes count from the moment the previous request's body is complete, and its deadline runs from its
first byte (httptools' on_message_begin); past either, the connection is closed without an answer,
since none can be written into the middle of another response (its stream sees the disconnect and
cancels the engine request). h11 needs none of this: it stops reading once a request's body is
complete until its response is done, and the bounds then apply as on any kept-alive connection.

Nor does uvicorn bound a write: once the transport's write buffer passes its high-water mark (64 KiB),
every `send` of the app awaits the buffer draining, with no deadline, so a client that stops reading
holds its request (and its --max-in-flight slot, and the engine's work) forever. Here the buffer must
drain to its low-water mark within `send_timeout_s` of passing the high-water mark, else the connection
is aborted: the app's send returns, the stream sees the disconnect and cancels the engine request.
The body's own deadline, size and budget are the gate's (toolkit/api/body.py).
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import TYPE_CHECKING, Any

from toolkit.api.errors import error_body

MAX_HEADER_BYTES = 64 * 1024  # request line and headers; h11's own bound is 16 KiB
log = logging.getLogger("toolkit.api")


if TYPE_CHECKING:

    class _UvicornProtocol(asyncio.Protocol):
        """What the mixin uses of the uvicorn protocol it is mixed into (for the type checker)."""

        transport: asyncio.Transport
        cycle: Any
        loop: asyncio.AbstractEventLoop
        client: tuple[str, int] | None

        def on_message_begin(self) -> None: ...

        def on_response_complete(self) -> None: ...

else:
    _UvicornProtocol = object


class _Bounds(_UvicornProtocol):
    """Mixed into a uvicorn HTTP protocol: headers_complete is seen as `self.cycle` changing (both
    protocols make a new RequestResponseCycle when a request's headers are complete); a stalled write
    as the transport's pause_writing not followed by resume_writing."""

    header_timeout_s: float = 10.0
    send_timeout_s: float = 30.0
    _header_deadline: asyncio.TimerHandle | None = None
    _send_deadline: asyncio.TimerHandle | None = None

    def connection_made(self, transport) -> None:
        super().connection_made(transport)
        self._expect_headers()

    def data_received(self, data: bytes) -> None:
        if self.transport.is_closing():
            return  # refused: nothing more is parsed
        waiting = self.cycle
        # Headers only, all of it: we wait for headers, or the request being answered has its whole body
        # (the next request began inside this data when neither holds: its part is not counted, one read).
        headers_only = self._header_deadline is not None or _body_complete(waiting)
        super().data_received(data)
        if self._header_deadline is None or self.transport.is_closing():
            return  # not waiting for headers: this was body
        if self.cycle is not waiting:
            self._stop_waiting()  # headers complete (the rest of this data was body)
            return
        if headers_only:
            self._header_bytes += len(data)
        if self._header_bytes > MAX_HEADER_BYTES:
            self._refuse(
                431,
                f"The request line and headers are over {MAX_HEADER_BYTES} bytes.",
                "request_header_fields_too_large",
            )

    def on_message_begin(self) -> None:
        """httptools: the first byte of a request. One pipelined behind a response being written gets its
        header deadline now, not when that response ends (h11 has no such call: it stops reading)."""
        super().on_message_begin()
        if self._header_deadline is None and not self.transport.is_closing():
            self._expect_headers()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        # A pipelined request already past its headers arms the deadline when its own response ends; one
        # whose headers are still coming keeps the deadline and count it has had since its first byte.
        if (
            not self.transport.is_closing()
            and self.cycle.response_complete
            and self._header_deadline is None
        ):
            self._expect_headers()

    def connection_lost(self, exc) -> None:
        self._stop_waiting()
        self._stop_send_deadline()
        super().connection_lost(exc)

    def pause_writing(self) -> None:
        super().pause_writing()
        if self._send_deadline is None:
            self._send_deadline = self.loop.call_later(
                self.send_timeout_s, self._client_not_reading
            )

    def resume_writing(self) -> None:
        super().resume_writing()
        self._stop_send_deadline()

    def _stop_send_deadline(self) -> None:
        if self._send_deadline is not None:
            self._send_deadline.cancel()
            self._send_deadline = None

    def _client_not_reading(self) -> None:
        self._send_deadline = None
        log.info(
            "closing the connection of %s: it read too little of its response for %g s (--send-timeout)",
            f"{self.client[0]}:{self.client[1]}" if self.client else "a client",
            self.send_timeout_s,
        )
        # abort, not close: close() would wait for the write buffer to drain, which is what never happens.
        self.transport.abort()

    def _expect_headers(self) -> None:
        self._stop_waiting()
        self._header_bytes = 0
        self._header_deadline = self.loop.call_later(
            self.header_timeout_s, self._headers_late, self.cycle
        )

    def _stop_waiting(self) -> None:
        if self._header_deadline is not None:
            self._header_deadline.cancel()
            self._header_deadline = None

    def _headers_late(self, waiting) -> None:
        self._header_deadline = None
        if self.transport.is_closing() or self.cycle is not waiting:
            return
        if not self._header_bytes:
            self.transport.close()
            return
        self._refuse(
            408,
            f"The request headers did not arrive within {self.header_timeout_s:g} s; send them "
            "faster, or raise the limit with --header-timeout (toolkit api / toolkit serve).",
            "request_timeout",
        )

    def send_400_response(self, msg: str) -> None:
        """uvicorn's answer to bytes that are no HTTP request (a Content-Length of -1, two of them, a bad
        chunk size): a plain-text line; here the same 400 in OpenAI's JSON format, as every other error."""
        self._refuse(
            400,
            "The request is not valid HTTP/1.1 (its request line, headers or chunked framing "
            "cannot be parsed).",
            "invalid_http_request",
            # Bad framing of the request being read (its own cycle, not yet answered) is answered now.
            started_only=True,
        )

    def _answering(self, started_only: bool) -> bool:
        """Whether a response of the previous request is under way (or, `started_only`, being written)."""
        if self.cycle is None or self.cycle.response_complete:
            return False
        return self.cycle.response_started or not started_only

    def _refuse(self, status: int, message: str, code: str, started_only: bool = False) -> None:
        self._stop_waiting()
        if self._answering(started_only):
            # A pipelined request's headers, while the previous response is being written: an answer now
            # would land inside that response. Close; the response's stream sees the disconnect.
            log.info(
                "closing the connection of %s: a pipelined request broke a bound (%d %s)",
                f"{self.client[0]}:{self.client[1]}" if self.client else "a client",
                status,
                code,
            )
            self.transport.close()
            return
        body = json.dumps(error_body(message, "invalid_request_error", None, code)).encode()
        reason = {
            400: b"Bad Request",
            408: b"Request Timeout",
            431: b"Request Header Fields Too Large",
        }[status]
        self.transport.write(
            b"HTTP/1.1 %d %s\r\ncontent-type: application/json\r\ncontent-length: %d\r\n"
            b"connection: close\r\n\r\n%s" % (status, reason, len(body), body)
        )
        self.transport.close()


def _body_complete(cycle) -> bool:
    """Whether the request being answered has all of its body: bytes after it belong to the next request."""
    return cycle is not None and not cycle.more_body and not cycle.response_complete


def bounded_protocol(
    http: str, header_timeout_s: float, send_timeout_s: float
) -> type[asyncio.Protocol]:
    """uvicorn's protocol class for `http` (auto, httptools, h11) with the header and write bounds."""
    base = _base_protocol(http)
    return type(
        f"Bounded{base.__name__}",
        (_Bounds, base),
        {"header_timeout_s": header_timeout_s, "send_timeout_s": send_timeout_s},
    )


def _base_protocol(http: str) -> type[asyncio.Protocol]:
    if http in ("auto", "httptools"):
        try:
            from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

            return HttpToolsProtocol
        except ImportError:
            if http == "httptools":
                raise
    from uvicorn.protocols.http.h11_impl import H11Protocol

    return H11Protocol
