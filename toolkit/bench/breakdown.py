"""Where time to first token and inter-token time went, layer by layer, from one run's traces.

Each request is a client record (when it was sent, when each chunk with text arrived: ns since the
epoch) and its trace: the API's spans (toolkit.api.tracing), Triton's, and the engine's
(model_repo/common/tracing.py). Its TTFT is cut at the stamps those spans share, so the parts add
up to the TTFT the client saw:

    client sent -> API received                     network
    API received -> its gRPC call                   api (body read, validation, tokenize)
    gRPC call -> the engine has the request         triton (gRPC, Triton's queue, into the model)
    engine has it -> first step it runs in          engine_queue (waiting for a batch slot)
    that step -> its first token                    prefill
    first token -> the API has it                   triton (the response's way back)
    the API has it -> written to the client         api, less detokenize
    written -> the client has it                    network

Inter-token time (per request: first to last chunk over tokens - 1) is the engine's decode time per
token plus how much each layer's lag grew from the first token to the last:

    decode    (engine's last token - its first) / (tokens - 1)
    triton    growth of engine -> API receipt
    api       growth of API receipt -> written to the client
    network   growth of written -> the client has it

Without engine spans (the GPU's tensorrtllm backend emits none) the engine and Triton are one layer,
`engine` in TTFT and `decode` in inter-token time. Per percentile p the parts are the means over the
requests whose total lies around p (the p-2.5 .. p+2.5 ranks, at least one request).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field

from toolkit.client.sse import TimedStream
from toolkit.trace.records import NS_PER_MS, SpanRecord

TTFT_LAYERS = ("network", "api", "detokenize", "triton", "engine_queue", "prefill", "engine")
ITL_LAYERS = ("network", "api", "triton", "decode")
PERCENTILES = (50, 90, 99)
WINDOW = 2.5  # percentile ranks on each side of p


@dataclass(frozen=True)
class RequestBreakdown:
    trace_id: str
    ttft_ms: float
    ttft: dict[str, float]
    itl_ms: float | None
    itl: dict[str, float] | None
    engine_spans: bool


@dataclass(frozen=True)
class PercentileBreakdown:
    percentile: int
    total_ms: float
    layers: dict[str, float]
    dominant: str
    requests: int  # the requests averaged


@dataclass(frozen=True)
class PointBreakdown:
    """One load point: TTFT and inter-token time per percentile, and which layer dominates each."""

    requests: int  # with a whole trace
    untraced: int  # requests whose spans did not all arrive (left out)
    ttft: tuple[PercentileBreakdown, ...]
    itl: tuple[PercentileBreakdown, ...]
    engine_step_ms: float | None = None  # from the engine's iteration counter, when it reports one
    notes: tuple[str, ...] = field(default_factory=tuple)

    @property
    def dominant_ttft(self) -> str:
        return self.ttft[0].dominant if self.ttft else ""

    @property
    def dominant_itl(self) -> str:
        return self.itl[0].dominant if self.itl else ""

    def to_dict(self) -> dict:
        data = asdict(self)
        data.update(dominant_ttft=self.dominant_ttft, dominant_itl=self.dominant_itl)
        return data


class _Spans:
    """A trace's spans by name (the first of each name)."""

    def __init__(self, spans: Sequence[SpanRecord]):
        self.by_name: dict[str, SpanRecord] = {}
        for span in spans:
            self.by_name.setdefault(span.name, span)
        self.root = next((s for s in spans if s.component == "api" and " /v1/" in s.name), None)

    def get(self, name: str) -> SpanRecord | None:
        return self.by_name.get(name)


API_SPANS = ("api.generate", "api.first_chunk", "api.stream")
ENGINE_SPANS = ("engine.request", "engine.queue", "engine.prefill", "engine.decode")


def whole(spans: Sequence[SpanRecord], engine: bool = True) -> bool:
    """Whether a trace holds what the breakdown reads (the engine's spans too, when `engine`)."""
    found = _Spans(spans)
    names = API_SPANS + (ENGINE_SPANS if engine else ())
    return found.root is not None and all(found.get(n) for n in names)


