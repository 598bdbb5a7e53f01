"""Draining tritonserver: wait until its engines hold no request before it is signalled (read from its
metrics), and tell when, signalled, it only waits on clients' idle streams (read from its log).

Why: tritonserver 2.51 refuses to enqueue anything once it is stopping (FAILED_ENQUEUE in its verbose
log), and an ensemble enqueues a postprocessing step for every response its decoupled engine step
sends. So an ensemble stream still under way at SIGTERM loses its next step, is never released, and
the stop waits out the whole drain timeout. Draining the engines first, while Triton still admits,
lets every stream end with all its steps; the SIGTERM then finds nothing in flight.

What "idle" is read from, on every target (the Python engines export the backend's families):
- `nv_inference_pending_request_count` of every model is 0 (nothing queued in Triton's schedulers);
- each engine (a model with `nv_trt_llm_request_metrics{request_type="active"}`) either reported
  `active` 0 after the drain began (the report's `nv_trt_llm_general_metrics{general_type="timestamp"}`,
  microseconds since the epoch, is newer: an older 0 may predate a request it holds now), or has made
  no report for QUIET_S while watched. The second clause is for the GPU backend, which reports each
  executor iteration's statistics and none while its executor idles, so its last `active` stays
  whatever the last iteration held; an engine holding requests iterates, and so reports, every step.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import httpx
from prometheus_client.parser import text_string_to_metric_families

PENDING = "nv_inference_pending_request_count"
REQUESTS = "nv_trt_llm_request_metrics"
GENERAL = "nv_trt_llm_general_metrics"
POLL_S = 0.25
READ_TRIES = 3
QUIET_S = 3.0  # no engine report for this long, while watched: its executor runs no iteration
IDLE_READINGS = 2  # idle this many readings in a row


@dataclass(frozen=True)
class Reading:
    """One scrape: requests queued in Triton (all models), and per engine model (active, report time us)."""

    pending: float
    engines: dict[str, tuple[float, float]]


def read(text: str) -> Reading:
    pending = 0.0
    active: dict[str, float] = {}
    reported: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        if family.name not in (PENDING, REQUESTS, GENERAL):
            continue
        for sample in family.samples:
            model = sample.labels.get("model", "")
            if family.name == PENDING:
                pending += sample.value
            elif family.name == REQUESTS and sample.labels.get("request_type") == "active":
                active[model] = sample.value
            elif family.name == GENERAL and sample.labels.get("general_type") == "timestamp":
                reported[model] = sample.value
    return Reading(
        pending, {model: (value, reported.get(model, 0.0)) for model, value in active.items()}
    )


@dataclass
class IdleWatch:
    """Readings over time -> whether the engines are idle. `since_us`: when the drain began (epoch us)."""

    since_us: float
    quiet_s: float = QUIET_S
    # per engine: (the last report time seen, when it was first seen: time.monotonic())
    _seen: dict[str, tuple[float, float]] = field(default_factory=dict)

    def idle(self, reading: Reading, now: float) -> bool:
        engines_idle = True
        for model, (active, reported_us) in reading.engines.items():
            last = self._seen.get(model)
            if last is None or last[0] != reported_us:
                self._seen[model] = last = (reported_us, now)
            fresh_zero = active == 0 and reported_us > self.since_us
            quiet = now - last[1] >= self.quiet_s
            engines_idle = engines_idle and (fresh_zero or quiet)
        return reading.pending == 0 and engines_idle


def wait_until_engines_idle(
    metrics_url: str,
    deadline: float,
    running: Callable[[], bool],
    *,
    poll_s: float = POLL_S,
) -> str:
    """Watch `metrics_url` until its engines are idle, `deadline` (time.monotonic()) passes, or the server
    stops `running`. Returns "idle", "timeout", "exited", or "unreadable" (no metrics to read: the caller
    signals at once, as before this watch existed)."""
    watch = IdleWatch(since_us=time.time() * 1e6)
    failures = idle_in_a_row = 0
    # trust_env off: a proxy in the environment must not stand between serve and its own server
    with httpx.Client(timeout=2.0, trust_env=False) as client:
        while True:
            if not running():
                return "exited"
            try:
                response = client.get(metrics_url)
                response.raise_for_status()
                reading = read(response.text)
                failures = 0
            except Exception:  # noqa: BLE001 - whatever fails, the stop must go on (signalling at once)
                # a busy server may miss one scrape; a missing endpoint misses them all
                failures += 1
                if failures >= READ_TRIES:
                    return "unreadable"
                time.sleep(poll_s)
                continue
            now = time.monotonic()
            idle_in_a_row = idle_in_a_row + 1 if watch.idle(reading, now) else 0
            if idle_in_a_row >= IDLE_READINGS:
                return "idle"
            if now >= deadline:
                return "timeout"
            time.sleep(min(poll_s, max(0.0, deadline - now)))


# tritonserver's stop, in its log (INFO lines, printed at --log-verbose=0): once a second while it waits.
_IN_FLIGHT = re.compile(r"Found (\d+) model versions that have in-flight inferences")
_LIVE = re.compile(
    r"Timeout (-?\d+): Found (\d+) live models and (\d+) in-flight non-inference requests"
)
_UNLOADED = "successfully unloaded"
PINNED_S = 5  # seconds of a stopping Triton unloading nothing more, with nothing in flight


def held_by_idle_streams(log_since_signal: str, seconds: int = PINNED_S) -> int:
    """How many models a stopping tritonserver keeps loaded with nothing left to run (0: none, or not
    for `seconds` yet), from its log since the signal.

    Triton 2.51 keeps a model loaded while a client's gRPC stream whose last request went to it stays
    open, even idle, and waits for it until its exit timeout: a client that keeps its stream open
    (tritonclient's start_stream, between requests) held every stop for the whole drain. Its log then
    says no model has inferences in flight, then the same count of live models, second after second,
    with no unload between them.
    """
    in_flight = [int(m.group(1)) for m in _IN_FLIGHT.finditer(log_since_signal)]
    if not in_flight or in_flight[-1] != 0:
        return 0
    # (seconds left of its exit timeout, live models, in-flight non-inference requests) since the last
    # unload. Seconds come from the countdown, not from counting lines: an MPI server's ranks write one
    # log, a line each per second (and their live counts differ, which is no hold here).
    since_unload: list[tuple[int, int, int]] = []
    for line in log_since_signal.splitlines():
        if _UNLOADED in line:
            since_unload = []
        elif (m := _LIVE.search(line)) is not None:
            since_unload.append((int(m.group(1)), int(m.group(2)), int(m.group(3))))
    if not since_unload or any(requests for _, _, requests in since_unload):
        return 0
    left = [t for t, _, _ in since_unload]
    counts = {live for _, live, _ in since_unload}
    if max(left) - min(left) < seconds or len(counts) != 1:
        return 0
    return counts.pop()


def clients_connected(port: int) -> bool:
    """Whether any TCP connection to local `port` is established (/proc/net/tcp and tcp6, this network
    namespace): a model held loaded by an idle stream has a client connected."""
    wanted = f"{port:04X}"
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table, encoding="ascii") as rows:
                next(rows, None)  # the header
                for row in rows:
                    fields = row.split()
                    # local address hex:port, remote address, state (01: ESTABLISHED)
                    if len(fields) > 3 and fields[3] == "01" and fields[1].endswith(":" + wanted):
                        return True
        except OSError:
            continue
    return False
