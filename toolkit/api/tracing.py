"""The API's spans: one trace per sampled generation request, its context handed on to Triton.

Cheap by construction. An API that does not trace holds no tracer, and every hook below is behind
one `if trace is not None`. While a traced request runs, the event loop only takes wall-clock stamps
(time.time_ns): the sampler decides on arrival, the span ids are chosen then (the gRPC call's travels
to Triton as the W3C `traceparent`: gRPC metadata, for Triton's own spans, and a request parameter,
for the engines), and no span object exists. When the response ends the stamps are queued, and the
SpanRecorder's thread (toolkit.trace.provider) builds every span from them, as ReadableSpans handed to
the span processors. No span or event per token: api.stream carries the chunks' times (and tokens) as
strings of integers. Why: the 16 streams that end in one engine step end together, just as their next
requests arrive, and building their spans there (~0.1 ms a request, perf/results/trace_cost.md) held
those requests up on the loop (perf/results/api_front_end_tracing.md).

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
        from opentelemetry import trace
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        from toolkit.trace.provider import SpanRecorder, make_tracer_provider

        self.provider, processor = make_tracer_provider(plan, "api")
        self.recorder = SpanRecorder(self.provider, processor, "toolkit.api", __version__)
        # The provider's sampler (--trace-rate's ratio, parent-based, or OTEL_TRACES_SAMPLER's), asked
        # as the SDK's start_span would ask it.
        self.sampler = self.provider.sampler
        self.propagator = TraceContextTextMapPropagator()
        self._span_of = trace.get_current_span

    def start(self, scope, received_ns: int, read_ns: int) -> RequestTrace | None:
        """The trace of a request whose body is in, or None when the sampler leaves it out. A client's
        `traceparent` makes it a child of the client's span (and sampled as the client says)."""
        context = parent = None
        for name, value in scope["headers"]:
            if name == b"traceparent":
                context = self.propagator.extract({TRACEPARENT: value.decode("latin-1")})
                parent = self._span_of(context).get_span_context()
                if not parent.is_valid:
                    context = parent = None
        recorder = self.recorder
        trace_id = parent.trace_id if parent is not None else recorder.ids.generate_trace_id()
        name = f"{scope['method']} {scope['path']}"
        attributes = {
            "http.request.method": scope["method"],
            "url.path": scope["path"],
            "toolkit.layer": "api",
        }
        sampled = self.sampler.should_sample(context, trace_id, name, recorder.server, attributes)
        if not sampled.decision.is_sampled():
            return None
        root = recorder.context(trace_id, trace_state=sampled.trace_state)
        return RequestTrace(self, root, parent, name, attributes, received_ns, read_ns)

    def shutdown(self) -> None:
        self.recorder.shutdown()  # builds what is queued
        self.provider.shutdown()  # exports it


class RequestTrace:
    """Stamps of one request (ns since the epoch), turned into spans by `build`, on the recorder's
    thread, once `end` has queued them: the event loop only stamps."""

    def __init__(self, tracer: ApiTracer, root, parent, name: str, attributes: dict, received_ns: int,
                 read_ns: int):  # fmt: skip
        self.tracer = tracer
        self.root = root  # its SpanContext, chosen now: the call spans' traceparents name its trace
        self.parent = parent  # the client's span context, if it sent one
        self.name = name
        self.attributes = attributes
        self.received_ns = received_ns
        self.read_ns = read_ns
        self.tokenize: tuple[int, int] | None = None
        # Each gRPC call's (sent at, its span's context, model).
        self.calls: list[tuple[int, Any, str]] = []
        self.first_response_ns = 0
        self.last_response_ns = 0
        self.first_write_ns = 0
        self.last_write_ns = 0
        self.chunks: list[tuple[int, int]] = []  # (written at, tokens in it)
        self.detokenize_ns = 0  # summed over every response's token ids -> bytes
        self.end_ns = 0
        self.status = 0

    def tokenized(self, start_ns: int, end_ns: int) -> None:
        self.tokenize = (start_ns, end_ns)

    def call(self, model: str) -> str:
        """A gRPC call to Triton goes out now: the `traceparent` of its span (api.generate), for Triton."""
        root = self.root
        context = self.tracer.recorder.context(root.trace_id, root.trace_state)
        self.calls.append((time.time_ns(), context, model))
        return f"00-{context.trace_id:032x}-{context.span_id:016x}-{context.trace_flags:02x}"

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
        """The response is done: its spans are built later, off the event loop."""
        self.end_ns, self.status = time.time_ns(), status
        self.tracer.recorder.later(self)

    def build(self, recorder) -> None:
        """The request's spans from its stamps (on the recorder's thread)."""
        record, root, end_ns = recorder.record, self.root, self.end_ns
        record("api.receive", root, self.received_ns, self.read_ns)
        if self.calls:
            admission = record("api.admission", root, self.read_ns, self.calls[0][0])
            if self.tokenize:
                record("api.tokenize", admission, *self.tokenize)
        for sent_ns, context, model in self.calls:
            record(
                "api.generate", root, sent_ns, self.last_response_ns or end_ns,
                {"rpc.system": "grpc", "triton.model_name": model},
                context=context, kind=recorder.client,
            )  # fmt: skip
        if self.first_response_ns and self.first_write_ns:
            record("api.first_chunk", root, self.first_response_ns, self.first_write_ns)
            self._stream(root)
        events: tuple = ()
        if self.first_write_ns:
            events = (recorder.event("first_token", timestamp=self.first_write_ns),)
        attributes = {**self.attributes, "http.response.status_code": self.status}
        record(
            self.name, self.parent, self.received_ns, end_ns, attributes,
            context=root, kind=recorder.server, events=events,
        )  # fmt: skip

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
