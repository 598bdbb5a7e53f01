"""Span trees as text: one line per span, indented under its parent, with its offset and duration."""

from __future__ import annotations

from toolkit.trace.records import NS_PER_MS, SpanRecord

# Attributes worth a place on a span's line (the rest are in the JSON lines).
SHOWN_ATTRIBUTES = (
    "gen_ai.usage.input_tokens",
    "gen_ai.usage.output_tokens",
    "gen_ai.response.finish_reasons",
    "http.response.status_code",
    "triton.model_name",
    "toolkit.tokens",
    "toolkit.chunks",
    "engine.output_tokens",
    "engine.decode_steps",
    "engine.kv_blocks",
)


def format_trace(spans: list[SpanRecord]) -> list[str]:
    """The lines of one trace's tree; spans whose parent is not in the trace are roots."""
    ids = {span.span_id for span in spans}
    children: dict[str, list[SpanRecord]] = {}
    for span in spans:
        parent = span.parent_id if span.parent_id in ids else ""
        children.setdefault(parent, []).append(span)
    for group in children.values():
        group.sort(key=lambda s: (s.start_ns, -s.end_ns))
    start = min(span.start_ns for span in spans)
    end = max(span.end_ns for span in spans)
    lines = [f"trace {spans[0].trace_id}  {len(spans)} spans, {(end - start) / NS_PER_MS:.2f} ms"]
    lines += _subtree(children, "", start, 1)
    return lines


def _subtree(children: dict[str, list[SpanRecord]], parent: str, t0: int, depth: int) -> list[str]:
    lines = []
    for span in children.get(parent, []):
        lines.append("  " * depth + _line(span, t0))
        lines += _subtree(children, span.span_id, t0, depth + 1)
    return lines


def _line(span: SpanRecord, t0: int) -> str:
    shown = [
        f"{key.rsplit('.', 1)[-1]}={span.attributes[key]}"
        for key in SHOWN_ATTRIBUTES
        if key in span.attributes
    ]
    where = f" [{span.component}]" if span.component else ""
    extra = f"  {' '.join(shown)}" if shown else ""
    offset = (span.start_ns - t0) / NS_PER_MS
    return f"{span.name}{where}  +{offset:.2f} ms  {span.duration_ms:.2f} ms{extra}"
