"""The API's spans: one trace per sampled generation request, its context handed on to Triton.

Cheap by construction. An API that does not trace holds no tracer, and every hook below is behind
one `if trace is not None`. A traced request records wall-clock stamps (time.time_ns) as it goes
and builds its spans once, when its response ends, with those stamps as their times: the only span
opened while the request runs is the gRPC call's, whose id travels to Triton as the W3C
`traceparent` (gRPC metadata, for Triton's own spans, and a request parameter, for the engines).
No span or event per token: api.stream carries the chunks' times (and tokens) as strings of integers.
The spans made from stamps come from a SpanRecorder (toolkit.trace.provider): 16 streams that end in
one engine step end together, just as their next requests arrive: ~0.1 ms a request to end, against
~0.19 ms with SDK spans (perf/results/trace_cost.md).

    POST /v1/chat/completions   SERVER, the whole request (gate to last byte)
      api.receive               headers in -> whole body read
      api.admission             body read -> the gRPC call (validation, chat template, tokenize)
        api.tokenize
      api.generate              CLIENT: the gRPC call -> the engine's last response (its context goes on)
      api.first_chunk           the engine's first response -> its text written to the client
      api.stream                first chunk written -> last (each chunk's time and tokens)
"""

from __future__ import annotations

import itertools
import time
from typing import Any

from toolkit import __version__
from toolkit.trace.config import TracePlan

TRACEPARENT = "traceparent"
SCOPE_KEY = "toolkit_trace"  # where the gate leaves a request's RequestTrace (scope["state"])
# The chunks whose times (and tokens) api.stream lists: the first this many, so that a span stays
# bounded; the counts and the longest gap cover every chunk.
MAX_CHUNK_STAMPS = 1024


class ApiTracer:
    """The API process's tracer (built after any fork: one batch span processor per process)."""

    def __init__(self, plan: TracePlan):
        from opentelemetry.trace import SpanKind
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        from toolkit.trace.provider import SpanRecorder, make_tracer_provider

        self.provider, processor = make_tracer_provider(plan, "api")
        self.tracer = self.provider.get_tracer("toolkit.api", __version__)
        self.recorder = SpanRecorder(self.provider, processor, "toolkit.api", __version__)
        self.propagator = TraceContextTextMapPropagator()
        self.server_kind, self.client_kind = SpanKind.SERVER, SpanKind.CLIENT

    def start(self, scope, received_ns: int, read_ns: int) -> RequestTrace | None:
        """The trace of a request whose body is in, or None when the sampler leaves it out. A client's
        `traceparent` makes it a child of the client's span (and sampled as the client says)."""
        carrier = {}
        for name, value in scope["headers"]:
            if name == b"traceparent":
                carrier[TRACEPARENT] = value.decode("latin-1")
        parent = self.propagator.extract(carrier) if carrier else None
        root = self.tracer.start_span(
            f"{scope['method']} {scope['path']}",
            context=parent,
            kind=self.server_kind,
            start_time=received_ns,
            attributes={
                "http.request.method": scope["method"],
                "url.path": scope["path"],
                "toolkit.layer": "api",
            },
        )
        if not root.is_recording():
            return None
        return RequestTrace(self, root, received_ns, read_ns)

    def shutdown(self) -> None:
        self.provider.shutdown()  # exports what is queued


