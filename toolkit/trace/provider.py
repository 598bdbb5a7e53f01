"""An OpenTelemetry tracer for one process of ours (the API, a load generator), from a TracePlan.

The SDK is imported here only, and only when tracing is on: an API that does not trace imports none
of it. Spans go out through the SDK's batch span processor (OTEL_BSP_* tune it) and the OTLP/HTTP
JSON exporter, which needs no protobuf (tritonclient pins protobuf below 5, which the SDK's protobuf
exporters of the same release refuse).
"""

from __future__ import annotations

import logging
import sys
from typing import Any

from toolkit.errors import TraceError
from toolkit.trace.config import TracePlan

# The GIL switch interval of a process that traces (CPython's default is 5 ms). The recorder's thread
# builds spans and the batch span processor's thread encodes them (~20-40 us a span,
# perf/results/trace_cost.md) while the event loop wants the GIL back, and each such wait can last the
# whole interval. In an A/B on 2 cores (not committed, noisy), with the spans still built on the loop,
# TTFT p50 added at 16 streams read ~4 ms at 5 ms and 1-2 ms at 0.5 ms.
SWITCH_INTERVAL_S = 0.0005


def shorten_switch_interval() -> None:
    """Bound how long a tracing thread can keep the GIL from the loop that serves requests."""
    sys.setswitchinterval(min(sys.getswitchinterval(), SWITCH_INTERVAL_S))


log = logging.getLogger(__name__)

INSTALL_HINT = "pip install 'toolkit[trace]' (opentelemetry-sdk and its OTLP JSON exporter)"


def make_tracer_provider(plan: TracePlan, component: str) -> tuple[Any, Any]:
    """A TracerProvider exporting to `plan.traces_url`, and the span processor every span it ends goes
    through (SpanRecorder hands its spans to it); `component` names the layer in the resource."""
    try:
        from opentelemetry.exporter.otlp.json.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import SynchronousMultiSpanProcessor, TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
        from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased
    except ImportError as exc:
        raise TraceError(
            f"tracing needs the OpenTelemetry SDK ({exc.name})", hint=INSTALL_HINT
        ) from exc
    # service.name from OTEL_SERVICE_NAME wins over this one; OTEL_RESOURCE_ATTRIBUTES add to it.
    resource = Resource.create({"service.name": plan.service_name, "toolkit.component": component})
    processor = SynchronousMultiSpanProcessor()  # add_span_processor adds to it
    kwargs: dict[str, Any] = {"resource": resource, "active_span_processor": processor}
    if plan.api_ratio is not None:  # else OTEL_TRACES_SAMPLER(_ARG), read by the SDK itself
        kwargs["sampler"] = ParentBased(TraceIdRatioBased(plan.api_ratio))
    provider = TracerProvider(**kwargs)
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=plan.traces_url)))
    shorten_switch_interval()
    return provider, processor


class SpanRecorder:
    """Spans that are over by the time they are made, from time stamps taken earlier: each a ReadableSpan,
    handed to the provider's span processors as the SDK hands them a span that ended, with no sampler,
    attribute limits or locks (half the CPU of SDK spans, perf/results/trace_cost.md).

    And made later, off the thread that serves: `later(item)` queues anything with a `build(recorder)`
    (~1 us), and a thread of the recorder's own builds what is queued every BUILD_INTERVAL_S. The 16
    requests that end in one engine step end just as their next requests arrive: building their spans
    there, on the event loop, held those requests up (perf/results/api_front_end_tracing.md)."""

    BUILD_INTERVAL_S = 0.1

    def __init__(self, provider: Any, processor: Any, scope: str, version: str):
        import collections
        import threading

        from opentelemetry.sdk.trace import Event, ReadableSpan
        from opentelemetry.sdk.util.instrumentation import InstrumentationScope
        from opentelemetry.trace import SpanContext, SpanKind, TraceFlags

        self._span, self._context, self.event = ReadableSpan, SpanContext, Event
        self.internal, self.server, self.client = (
            SpanKind.INTERNAL,
            SpanKind.SERVER,
            SpanKind.CLIENT,
        )
        self.sampled = TraceFlags(TraceFlags.SAMPLED)
        self.processor = processor
        self.ids = provider.id_generator
        self.resource = provider.resource
        self.scope = InstrumentationScope(scope, version)
        self._queued: collections.deque = collections.deque()
        self._stop = threading.Event()
        self._builder = threading.Thread(
            target=self._build_queued, name=f"{scope}-spans", daemon=True
        )
        self._builder.start()

    def context(self, trace_id: int, trace_state: Any = None) -> Any:
        """A new span's SpanContext in trace `trace_id` (sampled: only sampled traces are recorded)."""
        return self._context(
            trace_id,
            self.ids.generate_span_id(),
            is_remote=False,
            trace_flags=self.sampled,
            trace_state=trace_state,
        )

    def record(
        self,
        name: str,
        parent: Any,
        start_ns: int,
        end_ns: int,
        attributes: dict | None = None,
        *,
        context: Any = None,
        kind: Any = None,
        events: tuple = (),
    ) -> Any:
        """A finished span under `parent` (a SpanContext, or None for a trace's root), as `context` (a
        SpanContext from `context()`) or a new child context of `parent`; its SpanContext."""
        if context is None:
            context = self.context(parent.trace_id, parent.trace_state)
        span = self._span(
            name=name,
            context=context,
            parent=parent,
            resource=self.resource,
            attributes=attributes or {},
            events=events,
            kind=kind or self.internal,
            start_time=start_ns,
            end_time=max(start_ns, end_ns),
            instrumentation_scope=self.scope,
        )
        self.processor.on_end(span)
        return context

    def later(self, item: Any) -> None:
        """Queue `item` for the builder thread, which calls `item.build(self)`."""
        self._queued.append(item)

    def build_queued(self) -> None:
        """Build what is queued now (the builder thread does so every BUILD_INTERVAL_S)."""
        queued = self._queued
        while queued:
            item = queued.popleft()
            try:
                item.build(self)
            except Exception:  # noqa: BLE001 - one broken trace must not end tracing of the rest
                log.exception("could not build the spans of %r", item)

    def _build_queued(self) -> None:
        while not self._stop.wait(self.BUILD_INTERVAL_S):
            self.build_queued()

    def stop_builder(self) -> None:
        """Stop the builder thread; what is queued then waits for build_queued()."""
        self._stop.set()
        self._builder.join(5)

    def shutdown(self) -> None:
        """Stop the builder and build what it left queued (then shut the provider down: it exports)."""
        self.stop_builder()
        self.build_queued()
