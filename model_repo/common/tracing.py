"""OpenTelemetry spans of the repository's Python engines (CPU, synthetic), inside the Python backend.

On only when tritonserver was started with tracing (`toolkit serve --trace-rate`, which sets
TOOLKIT_TRACE_ENGINES=1, OTEL_EXPORTER_OTLP_TRACES_ENDPOINT and OTEL_SERVICE_NAME in its
environment; the stubs inherit it), and then only for requests that carry a trace context: Triton's
own model span when Triton traces the request (`request.trace().get_context()`), else the
`traceparent` request parameter the OpenAI API sends (an ensemble passes its parameters to every
step; the BLS model forwards it). So an untraced request costs one attribute check.

A traced request records ns stamps as it goes (arrival, first step it ran in, each step that gave it
tokens) and its spans are built once, when it ends, with those times, under the caller's span:

    engine.request       arrival in execute() -> final response (prompt and output tokens, KV blocks)
      engine.queue       arrival -> the first engine step it runs in (waiting for a batch slot)
      engine.prefill     that step -> its first token
      engine.decode      first token -> last (the steps it was in, tokens)

No span per step or token: their count and the step times are attributes. The step loop only
stamps: a request that ends is queued, and a thread of the tracer's own builds the spans of what is
queued every BUILD_INTERVAL_S, as ReadableSpans handed to the provider's span processors, as the SDK
hands them a span that ended (as toolkit.trace.provider.SpanRecorder does for the API; the repository
cannot import the toolkit). Built on the step loop, the 16 requests that end in one engine step held
up the next step by what their spans cost. The GIL switch interval is cut to 0.5 ms so that the
builder's and the exporter's threads hand the GIL back to the step loop quickly.
"""

from __future__ import annotations

import collections
import json
import os
import sys
import threading
import time

ENGINE_SWITCH = "TOOLKIT_TRACE_ENGINES"
TRACEPARENT = "traceparent"
# toolkit.trace.provider's: the longest the exporter's thread keeps the GIL from the step loop.
SWITCH_INTERVAL_S = 0.0005
BUILD_INTERVAL_S = 0.1  # how often the builder thread makes the spans of the requests that ended


class EngineTracer:
    """The engine's tracer, or a stand-in that traces nothing (`enabled` False)."""

    def __init__(self, model: str):
        self.model = model
        self.provider = None
        self.processor = None
        if os.environ.get(ENGINE_SWITCH) != "1":
            return
        try:
            from opentelemetry.exporter.otlp.json.http.trace_exporter import OTLPSpanExporter
            from opentelemetry.sdk.resources import Resource
            from opentelemetry.sdk.trace import (
                ReadableSpan,
                SynchronousMultiSpanProcessor,
                TracerProvider,
            )
            from opentelemetry.sdk.trace.export import BatchSpanProcessor
            from opentelemetry.sdk.util.instrumentation import InstrumentationScope
            from opentelemetry.trace import SpanContext
        except ImportError as exc:
            print(
                f"{model}: tracing is on but the OpenTelemetry SDK is missing ({exc.name}); no engine "
                "spans (pip install 'toolkit[trace]' into the environment tritonserver's stubs use)",
                file=sys.stderr,
                flush=True,
            )
            return
        resource = Resource.create({"service.name": "toolkit", "toolkit.component": "engine"})
        # Every request that reaches here with a context was sampled upstream: no sampler of our own.
        self.processor = SynchronousMultiSpanProcessor()
        self.provider = TracerProvider(resource=resource, active_span_processor=self.processor)
        # The exporter reads OTEL_EXPORTER_OTLP_TRACES_ENDPOINT, set by toolkit serve.
        self.provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
        self.readable_span, self.span_context = ReadableSpan, SpanContext
        self.scope = InstrumentationScope("toolkit.engine")
        self.ended: collections.deque = collections.deque()
        self._stop = threading.Event()
        self._builder = threading.Thread(target=self._build_ended, name="engine-spans", daemon=True)
        self._builder.start()
        sys.setswitchinterval(min(sys.getswitchinterval(), SWITCH_INTERVAL_S))

    @property
    def enabled(self) -> bool:
        return self.provider is not None

    def start(self, request, prompt_tokens: int, block_size: int) -> RequestSpans | None:
        """The spans of a request that carries a trace context, else None (not traced)."""
        if self.provider is None:
            return None
        traceparent = request_context(request)
        if traceparent is None:
            return None
        return RequestSpans(self, traceparent, prompt_tokens, block_size)

    def record(self, name: str, parent, start_ns: int, end_ns: int, attributes: dict):
        """A finished span under `parent` (a SpanContext); its own SpanContext."""
        context = self.span_context(
            parent.trace_id,
            self.provider.id_generator.generate_span_id(),
            is_remote=False,
            trace_flags=parent.trace_flags,
        )
        span = self.readable_span(
            name=name,
            context=context,
            parent=parent,
            resource=self.provider.resource,
            attributes=attributes,
            start_time=start_ns,
            end_time=max(start_ns, end_ns),
            instrumentation_scope=self.scope,
        )
        self.processor.on_end(span)
        return context

    def build_ended(self) -> None:
        """Build the spans of the requests that ended (the builder thread does every BUILD_INTERVAL_S)."""
        ended = self.ended
        while ended:
            spans = ended.popleft()
            try:
                spans.build()
            except Exception as exc:  # noqa: BLE001 - one broken trace must not end the others'
                print(f"{self.model}: could not build a request's spans: {exc!r}", file=sys.stderr)

    def _build_ended(self) -> None:
        while not self._stop.wait(BUILD_INTERVAL_S):
            self.build_ended()

    def stop_builder(self) -> None:
        """Stop the builder thread; what ended then waits for build_ended()."""
        self._stop.set()
        self._builder.join(5)

    def shutdown(self) -> None:
        if self.provider is not None:
            self.stop_builder()
            self.build_ended()
            self.provider.shutdown()


