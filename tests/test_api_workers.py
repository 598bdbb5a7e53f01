"""`--api-workers N`: the OpenAI API as N processes on one port, counted as one.

Served: a synthetic repository on tritonserver, and the API launched as `toolkit serve --openai-port
--api-workers 2` launches it (its own process, settings on stdin). Each worker must take part in
serving, /metrics from any of them must count all of them, the in-flight bound must hold over all of
them, and a worker that dies must neither stop the API nor leave its requests counted.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import psutil
import pytest
from prometheus_client.parser import text_string_to_metric_families

from toolkit.api import ApiSettings
from toolkit.api.workers import METRICS_DIR_ENV
from toolkit.serve.api_process import api_environment, launch_api
from toolkit.serve.net import free_port
from toolkit.subprocs import stop_process

from repos import launch_on_free_ports, write_test_repository
from tiny import make_tiny_checkpoint

pytestmark = pytest.mark.server
MAX_IN_FLIGHT = 6
# 2.5 s at the engine's 10 ms steps: long enough to be in flight whatever the load
LONG_TOKENS = 250


@pytest.fixture(scope="module")
def triton(tmp_path_factory):
    root = tmp_path_factory.mktemp("workers")
    repo = write_test_repository(
        make_tiny_checkpoint(root / "checkpoint"),
        root / "repo",
        synthetic=True,
        step_time_ms=10.0,
        max_output_len=LONG_TOKENS + 6,
        max_seq_len=512,
    )
    server = launch_on_free_ports(repo, root / "server.log", 120)
    yield server, repo
    server.stop()


@pytest.fixture
def workers(triton, tmp_path):
    server, repo = triton
    port = free_port()
    settings = ApiSettings(server.grpc_url, repo, max_in_flight=MAX_IN_FLIGHT)
    process, log = launch_api(
        settings, host="127.0.0.1", port=port, log_file=tmp_path / "api.log", workers=2
    )
    yield process, f"http://127.0.0.1:{port}", port, log
    stop_process(process, 20)


def _metric(url: str, name: str, **labels) -> float:
    text = httpx.get(f"{url}/metrics", timeout=10).text
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                return sample.value
    return 0.0


def _complete(url: str, max_tokens: int = 2) -> int:
    # a connection of its own: the kernel picks the worker from its address
    with httpx.Client(timeout=60) as client:
        body = {"model": "tensorrt_llm", "prompt": "Hello world", "max_tokens": max_tokens}
        return client.post(f"{url}/v1/completions", json=body).status_code


def _worker_pids(process) -> list[int]:
    return [child.pid for child in psutil.Process(process.pid).children()]


def _served_by(port: int) -> dict[int, float]:
    """Completions each worker has answered, from its own metric file (the supervisor's folder)."""
    from prometheus_client.mmap_dict import MmapedDict

    folder = api_environment(port, 2)[METRICS_DIR_ENV]
    counts = {}
    for name in os.listdir(folder):
        if name.startswith("counter_"):
            values = MmapedDict.read_all_values_from_file(os.path.join(folder, name))
            counts[int(name[8:-3])] = sum(
                value
                for key, value, *_ in values
                if "toolkit_api_requests" in key and '"completions"' in key
            )
    return counts


def test_two_workers_serve_one_port_and_metrics_count_both(workers):
    process, url, port, _ = workers
    pids = _worker_pids(process)
    assert len(pids) == 2
    for pid in pids:  # each listens on the port itself
        listening = [c for c in psutil.Process(pid).net_connections("tcp") if c.status == "LISTEN"]
        assert [c.laddr.port for c in listening] == [port]
    requests = 40
    with ThreadPoolExecutor(4) as pool:
        assert set(pool.map(lambda _: _complete(url), range(requests))) == {200}
    served = _served_by(port)
    assert set(served) == set(pids)
    assert all(count > 0 for count in served.values()), served  # both took part
    # whichever worker answers /metrics, it counts every worker's requests
    for _ in range(4):
        assert (
            _metric(url, "toolkit_api_requests_total", endpoint="completions", status="200")
            == requests
        )


def test_the_in_flight_bound_holds_over_all_workers(workers):
    _, url, _, _ = workers
    codes: list[int] = []
    long = [
        threading.Thread(target=lambda: codes.append(_complete(url, LONG_TOKENS)), daemon=True)
        for _ in range(MAX_IN_FLIGHT)
    ]
    for thread in long:
        thread.start()
    _wait_in_flight(url, MAX_IN_FLIGHT)
    # the bound is full over both workers (each holds some of the six): a bound per worker would
    # admit these
    with ThreadPoolExecutor(6) as pool:
        assert list(pool.map(lambda _: _complete(url), range(6))) == [429] * 6
    for thread in long:
        thread.join(60)
    assert codes == [200] * MAX_IN_FLIGHT
    assert _metric(url, "toolkit_api_requests_in_flight") == 0


def _wait_in_flight(url: str, count: int, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while _metric(url, "toolkit_api_requests_in_flight") < count:
        assert time.monotonic() < deadline, f"the {count} requests did not all start"
        time.sleep(0.05)


def test_a_dead_worker_is_replaced_and_its_requests_stop_counting(workers):
    process, url, _, log = workers
    streams = []

    def stream() -> None:
        body = {"model": "tensorrt_llm", "prompt": "Hello", "max_tokens": 64, "stream": True}
        try:
            with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=60) as r:
                for _ in r.iter_lines():
                    pass
        except httpx.HTTPError:
            pass  # its worker was killed under it

    for _ in range(MAX_IN_FLIGHT):
        streams.append(threading.Thread(target=stream, daemon=True))
        streams[-1].start()
    _wait_in_flight(url, MAX_IN_FLIGHT)
    before = _worker_pids(process)
    for pid in before:
        os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 30
    while len(set(_worker_pids(process)) - set(before)) < 2:
        assert process.poll() is None, log.read_text()
        assert time.monotonic() < deadline, "the workers were not started again"
        time.sleep(0.2)
    for thread in streams:
        thread.join(10)
    assert httpx.get(f"{url}/health", timeout=10).status_code == 200
    # the dead workers' requests hold neither the gauge nor the bound
    assert _metric(url, "toolkit_api_requests_in_flight") == 0
    with ThreadPoolExecutor(MAX_IN_FLIGHT) as pool:
        assert set(pool.map(lambda _: _complete(url), range(MAX_IN_FLIGHT))) == {200}
    assert "starting it again" in log.read_text()


def test_a_worker_killed_again_while_it_starts_again_is_started_again(workers):
    """The rule that stops the API when a worker dies before it served is for the first workers (a bad
    setting, a taken port). A worker killed again in the ~0.5 s its restart takes (the OOM killer at
    work, say) stopped the whole API, the healthy worker with it."""
    process, url, port, log = workers
    first = _worker_pids(process)
    _until_each_served(url, port, first)
    os.kill(first[0], signal.SIGKILL)
    deadline = time.monotonic() + 30
    while not (fresh := set(_worker_pids(process)) - set(first)):
        assert time.monotonic() < deadline, "the worker was not started again"
        time.sleep(0.02)
    os.kill(fresh.pop(), signal.SIGKILL)  # before it serves: it takes ~0.5 s to
    while len(set(_worker_pids(process)) - set(first)) < 1 or "again in 2 s" not in log.read_text():
        assert process.poll() is None, log.read_text()
        assert time.monotonic() < deadline, log.read_text()
        time.sleep(0.2)
    assert "before it served: stopping the API" not in log.read_text()
    with ThreadPoolExecutor(4) as pool:
        assert set(pool.map(lambda _: _complete(url), range(8))) == {200}


def _until_each_served(url: str, port: int, pids: list[int]) -> None:
    """Requests until every worker in `pids` has answered one (the API answers once the first does)."""
    deadline = time.monotonic() + 30
    while not all(_served_by(port).get(pid) for pid in pids):
        assert time.monotonic() < deadline, _served_by(port)
        assert _complete(url) == 200


def test_a_kill_9_of_the_supervisor_leaves_no_worker_serving(workers):
    """Under `toolkit serve` the workers are stopped with the API; `toolkit api --workers N` alone left
    both serving the port, parented to init, after a kill -9 of its supervisor."""
    process, url, port, _ = workers
    pids = _worker_pids(process)
    assert len(pids) == 2 and _complete(url) == 200
    process.kill()
    process.wait(10)
    deadline = time.monotonic() + 20
    while any(psutil.pid_exists(p) and psutil.Process(p).status() != "zombie" for p in pids):
        assert time.monotonic() < deadline, "a worker outlived its supervisor"
        time.sleep(0.2)
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"{url}/health", timeout=5)