def request_breakdown(
    client: TimedStream, trace_id: str, spans: Sequence[SpanRecord]
) -> RequestBreakdown | None:
    """One request's parts; None when its trace lacks the API's spans or the client got no text."""
    found = _Spans(spans)
    root = found.root
    call, first, stream = (found.get(n) for n in API_SPANS)
    if root is None or call is None or first is None or stream is None or not client.chunk_ns:
        return None
    tokens = client.completion_tokens or int(stream.attributes.get("toolkit.tokens", 0))
    detokenize = _detokenize_ms(stream, tokens)
    first_ns = client.chunk_ns[0]
    ttft = {
        "network": _ms(root.start_ns - client.start_ns) + _ms(first_ns - first.end_ns),
        "api": _ms(call.start_ns - root.start_ns) + max(0.0, first.duration_ms - detokenize),
        "detokenize": min(detokenize, first.duration_ms),
    }
    engine = all(found.get(n) for n in ENGINE_SPANS)
    if engine:
        request, queue, prefill, decode = (found.by_name[n] for n in ENGINE_SPANS)
        ttft["triton"] = _ms(request.start_ns - call.start_ns) + _ms(
            first.start_ns - decode.start_ns
        )
        ttft["engine_queue"] = _ms(queue.end_ns - request.start_ns)
        ttft["prefill"] = _ms(decode.start_ns - queue.end_ns)
    else:
        ttft["engine"] = _ms(first.start_ns - call.start_ns)
    itl = None
    itl_ms = None
    if tokens > 1 and len(client.chunk_ns) > 1:
        steps = tokens - 1
        itl_ms = _ms(client.chunk_ns[-1] - first_ns) / steps
        api_lag = _ms(stream.end_ns - call.end_ns) - first.duration_ms
        net_lag = _ms(client.chunk_ns[-1] - stream.end_ns) - _ms(first_ns - first.end_ns)
        itl = {"network": net_lag / steps, "api": api_lag / steps}
        if engine:
            decode = found.by_name["engine.decode"]
            itl["decode"] = decode.duration_ms / steps
            triton_lag = _ms(call.end_ns - decode.end_ns) - _ms(first.start_ns - decode.start_ns)
            itl["triton"] = triton_lag / steps
        else:
            itl["decode"] = _ms(call.end_ns - first.start_ns) / steps
    return RequestBreakdown(trace_id, _ms(first_ns - client.start_ns), ttft, itl_ms, itl, engine)


def _detokenize_ms(stream: SpanRecord, tokens: int) -> float:
    """The API's detokenizing time for one response: its total over the stream, per token."""
    total_us = float(stream.attributes.get("toolkit.detokenize_us", 0) or 0)
    return total_us / 1000 / max(1, tokens)


def _ms(ns: int) -> float:
    return ns / NS_PER_MS


def point_breakdown(
    requests: Sequence[RequestBreakdown], untraced: int, engine_step_ms: float | None = None
) -> PointBreakdown:
    ttft = [(r.ttft_ms, r.ttft) for r in requests]
    itl = [(r.itl_ms, r.itl) for r in requests if r.itl_ms is not None and r.itl is not None]
    notes = []
    if requests and not all(r.engine_spans for r in requests):
        notes.append(
            "no engine spans (the engine emits none): Triton and the engine are one layer, "
            "`engine` in TTFT and `decode` in inter-token time"
        )
    return PointBreakdown(
        requests=len(requests),
        untraced=untraced,
        ttft=tuple(_percentiles(ttft, TTFT_LAYERS)),
        itl=tuple(_percentiles(itl, ITL_LAYERS)),
        engine_step_ms=engine_step_ms,
        notes=tuple(notes),
    )


def _percentiles(
    rows: list[tuple[float, dict[str, float]]], order: tuple[str, ...]
) -> list[PercentileBreakdown]:
    if not rows:
        return []
    rows = sorted(rows, key=lambda row: row[0])
    out = []
    for p in PERCENTILES:
        low = int((p - WINDOW) / 100 * len(rows))
        high = max(low + 1, int(-(-(p + WINDOW) / 100 * len(rows) // 1)))
        window = rows[max(0, min(low, len(rows) - 1)) : min(high, len(rows))]
        layers = {
            name: sum(parts.get(name, 0.0) for _, parts in window) / len(window)
            for name in order
            if any(name in parts for _, parts in window)
        }
        total = sum(total for total, _ in window) / len(window)
        dominant = max(layers, key=lambda name: layers[name])
        out.append(PercentileBreakdown(p, total, layers, dominant, len(window)))
    return out
