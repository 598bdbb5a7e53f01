"""A local OTLP/HTTP trace receiver: `toolkit trace collect`, and the tests' and bench's span sink.

POST /v1/traces with a JSON or protobuf body (gzip or not) -> every span appended to a JSON-lines
file (toolkit.trace.records), kept in memory for whoever embeds the receiver, and, with `forward`,
re-sent as protobuf to another OTLP/HTTP endpoint (Phoenix takes protobuf only; tritonserver sends
JSON only). Binds loopback by default: spans carry prompts' sizes and timings, never meant for the
network unless asked.
"""

from __future__ import annotations

import errno
import gzip
import logging
import queue
import socket
import threading
import urllib.error
import urllib.request
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from toolkit.errors import ServerError, TraceError
from toolkit.trace.records import SpanRecord, parse_export, span_records, write_jsonl

log = logging.getLogger("toolkit.trace")

MAX_BODY_BYTES = 64 * 2**20  # one export batch: Triton's default is at most 512 spans
FORWARD_TIMEOUT_S = 5.0


class SpanReceiver:
    """The receiver's state: where spans go; `serve_in_background` or `serve_forever` runs it."""

    def __init__(
        self,
        out: Path | None = None,
        *,
        host: str = "127.0.0.1",
        port: int = 4318,
        forward: str | None = None,
        keep: bool = True,
        on_spans: Callable[[list[SpanRecord]], None] | None = None,
    ):
        self.out = out
        self.forward = forward
        self.keep = keep
        self.on_spans = on_spans
        self.records: list[SpanRecord] = []
        self.batches = 0
        self.rejected = 0
        self._lock = threading.Lock()
        self._arrived = threading.Condition(self._lock)
        self._forwarding: queue.Queue[bytes | None] = queue.Queue(maxsize=256)
        try:
            self.server = ThreadingHTTPServer((host, port), _handler(self))
        except OSError as exc:
            raise ServerError(
                f"the trace receiver cannot listen on {host}:{port}: {exc.strerror}",
                hint=_listen_hint(exc),
            ) from exc
        self.server.daemon_threads = True
        self._threads: list[threading.Thread] = []

    @property
    def url(self) -> str:
        host, port = self.server.server_address[:2]
        return f"http://{host!s}:{port}"

    def accept(self, body: bytes, content_type: str) -> None:
        """One export batch: parse (TraceError when it is none), record, pass on."""
        request = parse_export(body, content_type)
        records = span_records(request)
        with self._arrived:
            if self.out is not None:
                write_jsonl(self.out, records)
            if self.keep:
                self.records.extend(records)
            self.batches += 1
            self._arrived.notify_all()
        if self.on_spans is not None:
            self.on_spans(records)
        if self.forward:
            try:
                self._forwarding.put_nowait(request.SerializeToString())
            except queue.Full:
                log.warning("the forward queue to %s is full: a batch was dropped", self.forward)

    def wait_for(self, done: Callable[[list[SpanRecord]], bool], timeout_s: float) -> bool:
        """Block until `done(records)` holds or `timeout_s` passes; returns whether it held."""
        with self._arrived:
            return self._arrived.wait_for(lambda: done(self.records), timeout_s)

    def serve_in_background(self) -> SpanReceiver:
        self._start_thread(self.server.serve_forever, "trace-receiver")
        if self.forward:
            self._start_thread(self._forward_loop, "trace-forward")
        return self

    def serve_forever(self) -> None:
        if self.forward:
            self._start_thread(self._forward_loop, "trace-forward")
        self.server.serve_forever()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self._forwarding.put(None)
        for thread in self._threads:
            thread.join(timeout=FORWARD_TIMEOUT_S + 1)

    def __enter__(self) -> SpanReceiver:
        return self.serve_in_background()

    def __exit__(self, *exc) -> None:
        self.close()

    def _start_thread(self, target, name: str) -> None:
        thread = threading.Thread(target=target, name=name, daemon=True)
        thread.start()
        self._threads.append(thread)

    def _forward_loop(self) -> None:
        while (body := self._forwarding.get()) is not None:
            request = urllib.request.Request(
                str(self.forward),
                data=body,
                headers={"Content-Type": "application/x-protobuf"},
                method="POST",
            )
            try:
                with urllib.request.urlopen(request, timeout=FORWARD_TIMEOUT_S):
                    pass
            except (urllib.error.URLError, OSError) as exc:
                log.warning("forwarding spans to %s failed: %s", self.forward, exc)


def _listen_hint(exc: OSError) -> str:
    """The fix for a failure to listen: the host's (it does not resolve, or is not this machine's), the
    port's (taken, or privileged), or else both."""
    host_fix = (
        "--host must be an address of this machine: 127.0.0.1 (the default), or 0.0.0.0 for all"
    )
    if isinstance(exc, socket.gaierror) or exc.errno == errno.EADDRNOTAVAIL:
        return host_fix
    if exc.errno == errno.EADDRINUSE:
        return "another process listens there (another receiver?): pick another --port"
    if exc.errno == errno.EACCES:
        return "ports below 1024 need root: pick a --port above 1023 (4318 is OTLP/HTTP's)"
    return f"check --host ({host_fix}) and --port"


def _handler(receiver: SpanReceiver) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format, *args) -> None:  # noqa: A002 - the base class's name
            pass  # one line per export batch on stderr would drown what the command prints

        def do_POST(self) -> None:  # noqa: N802 - http.server's name
            if self.path.split("?")[0] != "/v1/traces":
                self._answer(
                    404, b"only /v1/traces (OTLP/HTTP traces) is served here\n", "text/plain"
                )
                return
            length = int(self.headers.get("content-length") or 0)
            if not 0 < length <= MAX_BODY_BYTES:
                self._answer(413, b"export body missing or too large\n", "text/plain")
                return
            body = self.rfile.read(length)
            if self.headers.get("content-encoding", "").lower() == "gzip":
                body = gzip.decompress(body)
            content_type = self.headers.get("content-type", "application/x-protobuf")
            try:
                receiver.accept(body, content_type)
            except TraceError as exc:
                receiver.rejected += 1
                self._answer(400, f"{exc.message}\n".encode(), "text/plain")
                return
            # An empty ExportTraceServiceResponse, in the request's encoding.
            json_body = "json" in content_type
            self._answer(200, b"{}" if json_body else b"", content_type)

        def _answer(self, status: int, body: bytes, content_type: str) -> None:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    return Handler
