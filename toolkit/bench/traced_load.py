"""`toolkit bench --breakdown`: the load goes through the OpenAI API, each request in a trace of its own.

Every request carries a sampled W3C `traceparent` of its own (the client is the trace's root), so the
API, tritonserver and the engine trace exactly these requests and their spans can be found by trace
id. The client times each request as perf_analyzer would (sent, each chunk with text, usage from the
last chunk), so the point's TTFT, ITL and tokens/s keep GenAI-Perf's definitions
(toolkit.bench.metrics), and the spans say where each request's time went (toolkit.bench.breakdown).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import secrets
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import httpx

from toolkit.bench.breakdown import PointBreakdown, point_breakdown, request_breakdown, whole
from toolkit.bench.metrics import Experiment, RequestRecord
from toolkit.client.sse import LeanStreamClient, SseProtocolError, TimedStream
from toolkit.errors import BenchError
from toolkit.trace.records import SpanRecord, read_jsonl, traces

SpanSource = Callable[[], list[SpanRecord]]
# Spans leave each process in batches (the SDKs' default: every 5 s; Triton's, as toolkit serve
# starts it: every 1 s): how long to wait for a point's spans once its last request has ended.
SPANS_WAIT_S = 20.0
# When the API's spans are all in but no trace has engine spans this long after: the engine emits
# none (the GPU's tensorrtllm backend); the breakdown goes on without them.
ENGINE_SPANS_GRACE_S = 6.0
POLL_S = 0.25


@dataclass(frozen=True)
class TracedRequest:
    trace_id: str
    stream: TimedStream


def served_model(api_url: str) -> str:
    """The model id the API serves (its /v1/models), which also checks that it answers."""
    try:
        response = httpx.get(f"{api_url}/v1/models", timeout=10)
        response.raise_for_status()
        return str(response.json()["data"][0]["id"])
    except (httpx.HTTPError, KeyError, IndexError, ValueError) as exc:
        raise BenchError(
            f"the OpenAI API at {api_url} does not answer /v1/models ({exc})",
            hint="pass --api-url the API's base URL (toolkit serve --openai-port), e.g. http://127.0.0.1:9000",
            value=api_url,
        ) from exc


def run_traced_load(
    api_url: str,
    model: str,
    prompts: tuple[str, ...],
    output_tokens: int,
    concurrency: int,
    requests: int,
    timeout_s: float = 600.0,
) -> list[TracedRequest]:
    """`requests` streamed completions, `concurrency` at a time, each exactly `output_tokens` long; the
    point fails after `timeout_s` (bench's --timeout), an API that stops answering included."""
    load = _load(api_url, model, prompts, output_tokens, concurrency, requests)
    try:
        return asyncio.run(asyncio.wait_for(load, timeout_s))
    except asyncio.TimeoutError as exc:  # TimeoutError itself from 3.11 on
        raise BenchError(
            f"the point did not finish within {timeout_s:g} s: the OpenAI API at {api_url} stopped "
            "answering, or the load is more than it carries in that time",
            hint="check the API's log and /health; lower the load, or raise --timeout",
            value=timeout_s,
        ) from exc


async def _load(api_url, model, prompts, output_tokens, concurrency, requests):
    clients = [
        LeanStreamClient(api_url, "/v1/completions", _body(model, prompt, output_tokens))
        for prompt in prompts
    ]
    numbers = itertools.count()
    done: list[TracedRequest] = []

    async def worker() -> None:
        while (index := next(numbers)) < requests:
            trace_id = secrets.token_hex(16)
            header = f"00-{trace_id}-{secrets.token_hex(8)}-01"
            stream = await clients[index % len(clients)].stream_timed({"traceparent": header})
            done.append(TracedRequest(trace_id, stream))

    try:
        await asyncio.gather(*(worker() for _ in range(concurrency)))
    except (OSError, SseProtocolError, ValueError) as exc:
        raise BenchError(
            f"a request to the OpenAI API at {api_url} failed: {exc}",
            hint="check the API's log; lower the load, or raise its --max-in-flight",
        ) from exc
    finally:
        for client in clients:
            client.close()
    return done


def _body(model: str, prompt: str, output_tokens: int) -> dict:
    # min_tokens = max_tokens: exactly that many tokens, whatever the end token says (as bench forces
    # perf_analyzer's requests).
    return {
        "model": model,
        "prompt": prompt,
        "max_tokens": output_tokens,
        "min_tokens": output_tokens,
        "stream": True,
        "stream_options": {"include_usage": True},
    }


def experiment(value: float, done: list[TracedRequest]) -> Experiment:
    """The point as the metrics read a perf_analyzer export: one record per request with text."""
    records = tuple(
        RequestRecord(r.stream.start_ns, r.stream.chunk_ns, r.stream.completion_tokens)
        for r in done
        if r.stream.chunk_ns
    )
    return Experiment("concurrency", value, records)


def write_client_records(path: Path, done: list[TracedRequest]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps([asdict(r) for r in done]))
    return path


def file_spans(path: Path) -> SpanSource:
    """Spans from a file `toolkit trace collect` appends to, read again at every poll."""
    return lambda: read_jsonl(path) if path.is_file() else []


def breakdown_of(
    done: list[TracedRequest], spans: SpanSource, engine_step_ms: float | None = None
) -> PointBreakdown:
    """Wait for the requests' spans, then break each request down and the point per percentile."""
    grouped = _wait_for_traces({r.trace_id for r in done}, spans)
    parts = []
    for request in done:
        found = request_breakdown(
            request.stream, request.trace_id, grouped.get(request.trace_id, [])
        )
        if found is not None:
            parts.append(found)
    return point_breakdown(parts, len(done) - len(parts), engine_step_ms)


def _wait_for_traces(ids: set[str], spans: SpanSource) -> dict[str, list[SpanRecord]]:
    deadline = time.monotonic() + SPANS_WAIT_S
    api_done_at = None
    while True:
        grouped = {tid: found for tid, found in traces(spans()).items() if tid in ids}
        api_whole = all(whole(grouped.get(tid, []), engine=False) for tid in ids)
        if all(whole(grouped.get(tid, [])) for tid in ids):
            return grouped
        now = time.monotonic()
        if api_whole:
            api_done_at = api_done_at or now
            no_engine = not any(whole(g) for g in grouped.values())
            if no_engine and now - api_done_at > ENGINE_SPANS_GRACE_S:
                return grouped
        if now > deadline:
            return grouped
        time.sleep(POLL_S)
