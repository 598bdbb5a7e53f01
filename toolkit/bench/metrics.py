"""LLM metrics from a perf_analyzer profile export, with GenAI-Perf's definitions.

Per request (timestamps in ns, from the export):
  time to first token  = first response - request start
  request latency      = last response - request start
  inter-token latency  = (request latency - TTFT) / (output tokens - 1)   (requests with >1 token)
  output tokens        = tokens carried by the responses: one per streamed response, as the
                         engine streams them (each response holds the tokens of one decode step)
Per point (one experiment in the export):
  duration             = last response of any request - first request start
  output tokens/s      = all output tokens / duration
  requests/s           = completed requests / duration
Distributions carry mean, min, max, p50, p90, p99 (linear interpolation, as numpy does).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from toolkit.errors import BenchError

NS_PER_MS = 1e6
NS_PER_S = 1e9


@dataclass(frozen=True)
class RequestRecord:
    """One request as perf_analyzer recorded it; response_ns holds the responses that carry output."""

    start_ns: int
    response_ns: tuple[int, ...]
    output_tokens: int
    lora_task_id: int = (
        0  # the LoRA adapter the request ran on (its request_inputs), 0: the base model
    )

    @property
    def ttft_ms(self) -> float:
        return (self.response_ns[0] - self.start_ns) / NS_PER_MS

    @property
    def latency_ms(self) -> float:
        return (self.response_ns[-1] - self.start_ns) / NS_PER_MS

    @property
    def itl_ms(self) -> float | None:
        if self.output_tokens < 2:
            return None
        return (self.response_ns[-1] - self.response_ns[0]) / NS_PER_MS / (self.output_tokens - 1)


@dataclass(frozen=True)
class Experiment:
    """One load point of an export: mode ('concurrency' or 'request_rate') and its value."""

    mode: str
    value: float
    requests: tuple[RequestRecord, ...]


@dataclass(frozen=True)
class Distribution:
    mean: float
    min: float
    max: float
    p50: float
    p90: float
    p99: float

    @classmethod
    def of(cls, values: Sequence[float]) -> Distribution:
        if not values:
            return cls(*(float("nan"),) * 6)
        a = np.asarray(values, dtype=float)
        p50, p90, p99 = np.percentile(a, [50, 90, 99])
        return cls(
            float(a.mean()), float(a.min()), float(a.max()), float(p50), float(p90), float(p99)
        )


@dataclass(frozen=True)
class PointMetrics:
    mode: str
    value: float
    requests: int
    duration_s: float
    output_tokens: int
    output_tokens_per_s: float
    requests_per_s: float
    ttft_ms: Distribution
    itl_ms: Distribution
    latency_ms: Distribution
    output_len: Distribution

    def to_dict(self) -> dict:
        return asdict(self)


def parse_profile_export(source: Path | str | bytes) -> list[Experiment]:
    """Read a `--profile-export-file` document (a path, or its text)."""
    raw = Path(source).read_bytes() if isinstance(source, Path) else source
    if isinstance(raw, bytes):
        # Streamed text pieces may end inside a UTF-8 character; perf_analyzer writes them raw.
        raw = raw.decode("utf-8", errors="replace")
    try:
        doc = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise BenchError(
            f"perf_analyzer profile export is not JSON: {exc}",
            hint="check the perf_analyzer log next to it",
        ) from exc
    experiments = doc.get("experiments") if isinstance(doc, dict) else None
    if not isinstance(experiments, list):
        raise BenchError(
            "perf_analyzer profile export has no 'experiments' list",
            hint="use perf_analyzer 2.4x or newer (tritonclient wheel)",
        )
    return [_experiment(e) for e in experiments]


def _experiment(entry: dict) -> Experiment:
    info = entry.get("experiment", {})
    records = tuple(r for r in (_record(req) for req in entry.get("requests", [])) if r is not None)
    return Experiment(
        mode=str(info.get("mode", "concurrency")),
        value=float(info.get("value", 0)),
        requests=records,
    )


def _record(request: dict) -> RequestRecord | None:
    """None for a request that got no output (failed or cancelled): it has no TTFT."""
    stamps = request.get("response_timestamps") or []
    outputs = request.get("response_outputs") or [{}] * len(stamps)
    kept = [int(t) for t, out in zip(stamps, outputs, strict=False) if _carries_output(out)]
    if not kept:
        return None
    return RequestRecord(
        start_ns=int(request["timestamp"]),
        response_ns=tuple(kept),
        output_tokens=len(kept),
        lora_task_id=_task_id((request.get("request_inputs") or {}).get("lora_task_id")),
    )


def _task_id(value) -> int:
    """The recorded lora_task_id input (a number, or a one-element list or string of one), 0 when absent."""
    while isinstance(value, list) and value:
        value = value[0]
    try:
        return int(value or 0)
    except (TypeError, ValueError):
        return 0


def _carries_output(output: dict) -> bool:
    """An empty final response (only the completion flag) carries no token."""
    if not output:
        return True  # exports without response_outputs: every response counts
    text = output.get("text_output")
    if text is not None:
        return text != ""
    return output.get("sequence_length", 1) != 0


def point_metrics(experiment: Experiment, duration_s: float | None = None) -> PointMetrics:
    """The point's metrics; `duration_s`: over this duration instead of its requests' own span (a part of a
    point's requests, each adapter's of a --lora-mix point, over the whole point's)."""
    records = experiment.requests
    if not records:
        raise BenchError(
            f"no request completed at {experiment.mode} {experiment.value:g}",
            hint="check the server log; lower the load or raise the request timeout",
        )
    start = min(r.start_ns for r in records)
    end = max(r.response_ns[-1] for r in records)
    duration = duration_s or max(end - start, 1) / NS_PER_S
    tokens = sum(r.output_tokens for r in records)
    itls = [r.itl_ms for r in records if r.itl_ms is not None]
    return PointMetrics(
        mode=experiment.mode,
        value=experiment.value,
        requests=len(records),
        duration_s=duration,
        output_tokens=tokens,
        output_tokens_per_s=tokens / duration,
        requests_per_s=len(records) / duration,
        ttft_ms=Distribution.of([r.ttft_ms for r in records]),
        itl_ms=Distribution.of(itls),
        latency_ms=Distribution.of([r.latency_ms for r in records]),
        output_len=Distribution.of([float(r.output_tokens) for r in records]),
    )


def adapter_metrics(experiment: Experiment, names: dict[int, str]) -> dict[str, PointMetrics]:
    """Each adapter's requests of a point (names: task id -> name; 0 is the base model) over the whole point's
    duration, so that their tokens/s add up to the point's."""
    duration = point_metrics(experiment).duration_s
    out = {}
    for task, name in names.items():
        part = [r for r in experiment.requests if r.lora_task_id == task]
        if part:
            subset = Experiment(experiment.mode, experiment.value, tuple(part))
            out[name] = point_metrics(subset, duration)
    return out


def flat_row(metrics: PointMetrics, extra: dict | None = None) -> dict:
    """One CSV row: scalars plus `<metric>_<stat>` columns."""
    row: dict = {}
    for key, value in metrics.to_dict().items():
        if isinstance(value, dict):
            row.update({f"{key}_{stat}": v for stat, v in value.items()})
        else:
            row[key] = value
    row.update(extra or {})
    return row
