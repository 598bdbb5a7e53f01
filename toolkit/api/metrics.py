"""Prometheus metrics of the API, in a registry of its own (several apps can live in one process)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

# Seconds. TTFT spans a cold CPU prefill (seconds) down to a warm GPU one (milliseconds).
TTFT_BUCKETS = (
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.075,
    0.1,
    0.15,
    0.25,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
)
ITL_BUCKETS = (
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.015,
    0.02,
    0.03,
    0.05,
    0.075,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
)


class ApiMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.requests = Counter(
            "toolkit_api_requests",
            "HTTP requests answered, by endpoint and status code",
            ["endpoint", "status"],
            registry=r,
        )
        self.prompt_tokens = Counter(
            "toolkit_api_prompt_tokens", "Prompt tokens of answered generation requests", registry=r
        )
        self.completion_tokens = Counter(
            "toolkit_api_completion_tokens", "Tokens generated for API requests", registry=r
        )
        self.ttft = Histogram(
            "toolkit_api_time_to_first_token_seconds",
            "Request arrival to first generated text",
            buckets=TTFT_BUCKETS,
            registry=r,
        )
        # TTFT's two halves: our own work before Triton sees the request, and the engine's wait to its first token.
        self.admission = Histogram(
            "toolkit_api_admission_seconds",
            "Request arrival to its gRPC call to Triton (HTTP parsing, validation, tokenization, event-loop waits)",
            buckets=ITL_BUCKETS,
            registry=r,
        )
        self.engine_first = Histogram(
            "toolkit_api_engine_first_response_seconds",
            "gRPC call to Triton to the engine's first generated token",
            buckets=TTFT_BUCKETS,
            registry=r,
        )
        self.itl = Histogram(
            "toolkit_api_inter_token_latency_seconds",
            "Time between generated tokens of one request",
            buckets=ITL_BUCKETS,
            registry=r,
        )
        self.in_flight = Gauge(
            "toolkit_api_requests_in_flight", "Generation requests being served now", registry=r
        )
        self.share_waiting = Gauge(
            "toolkit_api_share_waiting",
            "Generation requests waiting because their API key holds its whole share of the engine",
            registry=r,
        )
        self.body_read = Gauge(
            "toolkit_api_body_read_bytes",
            "Bytes of request bodies being read now, before admission (bounded by --body-read-budget-mib)",
            registry=r,
        )
        self.rejected = Counter(
            "toolkit_api_rejected_requests",
            "Generation requests refused with 429 (in-flight bound reached)",
            registry=r,
        )
        self.failed = Counter(
            "toolkit_api_failed_requests",
            "Generation requests that Triton or the engine failed (errors, Triton unreachable)",
            registry=r,
        )
        self.cancelled = Counter(
            "toolkit_api_cancelled_requests",
            "Generation requests whose client went away before the end",
            registry=r,
        )
        self.finished = Counter(
            "toolkit_api_finished_requests",
            "Finished generations by finish_reason",
            ["finish_reason"],
            registry=r,
        )

    def render(self) -> bytes:
        return generate_latest(self.registry)
