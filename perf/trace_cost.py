"""What one traced request costs the API process in CPU, span by span (in-process, no server).

The API's tracer (toolkit.api.tracing.ApiTracer, exporting to a sink in its own process, as
perf/api_front_end.py's) traces --requests requests of --chunks chunks each, and times, per request:

  start + call   the sampler's decision, the root's and the gRPC call's span ids, the traceparent
                 (the serving thread, on the request's critical path: before the call goes to Triton)
  end            the stamps queued for the recorder's thread (the serving thread)
  build          the seven spans made from the request's stamps, as the recorder's thread makes them
                 (SpanRecorder: ReadableSpans handed to the span processors), and, measured in the
                 same run as the baseline, as SDK spans (start_span + end: what the API's event loop
                 did before; here both run on the benchmark's thread, every other request)
  encode         the OTLP/JSON exporter's encoding of one request's spans (encode_spans + to_json),
                 which the batch span processor's thread does

The two ways of building alternate; medians over all requests. Writes --out .json and .md:

    python perf/trace_cost.py --out perf/results/trace_cost
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from api_front_end import Collector  # noqa: E402
from bench_support import run_meta, write_results_json  # noqa: E402

from toolkit.api.tracing import ApiTracer, RequestTrace  # noqa: E402
from toolkit.trace.config import TracePlan  # noqa: E402

SCOPE = {"method": "POST", "path": "/v1/chat/completions", "headers": []}


def traced_request(tracer: ApiTracer, chunks: int) -> RequestTrace:
    """A request's trace with its stamps taken as the API takes them; (start + call) ns in `.cost`."""
    begin = time.perf_counter_ns()
    trace = tracer.start(SCOPE, time.time_ns(), time.time_ns())
    assert trace is not None, "the benchmark's tracer samples every request"
    trace.tokenized(time.time_ns(), time.time_ns())
    trace.call("tensorrt_llm")
    trace.cost = time.perf_counter_ns() - begin  # type: ignore[attr-defined]
    trace.response(time.time_ns())
    for _ in range(chunks):
        trace.wrote(1)
    trace.usage(12, chunks, "length")
    return trace


