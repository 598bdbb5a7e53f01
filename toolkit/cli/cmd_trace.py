"""`toolkit trace`: a local OTLP receiver (and viewer), and span trees of what it received."""

from __future__ import annotations

from pathlib import Path

import click

from toolkit.cli.options import host_option, port_option
from toolkit.cli.render import note
from toolkit.errors import TraceError
from toolkit.subprocs import stop_process
from toolkit.trace.config import http_url
from toolkit.trace.receiver import SpanReceiver
from toolkit.trace.records import read_jsonl, traces
from toolkit.trace.tree import format_trace


@click.group("trace")
def command() -> None:
    """Collect the stack's OpenTelemetry traces locally and print them as span trees."""


@command.command("collect")
@host_option("Address to listen on.")
@port_option("-p", "--port", default=4318, help="OTLP/HTTP port.")
@click.option(
    "-o",
    "--out",
    type=click.Path(path_type=Path, dir_okay=False),
    default=Path("spans.jsonl"),
    help="Spans are appended here, one JSON object per line.",
)
@click.option(
    "--forward",
    default=None,
    help="Also send every batch, as OTLP/HTTP protobuf, to this traces URL (e.g. a collector).",
)
@click.option(
    "--phoenix",
    "phoenix",
    default=None,
    help="Start Arize Phoenix (this executable, from its own venv) as the viewer and forward to it.",
)
@port_option("--phoenix-port", default=6006, help="Phoenix's UI port.")
def collect(host, port, out, forward, phoenix, phoenix_port):
    """Receive OTLP/HTTP traces (JSON or protobuf) until Ctrl-C; point the stack at it with
    OTEL_EXPORTER_OTLP_ENDPOINT=http://HOST:PORT."""
    _check_out(out)
    if forward:
        forward = http_url(forward, "--forward")
    viewer = None
    if phoenix:
        from toolkit.serve.phoenix import plan_phoenix, start_phoenix

        plan = plan_phoenix(phoenix, host, phoenix_port)
        note(f"starting Phoenix on {plan.ui_url} ...")
        viewer, log = start_phoenix(plan)
        forward = forward or plan.traces_url
        note(f"Phoenix: {plan.ui_url} (log {log})")

    def said(records) -> None:
        roots = sum(1 for r in records if not r.parent_id)
        note(f"{len(records)} spans ({roots} new traces)")

    try:
        receiver = SpanReceiver(
            out, host=host, port=port, forward=forward, keep=False, on_spans=said
        )
        note(
            f"receiving OTLP/HTTP traces on {receiver.url}/v1/traces -> {out}"
            + (f", forwarding to {forward}" if forward else "")
        )
        note(
            f"export to it with: --otlp-endpoint {receiver.url} (or OTEL_EXPORTER_OTLP_ENDPOINT="
            f"{receiver.url}): the base URL, /v1/traces is appended"
        )
        try:
            receiver.serve_forever()
        except KeyboardInterrupt:
            pass
        finally:
            receiver.close()
    finally:
        if viewer is not None:
            stop_process(viewer, 10)


@command.command("show")
@click.argument("spans", type=click.Path(path_type=Path, dir_okay=False, exists=True))
@click.option(
    "--trace-id",
    default=None,
    callback=lambda _ctx, _param, value: _trace_id(value),
    help="Only this trace (its 32 hex digits, or a prefix).",
)
@click.option("-n", "--last", type=click.IntRange(min=1), default=5, help="The last N traces.")
def show(spans, trace_id, last):
    """Print the span trees of the traces in SPANS (a file `toolkit trace collect` wrote)."""
    records = read_jsonl(spans)
    if not records:
        raise TraceError(
            f"no span in {spans}: it is empty, or no line of it is a span as `toolkit trace collect` "
            "writes them",
            hint="pass the file `toolkit trace collect --out` writes, once the stack has exported to it",
            value=str(spans),
        )
    grouped = traces(records)
    chosen = [spans for tid, spans in grouped.items() if tid.startswith(trace_id or "")]
    chosen.sort(key=lambda group: group[0].start_ns)
    if not chosen:
        raise TraceError(
            f"no trace {trace_id} in {spans} ({len(grouped)} trace(s) there)",
            hint="pass another --trace-id (toolkit trace show without it lists the last ones)",
        )
    for group in chosen[-last:]:
        click.echo("\n".join(format_trace(group)))


def _trace_id(value: str | None) -> str | None:
    """--trace-id: hex digits (any case), 1 to 32 of them."""
    if value is None:
        return None
    wanted = value.strip().lower()
    if not wanted or len(wanted) > 32 or any(c not in "0123456789abcdef" for c in wanted):
        raise click.BadParameter(
            f"{value!r} is not a trace id: 1 to 32 hex digits (a prefix of the 32 `toolkit trace show` "
            "prints)"
        )
    return wanted


def _check_out(out: Path) -> None:
    """--out must be a file this process can append to, said before it listens (else every batch
    failed with a traceback and its spans were lost)."""
    if out.is_dir() or not out.name:
        raise TraceError(
            f"--out {out} is a folder",
            hint="pass a file name, e.g. --out spans.jsonl",
            value=str(out),
        )
    try:
        with out.open("a", encoding="utf-8"):
            pass
    except OSError as exc:
        raise TraceError(
            f"cannot write spans to {out}: {exc.strerror}",
            hint="pass a file in a folder that exists and that you can write to",
            value=str(out),
        ) from exc