def test_every_worker_says_the_engine_died_when_one_saw_it(tmp_path):
    """Each worker kept the fault it saw itself: after the engine's stub was killed under a stream,
    /health answered 503 from the worker that served the stream and 200 from the other, by connection,
    until a request happened to reach it. A fault found by one is every worker's now."""
    from toolkit.serve.lifecycle import python_stubs

    repo = write_test_repository(
        make_tiny_checkpoint(tmp_path / "checkpoint"), tmp_path / "repo", synthetic=True,
        step_time_ms=50.0, max_output_len=LONG_TOKENS + 6, max_seq_len=512,
    )  # fmt: skip
    server = launch_on_free_ports(repo, tmp_path / "server.log", 120)
    port = free_port()
    process, log = launch_api(
        ApiSettings(server.grpc_url, repo, max_in_flight=MAX_IN_FLIGHT), host="127.0.0.1",
        port=port, log_file=tmp_path / "api.log", workers=2,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        _until_each_served(url, port, _worker_pids(process))
        events: list[bytes] = []
        ended = threading.Event()

        def stream() -> None:
            body = {"model": "tensorrt_llm", "prompt": "Hello", "max_tokens": LONG_TOKENS,
                    "min_tokens": LONG_TOKENS, "stream": True}  # fmt: skip
            try:
                with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=60) as r:
                    events.extend(r.iter_lines())
            finally:
                ended.set()

        threading.Thread(target=stream, daemon=True).start()
        deadline = time.monotonic() + 30
        while len(events) < 3:
            assert time.monotonic() < deadline, events
            time.sleep(0.05)
        (stub,) = [
            pid for pid, model in python_stubs(server.pid).items() if model == "tensorrt_llm"
        ]
        os.kill(stub, signal.SIGKILL)
        assert ended.wait(30), "the open stream hung after the engine died"
        codes = []
        for _ in range(8):  # a connection each: the kernel spreads them over both workers
            with httpx.Client(timeout=30) as client:
                codes.append(client.get(f"{url}/health").status_code)
        assert codes == [503] * 8, codes
    finally:
        stop_process(process, 20)
        server.stop(timeout_s=5)  # after a fault: no drain (the dead stub's requests never end)