def build_with_sdk_spans(trace: RequestTrace) -> None:
    """The baseline: the same spans, each made with the SDK's start_span and end."""
    from opentelemetry import trace as otel

    tracer = trace.tracer.provider.get_tracer("toolkit.api")
    sent_ns = trace.calls[0][0]

    def span(name, parent, start, end, attributes=None, **kwargs):
        made = tracer.start_span(
            name, context=parent, start_time=start, attributes=attributes, **kwargs
        )
        made.end(end_time=max(start, end))
        return made

    root = tracer.start_span(trace.name, start_time=trace.received_ns, attributes=trace.attributes)
    parent = otel.set_span_in_context(root)
    span("api.receive", parent, trace.received_ns, trace.read_ns)
    admission = span("api.admission", parent, trace.read_ns, sent_ns)
    span("api.tokenize", otel.set_span_in_context(admission), *trace.tokenize)
    span("api.generate", parent, sent_ns, trace.last_response_ns, {"rpc.system": "grpc"})
    span("api.first_chunk", parent, trace.first_response_ns, trace.first_write_ns)
    offsets = [(at - trace.first_write_ns) // 1000 for at, _ in trace.chunks]
    span(
        "api.stream",
        parent,
        trace.first_write_ns,
        trace.last_write_ns,
        {
            "toolkit.chunks": len(trace.chunks),
            "toolkit.tokens": sum(count for _, count in trace.chunks),
            "toolkit.detokenize_us": 0,
            "toolkit.chunk_offsets_us": " ".join(map(str, offsets)),
            "toolkit.longest_chunk_gap_ms": 0.0,
        },
    )
    root.set_attribute("http.response.status_code", trace.status)
    root.add_event("first_token", timestamp=trace.first_write_ns)
    root.end(end_time=trace.end_ns)


def encode_cost(url: str, requests: int, chunks: int) -> tuple[float, int]:
    """Median us to encode one request's spans as the OTLP/JSON exporter does, and spans per request."""
    from opentelemetry.exporter.otlp.json.common.trace_encoder import encode_spans
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    tracer = ApiTracer(TracePlan(url, 1.0, "perf"))
    memory = InMemorySpanExporter()
    tracer.provider.add_span_processor(SimpleSpanProcessor(memory))
    times, count = [], 0
    for _ in range(requests):
        memory.clear()
        traced_request(tracer, chunks).end(200)
        tracer.recorder.build_queued()
        spans = memory.get_finished_spans()
        count = len(spans)
        begin = time.perf_counter_ns()
        encode_spans(spans).to_json()
        times.append(time.perf_counter_ns() - begin)
    tracer.shutdown()
    return statistics.median(times) / 1000, count


def run(args) -> dict:
    """Per request: start + call and end on the serving thread; every other request's spans built
    right here instead of by the recorder's thread, as toolkit builds them or (alternating) with
    SDK spans."""
    work = Path(tempfile.mkdtemp(prefix="trace-cost-"))
    with Collector(work, "sink") as sink:
        tracer = ApiTracer(TracePlan(f"{sink.url}/v1/traces", 1.0, "perf"))
        opened, ended, recorded, sdk = [], [], [], []
        for index in range(args.requests):
            trace = traced_request(tracer, args.chunks)
            opened.append(trace.cost)  # type: ignore[attr-defined]
            if index % 2 == 0:
                begin = time.perf_counter_ns()
                trace.end(200)  # queued: the recorder's thread builds it
                ended.append(time.perf_counter_ns() - begin)
                continue
            trace.end_ns, trace.status = time.time_ns(), 200
            begin = time.perf_counter_ns()
            if index % 4 == 1:
                trace.build(tracer.recorder)
                recorded.append(time.perf_counter_ns() - begin)
            else:
                build_with_sdk_spans(trace)
                sdk.append(time.perf_counter_ns() - begin)
        tracer.shutdown()
        received = sink.received()
        encode_us, spans = encode_cost(
            f"{sink.url}/v1/traces", min(args.requests, 500), args.chunks
        )
    recorded_us, sdk_us = statistics.median(recorded) / 1000, statistics.median(sdk) / 1000
    start_us, end_us = statistics.median(opened) / 1000, statistics.median(ended) / 1000
    return {
        "spans_per_request": spans,
        "start_and_call_us": round(start_us, 1),
        "end_us": round(end_us, 2),
        "serving_thread_us": round(start_us + end_us, 1),
        "build_recorded_us": round(recorded_us, 1),
        "build_sdk_spans_us": round(sdk_us, 1),
        "build_recorded_over_sdk": round(recorded_us / sdk_us, 3),
        "encode_us_per_request": round(encode_us, 1),
        "encode_us_per_span": round(encode_us / spans, 1),
        "received_by_sink": received,
    }


def write(args, results: dict) -> None:
    meta = run_meta(requests=args.requests, chunks=args.chunks)
    out = write_results_json(args.out, meta, results)
    r = results
    out.with_suffix(".md").write_text(
        "\n".join(
            [
                "# What one traced request costs the API process in CPU",
                "",
                f"`{meta['command']}`",
                "",
                f"{meta['date']}; {meta['machine']['cpus']} CPUs, 1-min load "
                f"{meta['machine']['load_1min']} at the end; medians of {args.requests} requests "
                f"({args.chunks} chunks each), the two ways of building spans alternating on every other one.",
                "",
                "| per request | us | on |",
                "|---|---|---|",
                f"| sampled, span ids chosen, traceparent made (start + call, before the call) | "
                f"{r['start_and_call_us']} | the serving thread |",
                f"| stamps queued for the recorder (end) | {r['end_us']} | the serving thread |",
                f"| spans built, SpanRecorder (toolkit) | {r['build_recorded_us']} | the recorder's "
                "thread |",
                f"| spans built, SDK start_span + end (baseline, same run) | "
                f"{r['build_sdk_spans_us']} | (the serving thread, before) |",
                f"| OTLP/JSON encoding of its {r['spans_per_request']} spans | "
                f"{r['encode_us_per_request']} ({r['encode_us_per_span']} a span) | the exporter's "
                "thread |",
                "",
                f"The serving thread: **{r['serving_thread_us']} us** a request. SpanRecorder / SDK "
                f"spans: **{r['build_recorded_over_sdk']}x** the CPU of building a request's spans. "
                f"Exported to the sink meanwhile: {r['received_by_sink']}.",
                "",
            ]
        )
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=4000)
    parser.add_argument("--chunks", type=int, default=64)
    parser.add_argument("--out", default="perf/results/trace_cost")
    args = parser.parse_args()
    write(args, run(args))
    print(Path(args.out).with_suffix(".md").read_text())


if __name__ == "__main__":
    main()
