"""The API's front door, as plain ASGI middleware: API keys, the body's deadline, size and read budget, the
in-flight bound, request counting.

Plain ASGI (not BaseHTTPMiddleware) so streamed responses pass through untouched and a generation
keeps its in-flight slot until its stream has really ended, however it ends (done, error, or the
client hanging up mid-stream). A request is counted in flight only once its whole body has arrived:
a client trickling a body holds a connection (until --body-timeout), never a slot.

Nothing is read for a caller without a key (every path but /health and /metrics needs one when keys
are set), and only a generation request's body is ever read: every other request is answered
without reading its body, and its connection closed when it announced one (its unread bytes must
not be parsed as the next request). So what bodies hold in memory is bounded by the read budget
(before admission) and by --max-in-flight requests (after).
"""

from __future__ import annotations

import hmac
import json
import time

from toolkit.api.body import ClientLeft, ReadBudget, Refusal, check_structure, read_body, replay
from toolkit.api.errors import error_body
from toolkit.api.metrics import ApiMetrics
from toolkit.settings import ApiLimits

ARRIVAL = "toolkit_arrival"
CLIENT = (
    "toolkit_client"  # which API key (its index), for the key's share of the engine (fairness.py)
)
SHARE_RELEASE = "toolkit_share_release"  # set by the route once the request holds its share
GENERATION_PATHS = frozenset({"/v1/chat/completions", "/v1/completions"})
# Bodies read (bounded, as a generation's) but not counted in flight: the tokenizer's endpoints.
TOKENIZER_PATHS = frozenset({"/tokenize", "/detokenize"})
OPEN_PATHS = frozenset({"/health", "/metrics"})  # answered without an API key (probes, scrapers)
CLOSE = (b"connection", b"close")
ENDPOINTS = {
    "/v1/chat/completions": "chat_completions",
    "/v1/completions": "completions",
    "/v1/models": "models",
    "/tokenize": "tokenize",
    "/detokenize": "detokenize",
    "/health": "health",
    "/metrics": "metrics",
}


class Gate:
    def __init__(
        self,
        app,
        *,
        api_keys: tuple[str, ...],
        max_in_flight: int,
        retry_after_s: int,
        metrics: ApiMetrics,
        limits: ApiLimits | None = None,
    ):
        self.app = app
        self.api_keys = tuple(key.encode() for key in api_keys)
        self.max_in_flight = max_in_flight
        self.retry_after_s = retry_after_s
        self.metrics = metrics
        self.limits = limits or ApiLimits()
        self.in_flight = 0
        self.budget = ReadBudget(self.limits.read_budget_bytes, metrics.body_read.set)

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path = scope["path"]
        endpoint = ENDPOINTS.get(path, "models" if path.startswith("/v1/models/") else "other")
        status = [500]

        async def send_and_record(message):
            if message["type"] == "http.response.start":
                status[0] = message["status"]
            await send(message)

        generation = scope["method"] == "POST" and path in GENERATION_PATHS
        tokenizer = scope["method"] == "POST" and path in TOKENIZER_PATHS
        key = self._key_index(scope) if self.api_keys and path not in OPEN_PATHS else 0
        try:
            if key is None:
                await self._refuse(
                    send_and_record,
                    401,
                    "Incorrect or missing API key: send `Authorization: Bearer <key>`.",
                    "invalid_request_error",
                    "invalid_api_key",
                    # Its body is not read: close rather than parse it as the next request's headers.
                    [(b"www-authenticate", b"Bearer"), CLOSE],
                )
                return
            if not (generation or tokenizer):
                if _announces_body(scope):
                    send_and_record = _closing(send_and_record)
                await self.app(scope, _without_body(receive), send_and_record)
                return
            receive = await self._whole_body(scope, receive, send_and_record, status)
            if receive is None:
                return
            if tokenizer:
                await self.app(scope, receive, send_and_record)
                return
            # Where time-to-first-token starts (Starlette's request.state reads scope["state"]).
            state = scope.setdefault("state", {})
            state[ARRIVAL], state[CLIENT] = time.perf_counter(), f"key{key}"
            if self.in_flight >= self.max_in_flight:
                await self._refuse_busy(send_and_record)
                return
            self.in_flight += 1
            self.metrics.in_flight.inc()
            try:
                await self.app(scope, receive, send_and_record)
            finally:
                self.in_flight -= 1
                self.metrics.in_flight.dec()
                state.pop(SHARE_RELEASE, lambda: None)()  # the response has ended, however it ended
        finally:
            self.metrics.requests.labels(endpoint, str(status[0])).inc()

    async def _whole_body(self, scope, receive, send, status: list):
        """A `receive` that replays the whole body; None when it was refused (408, 413, 503) or its client left."""
        try:
            body = await read_body(scope, receive, self.limits, self.budget)
        except ClientLeft:
            status[0] = 499
            return None
        if not isinstance(body, Refusal):
            body = check_structure(body) or body
        if isinstance(body, Refusal):
            # Part of the body may still be on its way: close the connection rather than read it.
            headers, kind = [CLOSE], "invalid_request_error"
            if body.status == 503:  # the read budget is full: the server's state, not the request's
                headers.append((b"retry-after", str(self.retry_after_s).encode()))
                kind = "server_error"
            await self._refuse(send, body.status, body.message, kind, body.code, headers)
            return None
        return replay(body, receive)

    async def _refuse_busy(self, send) -> None:
        self.metrics.rejected.inc()
        message = (
            f"Too many requests in flight (limit {self.max_in_flight}); "
            f"retry after {self.retry_after_s} s."
        )
        retry = [(b"retry-after", str(self.retry_after_s).encode())]
        await self._refuse(send, 429, message, "rate_limit_error", "rate_limit_exceeded", retry)

    def _key_index(self, scope) -> int | None:
        """Which of the API keys the request carries, or None (no key, or another)."""
        header = dict(scope["headers"]).get(b"authorization", b"")
        scheme, _, token = header.partition(b" ")
        if scheme.lower() != b"bearer" or not token:
            return None
        token = token.strip()
        # Compare against every key, in constant time per key: no early exit that leaks which matched.
        matches = [hmac.compare_digest(token, key) for key in self.api_keys]
        return matches.index(True) if any(matches) else None

    @staticmethod
    async def _refuse(send, status: int, message: str, type: str, code: str, headers: list) -> None:
        body = json.dumps(error_body(message, type, None, code)).encode()
        await send(
            {
                "type": "http.response.start",
                "status": status,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(body)).encode()),
                    *headers,
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})


def _announces_body(scope) -> bool:
    for name, value in scope["headers"]:
        if name == b"transfer-encoding" or (name == b"content-length" and value.strip() != b"0"):
            return True
    return False


def _closing(send):
    """`send` with `connection: close` on the response: the request's unread body is never parsed."""

    async def send_and_close(message):
        if message["type"] == "http.response.start":
            headers = [h for h in message.get("headers", ()) if h[0].lower() != b"connection"]
            message = {**message, "headers": [*headers, CLOSE]}
        await send(message)

    return send_and_close


def _without_body(receive):
    """A `receive` for a request whose body is not read: an empty body, then only a disconnect."""
    given = False

    async def receive_no_body():
        nonlocal given
        if not given:
            given = True
            return {"type": "http.request", "body": b"", "more_body": False}
        while True:  # what is left of the body is passed over, never kept
            message = await receive()
            if message["type"] != "http.request":
                return message

    return receive_no_body