def test_sigterm_drains_every_worker_and_exits_0(workers):
    process, url, _, _ = workers
    pids = _worker_pids(process)
    assert _complete(url) == 200
    process.send_signal(signal.SIGTERM)
    assert process.wait(30) == 0
    assert not any(
        psutil.pid_exists(pid) and psutil.Process(pid).status() != "zombie" for pid in pids
    )


def test_a_stream_interval_streams_the_first_token_at_once_then_fewer_larger_chunks(
    triton, tmp_path
):
    """`--stream-interval 4` on the synthetic engine (which answers every 4 tokens itself): 13 tokens come
    as at most 5 chunks (1, 3, 4, 4, 1 tokens; the API may join two that arrive together), all counted."""
    import json

    server, repo = triton
    port = free_port()
    settings = ApiSettings(server.grpc_url, repo, stream_interval=4)
    process, _ = launch_api(settings, host="127.0.0.1", port=port, log_file=tmp_path / "api.log")
    body = {
        "model": "tensorrt_llm",
        "prompt": "Hello world",
        "max_tokens": 13,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    try:
        with httpx.stream(
            "POST", f"http://127.0.0.1:{port}/v1/completions", json=body, timeout=60
        ) as response:
            assert response.status_code == 200
            events = [
                json.loads(line[6:]) for line in response.iter_lines() if line.startswith("data: {")
            ]
    finally:
        stop_process(process, 20)
    texts = [e["choices"][0]["text"] for e in events if e["choices"] and e["choices"][0]["text"]]
    assert 2 <= len(texts) <= 5
    assert events[-1]["usage"]["completion_tokens"] == 13
