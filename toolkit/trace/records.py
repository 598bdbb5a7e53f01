"""Spans as plain records: parsed from OTLP/HTTP bodies (JSON or protobuf), kept as JSON lines.

OTLP comes in two encodings: protobuf (most SDKs' default, and the only one Phoenix accepts) and
JSON (tritonserver's OpenTelemetry exporter, and the toolkit's own, which need no protobuf). Both are
parsed into opentelemetry-proto's ExportTraceServiceRequest (protobuf's own JSON parser; OTLP/JSON
only differs from protobuf's JSON mapping in carrying ids as hex, not base64), so a body can be
re-sent as protobuf whatever it came as. A span is then one flat record with its times in ns.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from toolkit.errors import TraceError
from toolkit.trace.provider import INSTALL_HINT

ID_FIELDS = ("traceId", "spanId", "parentSpanId")
NS_PER_MS = 1e6
TRITON_SCOPE = "triton-server"  # the instrumentation scope of tritonserver's own spans


@dataclass(frozen=True)
class SpanEvent:
    name: str
    time_ns: int
    attributes: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class SpanRecord:
    trace_id: str  # 32 hex digits
    span_id: str  # 16 hex digits
    parent_id: str  # "" for a root
    name: str
    start_ns: int
    end_ns: int
    service: str = ""
    scope: str = ""
    # The layer that made it: api or engine (our resources' toolkit.component), triton (its scope), or
    # whatever else a client's own SDK calls itself.
    component: str = ""
    kind: int = 0
    attributes: dict[str, Any] = field(default_factory=dict)
    events: tuple[SpanEvent, ...] = ()

    @property
    def duration_ms(self) -> float:
        return (self.end_ns - self.start_ns) / NS_PER_MS

    def event(self, name: str) -> SpanEvent | None:
        return next((e for e in self.events if e.name == name), None)

    def to_json(self) -> str:
        return json.dumps(asdict(self), separators=(",", ":"), default=str)

    @classmethod
    def from_dict(cls, data: dict) -> SpanRecord:
        events = tuple(SpanEvent(**e) for e in data.get("events", ()))
        return cls(**{**data, "events": events})


def _proto():
    try:
        from google.protobuf import json_format, message
        from opentelemetry.proto.collector.trace.v1 import trace_service_pb2
    except ImportError as exc:
        raise TraceError(
            f"reading OTLP needs opentelemetry-proto ({exc.name})", hint=INSTALL_HINT
        ) from exc
    return trace_service_pb2, json_format, message.DecodeError


def parse_export(body: bytes, content_type: str):
    """An OTLP/HTTP trace export body -> ExportTraceServiceRequest (protobuf message)."""
    pb2, json_format, decode_error = _proto()
    request = pb2.ExportTraceServiceRequest()
    try:
        if "json" in content_type:
            data = json.loads(body)
            _hex_ids_to_base64(data)
            json_format.ParseDict(data, request, ignore_unknown_fields=True)
        else:
            request.ParseFromString(body)
    except (ValueError, json_format.ParseError, decode_error) as exc:
        raise TraceError(f"not an OTLP trace export ({content_type}): {exc}") from exc
    return request


def _hex_ids_to_base64(node) -> None:
    if isinstance(node, dict):
        for key, value in node.items():
            if key in ID_FIELDS and isinstance(value, str):
                node[key] = base64.b64encode(bytes.fromhex(value)).decode()
            else:
                _hex_ids_to_base64(value)
    elif isinstance(node, list):
        for value in node:
            _hex_ids_to_base64(value)


def span_records(request) -> list[SpanRecord]:
    """Every span of an ExportTraceServiceRequest, with its resource's service.name and its scope."""
    out = []
    for resource_spans in request.resource_spans:
        resource = _attributes(resource_spans.resource.attributes)
        service = str(resource.get("service.name", ""))
        for scope_spans in resource_spans.scope_spans:
            scope = scope_spans.scope.name
            component = resource.get("toolkit.component") or (
                "triton" if scope == TRITON_SCOPE else service
            )
            for span in scope_spans.spans:
                out.append(_record(span, service, scope, str(component)))
    return out


def _record(span, service: str, scope: str, component: str) -> SpanRecord:
    return SpanRecord(
        trace_id=span.trace_id.hex(),
        span_id=span.span_id.hex(),
        parent_id=span.parent_span_id.hex(),
        name=span.name,
        start_ns=int(span.start_time_unix_nano),
        end_ns=int(span.end_time_unix_nano),
        service=service,
        scope=scope,
        component=component,
        kind=int(span.kind),
        attributes=_attributes(span.attributes),
        events=tuple(
            SpanEvent(e.name, int(e.time_unix_nano), _attributes(e.attributes)) for e in span.events
        ),
    )


def _attributes(pairs) -> dict[str, Any]:
    return {pair.key: _value(pair.value) for pair in pairs}


def _value(value) -> Any:
    kind = value.WhichOneof("value")
    if kind is None:
        return None
    if kind == "array_value":
        return [_value(v) for v in value.array_value.values]
    if kind == "kvlist_value":
        return _attributes(value.kvlist_value.values)
    return getattr(value, kind)


def write_jsonl(path: Path, records: Iterable[SpanRecord]) -> None:
    with open(path, "a", encoding="utf-8") as handle:
        handle.writelines(record.to_json() + "\n" for record in records)


def read_jsonl(path: Path) -> list[SpanRecord]:
    """The spans of a file `toolkit trace collect` wrote; a line cut short by a writer still at work is skipped."""
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise TraceError(
            f"cannot read spans from {path}: {exc.strerror}",
            hint="pass the file `toolkit trace collect --out` writes",
            value=str(path),
        ) from exc
    except UnicodeDecodeError as exc:
        raise TraceError(
            f"{path} is not a spans file: byte {exc.start} is not UTF-8 text",
            hint="pass the file `toolkit trace collect --out` writes (one JSON object per line)",
            value=str(path),
        ) from exc
    return list(_parsed(lines))


def _parsed(lines: list[str]) -> Iterator[SpanRecord]:
    for line in lines:
        try:
            data = json.loads(line)
        except ValueError:
            continue
        if not isinstance(data, dict):  # not a span (another tool's JSON, a list)
            continue
        try:
            yield SpanRecord.from_dict(data)
        except (ValueError, TypeError, KeyError, AttributeError):
            continue


def traces(records: Iterable[SpanRecord]) -> dict[str, list[SpanRecord]]:
    """Records grouped by trace id, each trace in start order."""
    grouped: dict[str, list[SpanRecord]] = {}
    for record in records:
        grouped.setdefault(record.trace_id, []).append(record)
    for spans in grouped.values():
        spans.sort(key=lambda s: (s.start_ns, s.end_ns))
    return grouped