def request_context(request) -> str | None:
    """The request's traceparent: Triton's model span when Triton traces it, else the request parameter."""
    trace = request.trace() if hasattr(request, "trace") else None
    context = trace.get_context() if trace is not None else None
    if context:
        try:
            found = json.loads(context).get(TRACEPARENT)
        except (ValueError, AttributeError):
            found = None
        if found:
            return found
    parameters = request.parameters() if hasattr(request, "parameters") else None
    if not parameters:
        return None
    try:
        value = json.loads(parameters).get(TRACEPARENT)
    except (ValueError, AttributeError):
        return None
    return value if isinstance(value, str) else None


def _parent_context(traceparent: str):
    """A remote parent's SpanContext from a W3C traceparent (00-<32 hex>-<16 hex>-<2 hex>); None when
    malformed or not sampled (what the SDK's default sampler, parent-based, would drop)."""
    from opentelemetry import trace

    parts = traceparent.strip().split("-")
    if len(parts) < 4 or len(parts[1]) != 32 or len(parts[2]) != 16:
        return None
    try:
        trace_id, span_id, flags = int(parts[1], 16), int(parts[2], 16), int(parts[3][:2], 16)
    except ValueError:
        return None
    if not trace_id or not span_id or not flags & trace.TraceFlags.SAMPLED:
        return None
    return trace.SpanContext(trace_id, span_id, is_remote=True, trace_flags=trace.TraceFlags(flags))


class RequestSpans:
    """One traced request's stamps (ns since the epoch) and counts."""

    __slots__ = (
        "owner",
        "traceparent",
        "prompt_tokens",
        "block_size",
        "arrival_ns",
        "scheduled_ns",
        "first_token_ns",
        "last_token_ns",
        "steps",
        "tokens",
        "longest_step_ns",
        "previous_ns",
        "end_ns",
        "reason",
    )

    def __init__(self, owner: EngineTracer, traceparent: str, prompt_tokens: int, block_size: int):
        self.owner = owner
        self.traceparent = traceparent
        self.prompt_tokens = prompt_tokens
        self.block_size = max(1, block_size)
        self.arrival_ns = time.time_ns()
        self.scheduled_ns = self.first_token_ns = self.last_token_ns = 0
        self.steps = self.tokens = 0
        self.longest_step_ns = self.previous_ns = self.end_ns = 0
        self.reason = ""

    def scheduled(self, now_ns: int | None = None) -> None:
        """The first engine step this request runs in (idempotent)."""
        if not self.scheduled_ns:
            self.scheduled_ns = now_ns or time.time_ns()

    def step(self, new_tokens: int, now_ns: int | None = None) -> None:
        """An engine step gave this request `new_tokens` tokens."""
        now = now_ns or time.time_ns()
        self.scheduled(now)
        if not self.first_token_ns:
            self.first_token_ns = now
        elif now - self.previous_ns > self.longest_step_ns:
            self.longest_step_ns = now - self.previous_ns
        self.previous_ns = self.last_token_ns = now
        self.steps += 1
        self.tokens += new_tokens

    def finish(self, reason: str) -> None:
        """The request ended (its final response is sent or about to be): its spans are built later, on
        the tracer's builder thread."""
        self.end_ns, self.reason = time.time_ns(), reason
        self.owner.ended.append(self)

    def build(self) -> None:
        """The request's spans from its stamps (on the builder thread)."""
        parent = _parent_context(self.traceparent)
        if parent is None:
            return
        record, end, reason = self.owner.record, self.end_ns, self.reason
        blocks = -(-(self.prompt_tokens + self.tokens) // self.block_size)
        inside = record(
            "engine.request",
            parent,
            self.arrival_ns,
            end,
            {
                "toolkit.layer": "engine",
                "triton.model_name": self.owner.model,
                "gen_ai.usage.input_tokens": self.prompt_tokens,
                "gen_ai.usage.output_tokens": self.tokens,
                "engine.output_tokens": self.tokens,
                "engine.decode_steps": self.steps,
                "engine.kv_blocks": blocks,
                "engine.finish_reason": reason,
            },
        )
        scheduled = self.scheduled_ns or end
        record("engine.queue", inside, self.arrival_ns, scheduled, {})
        if self.first_token_ns:
            record("engine.prefill", inside, scheduled, self.first_token_ns, {})
            decode = {
                "engine.decode_steps": self.steps,
                "engine.output_tokens": self.tokens,
                "engine.longest_step_ms": self.longest_step_ns / 1e6,
            }
            record("engine.decode", inside, self.first_token_ns, self.last_token_ns, decode)
