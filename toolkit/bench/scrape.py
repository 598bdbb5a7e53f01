"""Scrape Triton's Prometheus endpoint while a point runs: queueing, and KV-cache use where reported.

Gauges (pending requests, KV cache blocks or fractions) are sampled every `interval_s` and summarized
as mean and max; counters (queue time, successful requests) are differenced between the first and the
last sample, giving each model's mean queue time per request over the point.
"""

from __future__ import annotations

import threading
import time
import urllib.error
import urllib.request
from collections import defaultdict
from dataclasses import asdict, dataclass, field

from prometheus_client.parser import text_string_to_metric_families

PENDING = "nv_inference_pending_request_count"
QUEUE_US = "nv_inference_queue_duration_us"
SUCCESS = "nv_inference_request_success"
CPU_UTIL = "nv_cpu_utilization"
# The backend's count of engine iterations (steps), as the Python engines report it too.
ITERATIONS = "nv_trt_llm_general_metrics"
ITERATION_LABEL = "general_type=iteration_counter"
TIME_KEY = "_time"  # a snapshot's time.monotonic(), beside its series


@dataclass(frozen=True)
class ScrapeSummary:
    samples: int
    pending_mean: dict[str, float] = field(default_factory=dict)
    pending_max: dict[str, float] = field(default_factory=dict)
    queue_us_per_request: dict[str, float] = field(default_factory=dict)
    kv_cache: dict[str, dict[str, float]] = field(default_factory=dict)  # series -> {mean, max}
    cpu_utilization_mean: float | None = None
    # Wall time per engine step over the point (the iteration counter's rate), when the engine counts them.
    engine_step_ms: float | None = None

    def to_dict(self) -> dict:
        return asdict(self)


def parse_samples(text: str) -> dict[str, float]:
    """Prometheus text -> {'name{k=v,...}': value} for the series we summarize."""
    series = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            # The parser names counter samples `<name>_total`; Triton's exposition has no suffix.
            name = family.name if sample.name == f"{family.name}_total" else sample.name
            if _wanted(name):
                labels = ",".join(
                    f"{k}={v}" for k, v in sorted(sample.labels.items()) if k != "version"
                )
                series[f"{name}{{{labels}}}"] = float(sample.value)
    return series


def _wanted(name: str) -> bool:
    return name in (PENDING, QUEUE_US, SUCCESS, CPU_UTIL, ITERATIONS) or "kv_cache" in name


def summarize(snapshots: list[dict[str, float]]) -> ScrapeSummary:
    if not snapshots:
        return ScrapeSummary(samples=0)
    gauges: dict[str, list[float]] = defaultdict(list)
    for snap in snapshots:
        for key, value in snap.items():
            if key != TIME_KEY:
                gauges[key].append(value)
    pending_mean, pending_max, kv = {}, {}, {}
    for key, values in gauges.items():
        name, model = _split(key)
        if name == PENDING:
            pending_mean[model] = sum(values) / len(values)
            pending_max[model] = max(values)
        elif "kv_cache" in name:
            kv[key] = {"mean": sum(values) / len(values), "max": max(values)}
    cpu = gauges.get(f"{CPU_UTIL}{{}}")
    return ScrapeSummary(
        samples=len(snapshots),
        pending_mean=pending_mean,
        pending_max=pending_max,
        queue_us_per_request=_queue_per_request(snapshots[0], snapshots[-1]),
        kv_cache=kv,
        cpu_utilization_mean=sum(cpu) / len(cpu) if cpu else None,
        engine_step_ms=_step_ms(snapshots[0], snapshots[-1]),
    )


def _step_ms(first: dict[str, float], last: dict[str, float]) -> float | None:
    """ms of wall time per engine iteration between two snapshots (None: no iteration counted)."""
    seconds = last.get(TIME_KEY, 0.0) - first.get(TIME_KEY, 0.0)
    steps = sum(
        value - first.get(key, 0.0)
        for key, value in last.items()
        if key.startswith(ITERATIONS) and ITERATION_LABEL in key
    )
    return seconds * 1000 / steps if steps > 0 and seconds > 0 else None


def _queue_per_request(first: dict[str, float], last: dict[str, float]) -> dict[str, float]:
    result = {}
    for key, value in last.items():
        name, model = _split(key)
        if name != QUEUE_US:
            continue
        success_key = key.replace(QUEUE_US, SUCCESS, 1)
        done = last.get(success_key, 0.0) - first.get(success_key, 0.0)
        if done > 0:
            result[model] = (value - first.get(key, 0.0)) / done
    return result


def _split(key: str) -> tuple[str, str]:
    name, _, labels = key.partition("{")
    model = ""
    for part in labels.rstrip("}").split(","):
        if part.startswith("model="):
            model = part[len("model=") :]
    return name, model


class MetricsScraper:
    """Samples `url` every `interval_s` on a thread between start() and stop(); never fails a sweep."""

    def __init__(self, url: str | None, interval_s: float = 0.5):
        self.url = url
        self.interval_s = interval_s
        self.snapshots: list[dict[str, float]] = []
        self.errors = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="metrics-scraper", daemon=True)

    def __enter__(self) -> MetricsScraper:
        if self.url:
            self._sample()
            self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)
        if self.url:
            self._sample()

    def summary(self) -> ScrapeSummary:
        return summarize(self.snapshots)

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._sample()

    def _sample(self) -> None:
        if not self.url:
            return
        try:
            with urllib.request.urlopen(self.url, timeout=2) as response:
                snapshot = parse_samples(response.read().decode("utf-8", errors="replace"))
            snapshot[TIME_KEY] = time.monotonic()
            self.snapshots.append(snapshot)
        except (urllib.error.URLError, OSError, ValueError):
            self.errors += 1  # metrics are an extra: a missed sample must not fail the sweep
