"""An OpenTelemetry tracer for one process of ours (the API, a load generator), from a TracePlan.

The SDK is imported here only, and only when tracing is on: an API that does not trace imports none
of it. Spans go out through the SDK's batch span processor (OTEL_BSP_* tune it) and the OTLP/HTTP
JSON exporter, which needs no protobuf (tritonclient pins protobuf below 5, which the SDK's protobuf
exporters of the same release refuse).
"""

from __future__ import annotations

from typing import Any

from toolkit.errors import TraceError
from toolkit.trace.config import TracePlan

INSTALL_HINT = "pip install 'toolkit[trace]' (opentelemetry-sdk and its OTLP JSON exporter)"


def make_tracer_provider(plan: TracePlan, component: str) -> Any:
    """A TracerProvider exporting to `plan.traces_url`; `component` names the layer in the resource."""
    try:
        from opentelemetry.exporter.otlp.json.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
        from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased
    except ImportError as exc:
        raise TraceError(
            f"tracing needs the OpenTelemetry SDK ({exc.name})", hint=INSTALL_HINT
        ) from exc
    # service.name from OTEL_SERVICE_NAME wins over this one; OTEL_RESOURCE_ATTRIBUTES add to it.
    resource = Resource.create({"service.name": plan.service_name, "toolkit.component": component})
    kwargs: dict[str, Any] = {"resource": resource}
    if plan.api_ratio is not None:  # else OTEL_TRACES_SAMPLER(_ARG), read by the SDK itself
        kwargs["sampler"] = ParentBased(TraceIdRatioBased(plan.api_ratio))
    provider = TracerProvider(**kwargs)
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=plan.traces_url)))
    return provider
