"""The drain's rules (toolkit.serve.drain): engines idle, on metric pages in Triton's and the backend's
format; a stopping server held only by idle client streams, on its log lines (as tritonserver 2.51
wrote them in a reproduction: a client's stream left open after its answer).

The served behaviour (an ensemble stream under way at a stop, which Triton 2.51 would strand) is
tests/test_faults.py::test_a_stop_during_an_ensemble_stream_does_not_wait_out_the_drain_timeout.
"""

from __future__ import annotations

import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from toolkit.serve.drain import (
    IdleWatch,
    clients_connected,
    held_by_idle_streams,
    read,
    wait_until_engines_idle,
)

SINCE_US = 1_700_000_000_000_000.0


def page(active: float, reported_us: float, pending: float = 0, model: str = "tensorrt_llm") -> str:
    return f"""# HELP nv_inference_pending_request_count Instantaneous number of pending requests
# TYPE nv_inference_pending_request_count gauge
nv_inference_pending_request_count{{model="{model}",version="1"}} {pending}
nv_inference_pending_request_count{{model="ensemble",version="1"}} 0
# HELP nv_trt_llm_request_metrics TRT LLM request metrics
# TYPE nv_trt_llm_request_metrics gauge
nv_trt_llm_request_metrics{{model="{model}",request_type="active",version="1"}} {active}
nv_trt_llm_request_metrics{{model="{model}",request_type="max",version="1"}} 8
# HELP nv_trt_llm_general_metrics General TRT LLM metrics
# TYPE nv_trt_llm_general_metrics gauge
nv_trt_llm_general_metrics{{model="{model}",general_type="timestamp",version="1"}} {reported_us}
nv_trt_llm_general_metrics{{model="{model}",general_type="iteration_counter",version="1"}} 7
"""


def test_read_takes_pending_of_every_model_and_each_engines_active_and_report_time():
    reading = read(page(active=3, reported_us=SINCE_US + 5, pending=2))
    assert reading.pending == 2
    assert reading.engines == {"tensorrt_llm": (3, SINCE_US + 5)}


def test_a_zero_reported_before_the_drain_began_is_not_idle():
    """A report from before the drain may predate a request the engine holds now."""
    watch = IdleWatch(since_us=SINCE_US)
    assert not watch.idle(read(page(active=0, reported_us=SINCE_US - 1)), now=0.0)
    assert watch.idle(read(page(active=0, reported_us=SINCE_US + 1)), now=0.1)


def test_an_engine_that_keeps_reporting_requests_is_busy_however_long_it_is_watched():
    watch = IdleWatch(since_us=SINCE_US, quiet_s=2.0)
    for step in range(40):
        reported = SINCE_US + step * 100_000
        assert not watch.idle(read(page(active=1, reported_us=reported)), now=step * 0.25)


def test_an_engine_that_stops_reporting_is_idle_after_the_quiet_time():
    """The GPU backend reports each executor iteration and none while idle: its last `active` stays."""
    watch = IdleWatch(since_us=SINCE_US, quiet_s=2.0)
    frozen = page(active=1, reported_us=SINCE_US - 50)
    assert not watch.idle(read(frozen), now=10.0)
    assert not watch.idle(read(frozen), now=11.9)
    assert watch.idle(read(frozen), now=12.0)


def test_requests_queued_in_triton_keep_it_busy():
    watch = IdleWatch(since_us=SINCE_US)
    assert not watch.idle(read(page(active=0, reported_us=SINCE_US + 1, pending=1)), now=0.0)


class _Metrics(BaseHTTPRequestHandler):
    pages: list[str] = []

    def do_GET(self):  # noqa: N802 - http.server's name
        body = (self.pages.pop(0) if len(self.pages) > 1 else self.pages[0]).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *_):
        pass


def _serve(pages: list[str]) -> tuple[ThreadingHTTPServer, str]:
    handler = type("Handler", (_Metrics,), {"pages": pages})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}/metrics"


def test_the_wait_ends_when_the_engine_reports_nothing_held_and_not_before():
    now_us = time.time() * 1e6
    busy = [page(active=2, reported_us=now_us + 1e6 * step) for step in range(1, 4)]
    server, url = _serve([*busy, page(active=0, reported_us=now_us + 1e7)])
    try:
        started = time.monotonic()
        outcome = wait_until_engines_idle(url, started + 30, lambda: True, poll_s=0.05)
        assert outcome == "idle"
        assert time.monotonic() - started >= 3 * 0.05  # three busy readings came first
    finally:
        server.shutdown()