class RequestTrace:
    """Stamps of one request (ns since the epoch), turned into spans by `end`."""

    def __init__(self, tracer: ApiTracer, root, received_ns: int, read_ns: int):
        self.tracer = tracer
        self.root = root
        self.received_ns = received_ns
        self.read_ns = read_ns
        self.tokenize: tuple[int, int] | None = None
        self.call_ns = 0
        self.call_span: Any = None
        self.first_response_ns = 0
        self.last_response_ns = 0
        self.first_write_ns = 0
        self.last_write_ns = 0
        self.chunks: list[tuple[int, int]] = []  # (written at, tokens in it)
        self.detokenize_ns = 0  # summed over every response's token ids -> bytes
        self.attributes: dict[str, Any] = {}

    def tokenized(self, start_ns: int, end_ns: int) -> None:
        self.tokenize = (start_ns, end_ns)

    def call(self, model: str) -> str:
        """Open the gRPC call's span now; its `traceparent`, for Triton."""
        from opentelemetry import trace

        self.call_ns = time.time_ns()
        self.call_span = self.tracer.tracer.start_span(
            "api.generate",
            context=trace.set_span_in_context(self.root),
            kind=self.tracer.client_kind,
            start_time=self.call_ns,
            attributes={"rpc.system": "grpc", "triton.model_name": model},
        )
        carrier: dict[str, str] = {}
        self.tracer.propagator.inject(carrier, trace.set_span_in_context(self.call_span))
        return carrier[TRACEPARENT]

    def response(self, now_ns: int) -> None:
        self.first_response_ns = self.first_response_ns or now_ns
        self.last_response_ns = now_ns

    def wrote(self, tokens: int) -> None:
        now = time.time_ns()
        self.first_write_ns = self.first_write_ns or now
        self.last_write_ns = now
        self.chunks.append((now, tokens))

    def usage(self, prompt_tokens: int, completion_tokens: int, finish_reason: str) -> None:
        self.attributes.update(
            {
                "gen_ai.usage.input_tokens": prompt_tokens,
                "gen_ai.usage.output_tokens": completion_tokens,
                "gen_ai.response.finish_reasons": [finish_reason],
            }
        )

    def end(self, status: int) -> None:
        """Record the child spans from the stamps and end the request's span (the response is done)."""
        end_ns = time.time_ns()
        record = self.tracer.recorder.record
        parent = self.root.get_span_context()
        record("api.receive", parent, self.received_ns, self.read_ns)
        if self.call_ns:
            admission = record("api.admission", parent, self.read_ns, self.call_ns)
            if self.tokenize:
                record("api.tokenize", admission, *self.tokenize)
        if self.call_span is not None:
            self.call_span.end(end_time=self.last_response_ns or end_ns)
        if self.first_response_ns and self.first_write_ns:
            record("api.first_chunk", parent, self.first_response_ns, self.first_write_ns)
            self._stream(parent)
        self.root.set_attributes({**self.attributes, "http.response.status_code": status})
        if self.first_write_ns:
            self.root.add_event("first_token", timestamp=self.first_write_ns)
        self.root.end(end_time=end_ns)

    def _stream(self, parent) -> None:
        """The stream's span: its chunks' summary, and when each was written (us after the first, a
        string of integers) and, unless each held one token, the tokens in each. As an event per
        chunk, or as integer arrays, each chunk cost the exporter an attribute value of its own:
        5-10x more to build and encode, under the GIL the event loop needs."""
        first = self.first_write_ns
        offsets = [(at - first) // 1000 for at, _ in self.chunks]
        tokens = [count for _, count in self.chunks]
        longest_gap_us = max((b - a for a, b in itertools.pairwise(offsets)), default=0)
        offsets = offsets[:MAX_CHUNK_STAMPS]
        attributes = {
            "toolkit.chunks": len(self.chunks),
            "toolkit.tokens": sum(tokens),
            "toolkit.detokenize_us": self.detokenize_ns // 1000,
            "toolkit.chunk_offsets_us": " ".join(map(str, offsets)),
            "toolkit.longest_chunk_gap_ms": longest_gap_us / 1000,
        }
        if any(count != 1 for count in tokens):  # else one token each: the count says it
            attributes["toolkit.chunk_tokens"] = " ".join(map(str, tokens[:MAX_CHUNK_STAMPS]))
        self.tracer.recorder.record(
            "api.stream", parent, self.first_write_ns, self.last_write_ns, attributes
        )


def request_trace(scope) -> RequestTrace | None:
    return scope.get("state", {}).get(SCOPE_KEY)