def test_the_wait_gives_up_at_the_deadline_on_an_engine_that_stays_busy():
    server, url = _serve([page(active=1, reported_us=time.time() * 1e6 + 1e9)])  # always "fresh"
    try:
        outcome = wait_until_engines_idle(url, time.monotonic() + 0.5, lambda: True, poll_s=0.05)
        assert outcome == "timeout"
    finally:
        server.shutdown()


def test_the_wait_stops_as_soon_as_the_server_has_exited_or_its_metrics_cannot_be_read():
    server, url = _serve([page(active=1, reported_us=time.time() * 1e6 + 1e9)])
    try:
        assert wait_until_engines_idle(url, time.monotonic() + 30, lambda: False) == "exited"
    finally:
        server.shutdown()
        server.server_close()  # connections are refused from now on
    started = time.monotonic()
    closed = wait_until_engines_idle(url, started + 30, lambda: True, poll_s=0.05)
    assert closed == "unreadable" and time.monotonic() - started < 10


def stop_log(*lines: str) -> str:
    return "".join(f'I1204 04:01:08.835727 18785 server.cc:345] "{line}"\n' for line in lines)


def live(count: int, requests: int = 0, left: int = 15) -> str:
    return (
        f"Timeout {left}: Found {count} live models and {requests} in-flight non-inference requests"
    )


WAITING = "Waiting for in-flight requests to complete."


def test_five_seconds_of_the_same_live_models_with_nothing_in_flight_is_a_hold():
    log = stop_log(
        WAITING,
        "Timeout 15: Found 0 model versions that have in-flight inferences",
        live(5, left=15),
        "successfully unloaded 'preprocessing' version 1",
        *(live(1, left=t) for t in range(14, 8, -1)),  # 14 .. 9: five seconds
    )
    assert held_by_idle_streams(log) == 1
    assert held_by_idle_streams(log, seconds=6) == 0  # not that long yet


def test_the_seconds_come_from_the_countdown_not_from_lines_of_several_ranks():
    """An MPI server's ranks write one log: two ranks make two lines a second."""
    two_ranks = stop_log(
        "Timeout 15: Found 0 model versions that have in-flight inferences",
        "Timeout 15: Found 0 model versions that have in-flight inferences",
        *(live(1, left=t) for t in (15, 15, 14, 14, 13, 13)),
    )
    assert held_by_idle_streams(two_ranks) == 0  # 2 s, in 6 lines
    unequal = stop_log(
        "Timeout 15: Found 0 model versions that have in-flight inferences",
        *(line for t in range(15, 8, -1) for line in (live(4, left=t), live(1, left=t))),
    )
    assert held_by_idle_streams(unequal) == 0  # rank 0 still has models to unload


def test_clients_connected_sees_an_established_connection_to_the_port_only():
    with socket.create_server(("127.0.0.1", 0)) as listener:
        port = listener.getsockname()[1]
        assert not clients_connected(port)  # listening is not connected
        client = socket.create_connection(("127.0.0.1", port))
        accepted, _ = listener.accept()
        try:
            assert clients_connected(port)
            assert not clients_connected(port + 1 if port < 65535 else port - 1)
        finally:
            client.close()
            accepted.close()
        deadline = time.monotonic() + 5
        while clients_connected(port) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not clients_connected(port)


def test_models_still_unloading_or_requests_in_flight_are_no_hold():
    unloading = stop_log(
        "Timeout 15: Found 0 model versions that have in-flight inferences",
        *(live(3, left=t) for t in range(15, 12, -1)),
        "successfully unloaded 'postprocessing' version 1",
        *(live(2, left=t) for t in range(12, 8, -1)),  # 12 .. 9: 3 s since the last unload
    )
    assert held_by_idle_streams(unloading) == 0
    running = stop_log(
        *(
            f"Timeout {t}: Found 1 model versions that have in-flight inferences"
            for t in range(15, 5, -1)
        )
    )
    assert held_by_idle_streams(running) == 0
    non_inference = stop_log(
        "Timeout 15: Found 0 model versions that have in-flight inferences",
        *(live(1, requests=1, left=t) for t in range(15, 5, -1)),
    )
    assert held_by_idle_streams(non_inference) == 0
    assert held_by_idle_streams("") == 0
