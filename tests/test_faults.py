"""Fault injection on the real stack: `toolkit serve` (tritonserver, its Python-backend stubs and the
OpenAI API) run as a user runs it, then broken from outside: kill -9 of the engine's stub and of
tritonserver, SIGTERM while streams run. Each test bounds how long anything may hang, checks that
clients see an error or a normal end, that `serve` says what happened in its exit code, and that no
process it started outlives it.

The repository is a CPU one over the Llama-3-style checkpoint of tests/tiny.py: it loads in seconds,
and the prompt "loop" generates until max_tokens (2000 tokens take several seconds).
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

from toolkit.client.tensors import engine_inputs
from toolkit.serve.lifecycle import python_stubs
from toolkit.serve.net import free_port
from toolkit.settings import cache_dir
from toolkit.subprocs import children_of, command_line, process_alive

from repos import launch_on_free_ports, write_test_repository
from sse_events import DONE, sse_events
from tiny import make_bigram_checkpoint

pytestmark = pytest.mark.server

HANG_BOUND_S = (
    20  # nothing a client or an operator waits on may take longer than this after a fault
)


@pytest.fixture(scope="module")
def bigram_repo(tmp_path_factory):
    root = tmp_path_factory.mktemp("faults")
    checkpoint = make_bigram_checkpoint(root / "checkpoint")
    return write_test_repository(
        checkpoint,
        root / "repo",
        max_input_len=64,
        max_output_len=2000,
        max_seq_len=2064,
        kv_cache_tokens=8192,
    )


class Serving:
    """`toolkit serve --openai-port` in a subprocess, as a user starts it."""

    def __init__(self, repo: Path, log_dir: Path, *extra: str, env: dict | None = None):
        self.ports = {name: free_port() for name in ("http", "grpc", "metrics", "openai")}
        self.stderr_path = log_dir / "serve.stderr"
        argv = [sys.executable, "-m", "toolkit.cli.main", "serve", "--repo", str(repo)]
        for name, port in self.ports.items():
            argv += [f"--{name}-port", str(port)]
        argv += ["--log-file", str(log_dir / "tritonserver.log"), *extra]
        self.stderr = open(self.stderr_path, "wb")  # noqa: SIM115 - held for the process, closed in close()
        self.process = subprocess.Popen(
            argv,
            stdout=subprocess.PIPE,
            stderr=self.stderr,
            text=True,
            env={**os.environ, **(env or {})},
        )
        self.api = f"http://127.0.0.1:{self.ports['openai']}"
        self.grpc = f"127.0.0.1:{self.ports['grpc']}"
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            assert self.process.poll() is None, self.output()
            try:
                if (
                    httpx.get(f"{self.api}/health", timeout=2).status_code == 200
                    and self.process.poll() is None
                ):
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        else:
            raise AssertionError(f"serve was not ready in 300 s\n{self.output()}")
        self.triton_pid = _child_named(self.process.pid, "tritonserver")
        self.processes = descendants(self.process.pid)  # everything serve started, stubs included

    def stub_of(self, model: str) -> int:
        return next(pid for pid, name in python_stubs(self.triton_pid).items() if name == model)

    def wait(self, bound_s: float = HANG_BOUND_S) -> int:
        try:
            return self.process.wait(bound_s)
        except subprocess.TimeoutExpired:
            raise AssertionError(
                f"serve did not exit within {bound_s} s\n{self.output()}{self.stacks()}"
            ) from None

    def stacks(self) -> str:
        """Where serve and its OpenAI API stand (SIGUSR1: their Python stacks, toolkit/signals.py)."""
        api = [pid for pid in children_of(self.process.pid) if "toolkit.api" in command_line(pid)]
        for pid in (self.process.pid, *api):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGUSR1)
        time.sleep(1)
        log = cache_dir("logs") / f"openai-api-{self.ports['openai']}.log"  # api_process.launch_api
        api_stacks = log.read_text(errors="replace")[-6000:] if api and log.exists() else ""
        return f"\nserve's stacks (SIGUSR1):\n{self.output()[-6000:]}\nthe API's log:\n{api_stacks}"

    def output(self) -> str:
        self.stderr.flush()
        return self.stderr_path.read_text(errors="replace")

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)
            try:
                self.process.wait(60)
            except subprocess.TimeoutExpired:
                self.process.kill()
        for pid in self.processes:  # never leave a test's processes behind, whatever it asserted
            if process_alive(pid):
                os.kill(pid, signal.SIGKILL)
        self.stderr.close()


def _child_named(pid: int, name: str) -> int:
    for child in descendants(pid):
        try:
            if Path(f"/proc/{child}/comm").read_text().strip() == name:
                return child
        except OSError:
            continue
    raise AssertionError(f"no {name} under {pid}")


def descendants(pid: int) -> set[int]:
    found, frontier = set(), [pid]
    while frontier:
        children = children_of(frontier.pop())
        found.update(children)
        frontier += children
    return found


def survivors(pids: set[int], bound_s: float = 10) -> set[int]:
    """Which of `pids` still run after `bound_s` (zombies do not count)."""
    deadline = time.monotonic() + bound_s
    while time.monotonic() < deadline:
        alive = {pid for pid in pids if process_alive(pid)}
        if not alive:
            return set()
        time.sleep(0.2)
    return {pid for pid in pids if process_alive(pid)}


@pytest.fixture
def serving(bigram_repo, tmp_path):
    started = []

    def start(*extra: str, repo: Path | None = None, env: dict | None = None) -> Serving:
        started.append(Serving(repo or bigram_repo, tmp_path, *extra, env=env))
        return started[-1]

    yield start
    for s in started:
        s.close()


class EngineStream:
    """A long generation straight to tensorrt_llm over a gRPC stream; records how it ended."""

    def __init__(self, url: str, prompt_ids: list[int], max_tokens: int):
        import tritonclient.grpc as grpcclient

        self.results: queue.Queue = queue.Queue()
        self.client = grpcclient.InferenceServerClient(url)
        self.client.start_stream(callback=lambda result, error: self.results.put((result, error)))
        self.client.async_stream_infer(
            "tensorrt_llm",
            engine_inputs(prompt_ids, max_tokens, streaming=True),
            enable_empty_final_response=True,
        )
        self.tokens = 0

    def first_token(self) -> None:
        result, error = self.results.get(timeout=60)
        assert error is None, error
        self.tokens += result.as_numpy("output_ids").shape[-1]

    def outcome(self, bound_s: float) -> str:
        """'final' (a normal end), 'error: ...', or 'hung'."""
        deadline = time.monotonic() + bound_s
        while True:
            try:
                result, error = self.results.get(timeout=max(deadline - time.monotonic(), 0.01))
            except queue.Empty:
                return "hung"
            if error is not None:
                return f"error: {error}"
            ids = result.as_numpy("output_ids")
            self.tokens += 0 if ids is None else ids.shape[-1]
            if result.get_response().parameters["triton_final_response"].bool_param:
                return "final"

    def close(self) -> None:
        threading.Thread(
            target=self.client.stop_stream, kwargs={"cancel_requests": True}, daemon=True
        ).start()


class ApiStream:
    """A streamed completion through the OpenAI API, read on a thread; records what arrived and how it ended."""

    def __init__(self, base: str, prompt: str, max_tokens: int, **fields):
        self.fields = fields  # more of the body (min_tokens, ...)
        self.events: list[dict] = []
        self.ended: str | None = None
        self.first = threading.Event()
        self.done = threading.Event()
        self.thread = threading.Thread(
            target=self._read, args=(base, prompt, max_tokens), daemon=True
        )
        self.thread.start()

    def _read(self, base, prompt, max_tokens):
        body = {
            "model": "x",
            "prompt": prompt,
            "max_tokens": max_tokens,
            "stream": True,
            "temperature": 0,
            **self.fields,
        }
        try:
            model = httpx.get(f"{base}/v1/models", timeout=10).json()["data"][0]["id"]
            body["model"] = model
            with httpx.stream(
                "POST", f"{base}/v1/completions", json=body, timeout=httpx.Timeout(60)
            ) as response:
                if response.status_code != 200:
                    self.ended = f"status {response.status_code}: {response.read().decode()}"
                    return
                for event in sse_events(response.iter_lines()):
                    if event == DONE:
                        self.ended = "done"
                        return
                    self.events.append(event)
                    self.first.set()
            self.ended = "closed without [DONE]"
        except httpx.HTTPError as exc:
            self.ended = f"connection error: {type(exc).__name__}"
        finally:
            self.first.set()
            self.done.set()

    def outcome(self, bound_s: float) -> str:
        return self.ended if self.done.wait(bound_s) else "hung"

    def text(self) -> str:
        return "".join(c["choices"][0].get("text", "") for c in self.events if c.get("choices"))

    def finish_reason(self) -> str | None:
        reasons = [c["choices"][0].get("finish_reason") for c in self.events if c.get("choices")]
        return next((r for r in reversed(reasons) if r), None)

    def error(self) -> str | None:
        return next((e["error"]["message"] for e in self.events if "error" in e), None)


def _loop_ids(repo: Path) -> list[int]:
    vocab = json.loads((repo / "preprocessing/1/tokenizer/tokenizer.json").read_text())["model"][
        "vocab"
    ]
    return [vocab["<|begin_of_text|>"], vocab["▁loop"]]


def test_kill_9_of_the_engine_stub_ends_streams_with_an_error_and_serve_exits_naming_it(
    serving, bigram_repo
):
    serve = serving()
    grpc_stream = EngineStream(serve.grpc, _loop_ids(bigram_repo), 2000)
    api_stream = ApiStream(serve.api, "loop", 2000)
    grpc_stream.first_token()
    assert api_stream.first.wait(60) and api_stream.events, api_stream.ended
    stub = serve.stub_of("tensorrt_llm")
    killed_at = time.monotonic()
    os.kill(stub, signal.SIGKILL)
    try:
        grpc_end = grpc_stream.outcome(HANG_BOUND_S)
        api_end = api_stream.outcome(HANG_BOUND_S)
    finally:
        grpc_stream.close()
    assert grpc_end.startswith("error"), grpc_end
    # the API relays the engine's failure as an error event, or (when it is stopped first) closes the stream
    # without [DONE]: either way no client mistakes it for a complete answer
    assert api_end != "hung"
    assert api_stream.error() is not None or api_end.startswith(("closed", "connection")), (
        api_end,
        api_stream.events[-2:],
    )
    code = serve.wait()
    assert time.monotonic() - killed_at < HANG_BOUND_S + 5
    assert code != 0
    stderr = serve.output()
    assert "tensorrt_llm" in stderr and f"pid {stub}" in stderr and "died" in stderr
    assert not survivors(serve.processes), "processes outlived serve"


def test_kill_9_of_tritonserver_leaves_no_stub_behind_and_serve_says_so(serving, bigram_repo):
    serve = serving()
    stubs = set(python_stubs(serve.triton_pid))
    # tensorrt_llm, preprocessing, postprocessing, BLS (the ensemble has none)
    assert len(stubs) == 4
    api_stream = ApiStream(serve.api, "loop", 2000)
    assert api_stream.first.wait(60)
    os.kill(serve.triton_pid, signal.SIGKILL)
    assert api_stream.outcome(HANG_BOUND_S) != "hung"
    code = serve.wait()
    assert code != 0 and "tritonserver exited" in serve.output()
    assert not survivors(stubs), "a Python-backend stub outlived tritonserver"
    assert not survivors(serve.processes)


def test_sigterm_mid_stream_finishes_the_streams_and_refuses_new_requests(serving, bigram_repo):
    serve = serving("--drain-timeout", "60")
    grpc_stream = EngineStream(serve.grpc, _loop_ids(bigram_repo), 1500)
    api_stream = ApiStream(serve.api, "loop", 1500)
    grpc_stream.first_token()
    assert api_stream.first.wait(60)
    serve.process.send_signal(signal.SIGTERM)
    time.sleep(1.0)
    # the API stopped listening: a new request is refused at once
    with pytest.raises(httpx.HTTPError):
        httpx.post(
            f"{serve.api}/v1/completions", json={"model": "x", "prompt": "stop1"}, timeout=5
        ).raise_for_status()
    try:
        grpc_end = grpc_stream.outcome(60)
    finally:
        grpc_stream.close()
    api_end = api_stream.outcome(60)
    assert grpc_end == "final" and grpc_stream.tokens == 1500, (grpc_end, grpc_stream.tokens)
    assert api_end == "done" and api_stream.finish_reason() == "length", (
        api_end,
        api_stream.events[-1:],
    )
    assert api_stream.text().count("loop") == 1500
    assert serve.wait(30) == 0, serve.output()
    assert "finishing in-flight requests" in serve.output()
    assert not survivors(serve.processes)


def test_streams_longer_than_the_drain_timeout_are_cut_and_nothing_outlives_serve(
    serving, bigram_repo
):
    serve = serving("--drain-timeout", "1")
    grpc_stream = EngineStream(serve.grpc, _loop_ids(bigram_repo), 2000)
    api_stream = ApiStream(serve.api, "loop", 2000)
    grpc_stream.first_token()
    assert api_stream.first.wait(60)
    stopped_at = time.monotonic()
    serve.process.send_signal(signal.SIGTERM)
    try:
        grpc_end = grpc_stream.outcome(HANG_BOUND_S)
    finally:
        grpc_stream.close()
    api_end = api_stream.outcome(HANG_BOUND_S)
    assert grpc_end != "hung" and api_end != "hung"
    assert grpc_stream.tokens < 2000 or grpc_end != "final"  # cut, and the client can tell
    assert api_stream.finish_reason() != "length" or api_end != "done"
    serve.wait(HANG_BOUND_S)
    assert time.monotonic() - stopped_at < HANG_BOUND_S
    assert not survivors(serve.processes)


def _sigterm_while_streaming(serving, drain_timeout_s: int):
    """`toolkit serve --drain-timeout N` with one endless API stream under way, then SIGTERM:
    (the serve process, the stream)."""
    serve = serving("--drain-timeout", str(drain_timeout_s))
    api_stream = ApiStream(serve.api, "loop", 2000)
    assert api_stream.first.wait(60)
    serve.process.send_signal(signal.SIGTERM)
    return serve, api_stream


def test_the_exit_code_says_the_drain_timeout_cut_streams_or_not(serving, bigram_repo):
    """What tritonserver reports when its drain timeout cuts requests must not read as a crash."""
    serve, _ = _sigterm_while_streaming(serving, drain_timeout_s=1)
    code = serve.wait(HANG_BOUND_S)
    # tritonserver itself exits 1 when its exit timeout cuts requests: the stop the operator asked
    # for, said as such, not an error.
    assert code == 0 and "Error:" not in serve.output(), serve.output()
    assert "the drain timeout (1 s, --drain-timeout) ended requests" in serve.output()


def test_a_crash_while_draining_is_reported_not_called_a_clean_stop(serving, bigram_repo):
    serve, api_stream = _sigterm_while_streaming(serving, drain_timeout_s=60)
    time.sleep(1.0)  # draining: the stream still runs
    assert api_stream.outcome(0) == "hung"
    os.kill(serve.triton_pid, signal.SIGSEGV)
    code = serve.wait()
    assert code == 1, serve.output()
    assert f"tritonserver exited with code -{int(signal.SIGSEGV)} while stopping" in serve.output()
    assert "stopped\n" not in serve.output()
    assert not survivors(serve.processes)


def test_a_second_signal_stops_at_once_and_leaves_nothing(serving, bigram_repo):
    serve, api_stream = _sigterm_while_streaming(serving, drain_timeout_s=60)
    time.sleep(1.0)
    assert api_stream.outcome(0) == "hung"  # still draining
    serve.process.send_signal(signal.SIGINT)
    code = serve.wait(10)  # not the 60 s drain
    assert code == 128 + signal.SIGINT, serve.output()
    assert "stopped by SIGINT" in serve.output()
    assert api_stream.outcome(HANG_BOUND_S) != "hung"
    assert not survivors(serve.processes)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP, signal.SIGINT])
def test_a_stop_signal_during_start_up_leaves_nothing_behind(bigram_repo, tmp_path, sig):
    """While the models load (minutes for a GPU engine) a stop signal must end what started."""
    argv = [sys.executable, "-m", "toolkit.cli.main", "serve", "--repo", str(bigram_repo)]
    for name in ("http", "grpc", "metrics", "openai"):
        argv += [f"--{name}-port", str(free_port())]
    argv += ["--log-file", str(tmp_path / "tritonserver.log")]
    serve = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    seen: set[int] = set()
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and serve.poll() is None:
            seen |= descendants(serve.pid)
            if any(_comm(pid) == "triton_python_b" for pid in seen):  # a model is loading
                break
            time.sleep(0.05)
        else:
            raise AssertionError("no Python-backend stub started")
        serve.send_signal(sig)
        try:
            code = serve.wait(HANG_BOUND_S)
        except subprocess.TimeoutExpired:
            raise AssertionError("serve did not stop") from None
        stderr = serve.stderr.read()
        assert not survivors(seen), f"processes outlived serve: {survivors(seen)}\n{stderr}"
        if sig == signal.SIGINT:
            assert code == 1 and "Aborted!" in stderr, stderr
        else:
            assert code == 128 + sig and f"stopped by {signal.Signals(sig).name}" in stderr, stderr
        assert "Traceback" not in stderr, stderr
    finally:
        _kill_what_is_left(serve, seen)


def _kill_what_is_left(serve: subprocess.Popen, seen) -> None:
    """A failed test's clean-up: SIGKILL to the serve process and every process it was seen to start."""
    if serve.poll() is None:
        serve.kill()
    for pid in seen:
        if process_alive(pid):
            os.kill(pid, signal.SIGKILL)


def _comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


@pytest.fixture(scope="module")
def short_queue_repo(bigram_repo, tmp_path_factory):
    """Two batch slots and two queue places: a fifth concurrent request is over the bound."""
    return write_test_repository(
        bigram_repo.parent / "checkpoint",
        tmp_path_factory.mktemp("short-queue") / "repo",
        max_input_len=64,
        max_output_len=2000,
        max_seq_len=2064,
        kv_cache_tokens=8192,
        max_batch_size=2,
        max_queue_size=2,
    )


def test_the_cpu_engine_refuses_beyond_its_queue_bound_and_the_api_answers_429(
    serving, short_queue_repo
):
    serve = serving(repo=short_queue_repo)
    streams = [EngineStream(serve.grpc, _loop_ids(short_queue_repo), 1500) for _ in range(6)]
    try:
        time.sleep(1.0)  # all six have arrived: two run, two wait, two were refused at once
        api = httpx.post(
            f"{serve.api}/v1/completions",
            json={
                "model": httpx.get(f"{serve.api}/v1/models").json()["data"][0]["id"],
                "prompt": "stop1",
            },
            timeout=30,
        )
        assert api.status_code == 429 and "queue" in api.json()["error"]["message"], api.text
        assert api.headers.get("retry-after")
        outcomes = []
        for stream in streams:
            result, error = stream.results.get(timeout=60)
            outcomes.append(
                "refused"
                if error is not None and "Exceeds maximum queue size" in str(error)
                else "ok"
            )
        assert outcomes.count("ok") == 4 and outcomes.count("refused") == 2, outcomes
    finally:
        for stream in streams:
            stream.close()


def test_secrets_reach_no_argv_and_no_child_that_does_not_need_them_and_triton_stays_on_loopback(
    serving, tmp_path
):
    """-k reads a file; TOOLKIT_API_KEYS is read by serve. Neither may show in any process's argv, nor in
    the environment of tritonserver or its stubs; with --host 0.0.0.0 Triton's ports stay on 127.0.0.1."""
    key_file = tmp_path / "keys"
    key_file.write_text("sk-from-the-file\n")
    serve = serving(
        "--host",
        "0.0.0.0",
        "--api-key-file",
        str(key_file),
        env={"TOOLKIT_API_KEYS": "sk-from-the-env"},
    )
    secrets = (b"sk-from-the-file", b"sk-from-the-env")
    for pid in descendants(serve.process.pid) | {serve.process.pid}:
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes()
        except (FileNotFoundError, ProcessLookupError):
            continue  # it exited between the listing and the read (seen once in a full run)
        assert not any(secret in argv for secret in secrets), argv
    triton = [serve.triton_pid, *python_stubs(serve.triton_pid)]
    for pid in triton:
        environ = Path(f"/proc/{pid}/environ").read_bytes()
        assert not any(secret in environ for secret in secrets), (
            f"a secret is in the environment of {pid}"
        )
    argv = Path(f"/proc/{serve.triton_pid}/cmdline").read_bytes().decode().split("\0")
    assert "--http-address=127.0.0.1" in argv and "--grpc-address=127.0.0.1" in argv
    for key in ("sk-from-the-file", "sk-from-the-env"):  # and both keys work at the API
        answer = httpx.get(
            f"{serve.api}/v1/models", headers={"Authorization": f"Bearer {key}"}, timeout=10
        )
        assert answer.status_code == 200
    assert httpx.get(f"{serve.api}/v1/models", timeout=10).status_code == 401


def test_a_non_loopback_host_without_the_api_is_refused(bigram_repo):
    from click.testing import CliRunner

    from toolkit.cli.main import cli

    result = CliRunner().invoke(cli, ["serve", "--repo", str(bigram_repo), "--host", "0.0.0.0"])
    assert result.exit_code == 1
    assert "--openai-port" in result.output and "--expose-triton" in result.output


def test_the_openai_api_process_stops_on_sighup(bigram_repo, tmp_path):
    """A closed terminal: `toolkit api` (and serve's API process) drains and exits, as on SIGTERM."""
    from toolkit.api.app import ApiSettings
    from toolkit.serve.api_process import launch_api

    server = launch_on_free_ports(bigram_repo, tmp_path / "triton.log", 600)
    try:
        api, _log = launch_api(
            ApiSettings(server.grpc_url, bigram_repo), host="127.0.0.1", port=free_port()
        )
        api.send_signal(signal.SIGHUP)
        assert api.wait(HANG_BOUND_S) == 0
    finally:
        server.stop(10)


def test_signals_ignored_on_start_stay_ignored():
    """nohup ignores SIGHUP so that a build or a server outlives the terminal: never undo that."""
    from toolkit.signals import deferred_interrupts, stop_signals_raise

    previous = signal.signal(signal.SIGHUP, signal.SIG_IGN)
    try:
        with stop_signals_raise():
            assert signal.getsignal(signal.SIGHUP) is signal.SIG_IGN
            assert signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL
            with deferred_interrupts():
                assert signal.getsignal(signal.SIGHUP) is signal.SIG_IGN
        assert signal.getsignal(signal.SIGHUP) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGHUP, previous)


# --- round two: ghost requests, orphans, shared memory, a paused engine ----------------------------
STOP_BOUND_S = 10  # a stop after any fault: everything gone within this


def _shm_segments(prefix: str) -> dict[str, int]:
    """The Python backend's shared-memory regions of one server (name -> permission bits)."""
    return {
        entry.name: entry.stat().st_mode & 0o777
        for entry in Path("/dev/shm").iterdir()
        if entry.name.startswith(prefix)
    }


def _shm_prefix(serve: Serving) -> str:
    return f"toolkit_{serve.process.pid}_{serve.ports['grpc']}_"


def _ensemble_stream(url: str, max_tokens: int):
    """A streamed request to the ensemble over gRPC, as perf_analyzer (toolkit bench) sends it."""
    import numpy as np
    import tritonclient.grpc as grpcclient

    results: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(url)
    client.start_stream(callback=lambda result, error: results.put((result, error)))
    inputs = []
    for name, value, dtype in (
        ("text_input", np.array([["loop"]], dtype=object), "BYTES"),
        ("max_tokens", np.array([[max_tokens]], dtype=np.int32), "INT32"),
        ("stream", np.array([[True]], dtype=bool), "BOOL"),
    ):
        tensor = grpcclient.InferInput(name, list(value.shape), dtype)
        tensor.set_data_from_numpy(value)
        inputs.append(tensor)
    client.async_stream_infer("ensemble", inputs)
    return client, results


def _engine_state(metrics_url: str) -> tuple[float, float]:
    """The engine's last report: (requests it held, when it reported, us since the epoch), read as serve's
    drain reads it (toolkit.serve.drain.read). It reports every cancellation check, so a reading is up
    to that period old."""
    from toolkit.serve.drain import read

    engines = read(httpx.get(metrics_url, timeout=10).text).engines
    if len(engines) != 1 or not next(iter(engines.values()))[1]:
        raise AssertionError(f"the engine's active requests or report time is missing: {engines}")
    return next(iter(engines.values()))


def _engine_ended_everything(metrics_url: str, since_s: float, timeout_s: float) -> bool:
    """Whether a report of the engine made after `since_s` (time.time()) shows it holding nothing: an
    older one may predate a request it holds now."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        active, reported_us = _engine_state(metrics_url)
        if reported_us > since_s * 1e6 and not active:
            return True
        time.sleep(0.2)
    return False


def test_a_cancelled_ensemble_stream_leaves_no_ghost_and_the_next_stop_is_prompt(
    serving, bigram_repo
):
    """Triton 2.51's ensemble loses a request whose postprocessing step is refused as cancelled while
    the engine still streams: it stays "in flight" for good and every stop waits the whole drain."""
    serve = serving()
    metrics = f"http://127.0.0.1:{serve.ports['metrics']}/metrics"
    client, results = _ensemble_stream(serve.grpc, 1500)
    for _ in range(5):
        result, error = results.get(timeout=60)
        assert error is None, error
    cancelled_at = time.time()
    client.stop_stream(cancel_requests=True)  # the client goes (a bench interrupted, a closed tab)
    # The engine ends its part of the request (it runs to its end, or stops). A report from before the
    # request reads 0 too: waiting on that one sent the stop while the engine still streamed.
    assert _engine_ended_everything(metrics, cancelled_at, 60), "the engine never ended it"
    stopped_at = time.monotonic()
    serve.process.send_signal(signal.SIGTERM)
    code = serve.wait(60)
    took = time.monotonic() - stopped_at
    assert code == 0, serve.output()
    assert took < STOP_BOUND_S, f"the stop took {took:.1f} s\n{serve.output()}"
    assert "drain timeout" not in serve.output()
    assert not survivors(serve.processes)


def _read_to_the_end(results: queue.Queue, timeout_s: float) -> tuple[int, str | None]:
    """(responses read, the error that ended the stream or None) up to the stream's final response."""
    count = 0
    while True:
        try:
            result, error = results.get(timeout=timeout_s)
        except queue.Empty:
            return count, f"no response for {timeout_s} s"
        if error is not None:
            return count, str(error)
        count += 1
        final = result.get_response().parameters.get("triton_final_response")
        if final is not None and final.bool_param:
            return count, None


def test_an_ensemble_stream_under_way_at_a_stop_gets_every_token_and_the_stop_is_prompt(
    serving, bigram_repo
):
    """tritonserver 2.51 refuses to enqueue anything once it is stopping, and an ensemble enqueues a
    postprocessing step per response: a stream under way at its SIGTERM stalled (312 of 2000 tokens
    here), the stop waited out the whole drain, and the client got UNAVAILABLE. serve now drains the
    engines before it signals tritonserver."""
    serve = serving("--drain-timeout", "30")
    client, results = _ensemble_stream(serve.grpc, 2000)  # ~3 s of streaming
    try:
        for _ in range(5):
            result, error = results.get(timeout=60)
            assert error is None, error
        serve.process.send_signal(signal.SIGTERM)
        count, error = _read_to_the_end(results, 30)
        assert (count, error) == (1995, None), (count, error)  # 5 read above; the last is the final
    finally:
        client.stop_stream()  # the client goes once it has its answer, as perf_analyzer does
    ended_at = time.monotonic()
    assert serve.wait(60) == 0, serve.output()
    took = time.monotonic() - ended_at
    assert took < STOP_BOUND_S, (
        f"the stop took {took:.1f} s after the stream ended\n{serve.output()}"
    )
    assert "drain timeout" not in serve.output()
    assert not survivors(serve.processes)


def test_a_client_holding_an_idle_grpc_stream_does_not_hold_the_stop_for_the_drain(
    serving, bigram_repo
):
    """Triton 2.51 keeps a model loaded while a client's gRPC stream whose last request went to it stays
    open, and its stop waited for that until its exit timeout (here 60 s) with nothing to run."""
    from toolkit.serve.drain import PINNED_S

    serve = serving("--drain-timeout", "60")
    client, results = _ensemble_stream(serve.grpc, 20)
    try:
        assert _read_to_the_end(results, 60) == (20, None)  # answered in full
        stopped_at = time.monotonic()
        serve.process.send_signal(signal.SIGTERM)  # the client keeps its stream open, idle
        code = serve.wait(60)
        took = time.monotonic() - stopped_at
    finally:
        client.stop_stream()
    assert code == 0, serve.output()
    assert took < PINNED_S + STOP_BOUND_S, f"the stop took {took:.1f} s\n{serve.output()}"
    assert "still had 1 model(s) loaded, with clients connected" in serve.output(), serve.output()
    assert "drain timeout (" not in serve.output()
    assert not survivors(serve.processes)


def test_kill_9_of_serve_leaves_no_process_and_no_shared_memory(serving, served_repo):
    """A real model (SmolLM2) busy generating: its stub, orphaned, kept generating for minutes."""
    serve = serving(repo=served_repo.repo)
    prefix = _shm_prefix(serve)
    assert _shm_segments(prefix), "no shared-memory region found for this server"
    streams = [ApiStream(serve.api, "Once upon a time", 200, min_tokens=200) for _ in range(3)]
    assert all(stream.first.wait(120) for stream in streams)
    os.kill(serve.process.pid, signal.SIGKILL)
    serve.process.wait(10)
    left = survivors(serve.processes, STOP_BOUND_S)
    assert not left, {pid: _comm(pid) for pid in left}
    assert not _shm_segments(prefix), _shm_segments(prefix)


def test_shared_memory_is_owner_only_and_gone_after_each_kind_of_stop(serving, bigram_repo):
    serve = serving()
    prefix = _shm_prefix(serve)
    segments = _shm_segments(prefix)
    assert len(segments) == 4, segments  # one per Python model instance
    assert set(segments.values()) == {0o600}, segments  # prompts and outputs pass through them
    os.kill(serve.triton_pid, signal.SIGKILL)  # an abnormal stop: nobody unloads the models
    # What is checked is what a killed server leaves, not how fast serve notices: under a loaded full
    # suite its exit once took over HANG_BOUND_S (alone, ~2 s).
    serve.wait(2 * HANG_BOUND_S)
    assert not survivors(serve.processes, STOP_BOUND_S)
    assert not _shm_segments(prefix), _shm_segments(prefix)


def test_a_failed_start_leaves_no_shared_memory(served_repo, tmp_path):
    """A start given up while a model still loads (--ready-timeout): what it started is killed mid-load."""
    from toolkit.errors import ServerError

    before = set(_shm_segments("toolkit_"))
    with pytest.raises(ServerError, match="not ready"):
        launch_on_free_ports(served_repo.repo, tmp_path / "triton.log", 3)
    time.sleep(1)
    left = set(_shm_segments(f"toolkit_{os.getpid()}_")) - before
    assert not left, left


def test_a_paused_engine_fails_over_cleanly(serving, bigram_repo):
    """SIGSTOP of the engine's stub (a frozen cgroup, a stuck debugger): streams end, serve says which
    process stalled and stops everything instead of hanging or aborting."""
    serve = serving()
    prefix = _shm_prefix(serve)
    api_stream = ApiStream(serve.api, "loop", 2000)
    assert api_stream.first.wait(60)
    stub = serve.stub_of("tensorrt_llm")
    paused_at = time.monotonic()
    os.kill(stub, signal.SIGSTOP)
    try:
        code = serve.wait(HANG_BOUND_S + 10)
    finally:
        if process_alive(stub):
            os.kill(stub, signal.SIGCONT)
    assert time.monotonic() - paused_at < HANG_BOUND_S + 10
    assert code == 1, serve.output()
    assert "tensorrt_llm" in serve.output() and "stopped" in serve.output(), serve.output()
    assert api_stream.outcome(HANG_BOUND_S) != "hung"
    assert "Traceback" not in serve.output() and "lock_exception" not in serve.output()
    assert not survivors(serve.processes, STOP_BOUND_S)
    assert not _shm_segments(prefix)


def test_nan_weights_served_with_allow_modified_never_turn_health_green(bigram_repo, tmp_path):
    """Modified weights served anyway (--allow-modified): NaN in them made every request a 502 while
    /health stayed 200. The engine checks its logits once as it loads, so the server never comes up."""
    import torch
    from safetensors.torch import load_file, save_file

    broken = tmp_path / "repo"
    shutil.copytree(bigram_repo, broken)
    weights = broken / "tensorrt_llm/1/weights/model.safetensors"
    tensors = load_file(weights)
    tensors["lm_head.weight"] = torch.full_like(tensors["lm_head.weight"], float("nan"))
    save_file(tensors, weights, metadata={"format": "pt"})
    argv = [sys.executable, "-m", "toolkit.cli.main", "serve", "--repo", str(broken)]
    ports = {name: free_port() for name in ("http", "grpc", "metrics", "openai")}
    for name, port in ports.items():
        argv += [f"--{name}-port", str(port)]
    argv += ["--log-file", str(tmp_path / "triton.log"), "--allow-modified"]
    serve = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    seen: set[int] = set()
    try:
        deadline = time.monotonic() + 180
        while serve.poll() is None and time.monotonic() < deadline:
            seen |= descendants(serve.pid)
            try:
                health = httpx.get(f"http://127.0.0.1:{ports['openai']}/health", timeout=2)
            except httpx.HTTPError:
                health = None
            assert health is None or health.status_code != 200, "health is green over NaN weights"
            time.sleep(0.5)
        assert serve.poll() is not None, "serve kept serving NaN weights"
        stderr = serve.stderr.read()
        assert serve.returncode == 1, stderr
        assert "non-finite" in stderr and "tensorrt_llm" in stderr, stderr
        assert not survivors(seen)
    finally:
        _kill_what_is_left(serve, seen)


class _FakeServer:
    """What start_serving gets from launch_server, without tritonserver: a process to stop."""

    def __init__(self, tmp_path: Path):
        from toolkit.serve.launcher import ServerConfig

        self.process = subprocess.Popen(["sleep", "60"], start_new_session=True)
        self.pid = self.process.pid
        self.config = ServerConfig(tmp_path, exit_timeout_s=5)
        self.log_file = tmp_path / "tritonserver.log"
        self.log_file.write_text("")
        self.grpc_url = "127.0.0.1:1"
        self.http_url = "127.0.0.1:2"
        self.drain_outcome: str | None = None
        self.held_models = 0

    def stop(self, timeout_s: float | None = None) -> int | None:
        self.process.terminate()
        return self.process.wait(timeout_s)

    def release_shared_memory(self) -> None:
        pass


@pytest.fixture
def fake_parts():
    """The `sleep` processes a test's fake parts are; none outlives the test."""
    started: list[subprocess.Popen] = []
    yield started
    for process in started:
        process.kill()
        process.wait()


def _serve_with_fake_parts(monkeypatch, tmp_path, on_api_launch, started):
    """start_serving with tritonserver and the API replaced by `sleep` processes (added to `started`);
    `on_api_launch(watch)` runs while the API starts (a signal arriving then). Returns (the fake server,
    the API process, the options)."""
    from toolkit.serve import api_process, lifecycle
    from toolkit.serve.launcher import ServerConfig

    server = _FakeServer(tmp_path)
    api = subprocess.Popen(["sleep", "60"], start_new_session=True)  # a session, as start_process
    started += [server.process, api]
    monkeypatch.setattr(lifecycle, "launch_server", lambda config, on_wait, detached=False: server)

    def launch_api(settings, **kwargs):
        if kwargs.get("on_started"):
            kwargs["on_started"](api)
        on_api_launch(kwargs.get("watch"))
        return api, tmp_path / "api.log"

    monkeypatch.setattr(api_process, "launch_api", launch_api)
    options = lifecycle.ServeOptions(ServerConfig(tmp_path), openai_port=free_port())
    return server, api, options


def test_a_stop_signal_just_after_the_api_answers_health_drains_instead_of_killing(
    monkeypatch, tmp_path, fake_parts
):
    """A client (a readiness probe) can see /health before serve's own poll does: a SIGTERM then
    (Kubernetes deleting a pod that just became ready) must drain what is in flight, as it does a
    second later, not abort start-up: exit 143, streams cut by start-up's short stop bounds (or
    SIGKILLed, once start_serving had returned). Seen in CI: "stopped by SIGTERM" mid-drain test."""
    from toolkit.serve import lifecycle
    from toolkit.signals import stop_signals_raise

    server, api, options = _serve_with_fake_parts(
        monkeypatch, tmp_path, lambda _watch: os.kill(os.getpid(), signal.SIGTERM), fake_parts
    )
    with stop_signals_raise():
        session = lifecycle.start_serving(options)  # before the fix: Stopped
        assert session.stop_requested == signal.SIGTERM
        session.run_until_stopped()  # drains: both asked to stop, neither killed
    assert server.process.returncode == -signal.SIGTERM and api.returncode == -signal.SIGTERM


def test_a_part_that_dies_is_announced_in_one_line_and_its_log_shown_once(
    monkeypatch, tmp_path, fake_parts
):
    """serve printed `<failure, with the API's log tail>; stopping`: "; stopping" dangled after the
    log's last line, and the error printed next showed the same tail again."""
    from toolkit.errors import ServerError
    from toolkit.serve import lifecycle
    from toolkit.signals import stop_signals_raise

    _, api, options = _serve_with_fake_parts(monkeypatch, tmp_path, lambda _watch: None, fake_parts)
    (tmp_path / "api.log").write_text("Traceback (most recent call last):\nValueError: boom\n")
    events: list[str] = []
    with stop_signals_raise():
        session = lifecycle.start_serving(options)
        api.kill()
        api.wait()
        with pytest.raises(ServerError) as raised:
            session.run_until_stopped(events.append)
    assert len(events) == 1 and "\n" not in events[0], events
    assert "the OpenAI API exited with code -9" in events[0] and "stopping" in events[0]
    assert "ValueError: boom" not in events[0] and "ValueError: boom" in raised.value.message


def _wait_for_an_api_that_never_answers(watch) -> None:
    from toolkit.serve.net import wait_http_ok

    wait_http_ok(f"http://127.0.0.1:{free_port()}/health", 30, watch=watch)


def test_a_stop_signal_before_the_api_is_healthy_still_aborts_start_up(
    monkeypatch, tmp_path, fake_parts
):
    from toolkit.serve import lifecycle
    from toolkit.signals import Stopped, stop_signals_raise

    def signalled(watch):
        os.kill(os.getpid(), signal.SIGTERM)
        _wait_for_an_api_that_never_answers(watch)

    server, api, options = _serve_with_fake_parts(monkeypatch, tmp_path, signalled, fake_parts)
    started = time.monotonic()
    with stop_signals_raise(), pytest.raises(Stopped) as stopped:
        lifecycle.start_serving(options)
    assert stopped.value.signum == signal.SIGTERM
    assert time.monotonic() - started < 10  # not the 30 s health wait
    assert server.process.poll() is not None  # what started was stopped


def test_tritonserver_dying_while_the_api_starts_is_named_at_once(
    monkeypatch, tmp_path, fake_parts
):
    """The API's /health waits on Triton: with Triton dead, serve waited out the API's whole start
    timeout (60 s), then blamed the API. Seen in CI: a test killed Triton as soon as /health answered
    it, before serve's own poll did."""
    from toolkit.errors import ServerError
    from toolkit.serve import lifecycle

    def triton_dies(watch):
        server.process.kill()
        _wait_for_an_api_that_never_answers(watch)

    server, api, options = _serve_with_fake_parts(monkeypatch, tmp_path, triton_dies, fake_parts)
    started = time.monotonic()
    with pytest.raises(ServerError) as failed:
        lifecycle.start_serving(options)
    assert time.monotonic() - started < 10
    assert (
        "while the OpenAI API was starting, tritonserver exited with code -9"
        in failed.value.message
    )


def _catches(pid: int, sig: int) -> bool:
    """Whether `pid` has a handler for `sig` (the SigCgt mask of /proc/PID/status)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("SigCgt:"):
            return bool(int(line.split()[1], 16) >> (sig - 1) & 1)
    return False


# The toolkit entry point (main()) running a command that waits on stdin, as serve waits on its servers;
# the API's entry point waits on stdin for its settings.
_WAITING = {
    "toolkit": "import sys, click, toolkit.cli.main as m; "
    "m.cli.add_command(click.Command('wait', callback=sys.stdin.read)); sys.argv = ['toolkit', 'wait']; m.main()",
    "toolkit.api": "import runpy; runpy.run_module('toolkit.api', run_name='__main__')",
}


@pytest.mark.parametrize("entry", sorted(_WAITING))
def test_sigusr1_dumps_where_a_process_stands_and_it_runs_on(entry):
    """`kill -USR1` on serve or its API: every thread's stack on stderr, the process untouched (how a
    stuck stop is diagnosed, here and by the tests above when serve does not exit)."""
    process = subprocess.Popen(
        [sys.executable, "-c", _WAITING[entry]],
        stdin=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 60
        while not _catches(process.pid, signal.SIGUSR1):  # its entry point has registered the dump
            assert process.poll() is None and time.monotonic() < deadline, "SIGUSR1 never caught"
            time.sleep(0.1)
        process.send_signal(signal.SIGUSR1)
        time.sleep(1)
        assert process.poll() is None  # it runs on
    finally:
        process.stdin.close()
        stderr = process.stderr.read()
        process.wait(30)
    assert "most recent call first" in stderr and "main" in stderr, stderr


def _two_signals(_watch) -> None:
    os.kill(os.getpid(), signal.SIGTERM)
    os.kill(os.getpid(), signal.SIGINT)  # the second: at once


def test_a_second_signal_while_the_api_starts_kills_it_at_once(monkeypatch, tmp_path, fake_parts):
    """The second signal SIGKILLs the API that has not answered yet too (serve knew only Triton's
    process until the API answered: a hung API start held serve for its 20 s stop)."""
    from toolkit.serve import lifecycle
    from toolkit.signals import Stopped, stop_signals_raise

    def starting(watch):
        _two_signals(watch)
        _wait_for_an_api_that_never_answers(watch)

    server, api, options = _serve_with_fake_parts(monkeypatch, tmp_path, starting, fake_parts)
    started = time.monotonic()
    with stop_signals_raise(), pytest.raises(Stopped) as stopped:
        lifecycle.start_serving(options)
    assert stopped.value.signum == signal.SIGINT  # said as the signal that stopped it
    assert api.wait(5) == -signal.SIGKILL and server.process.poll() is not None
    assert time.monotonic() - started < 10


def test_two_signals_just_after_the_api_answers_stop_at_once_said_as_a_stop(
    monkeypatch, tmp_path, fake_parts
):
    """Both before the drain loop starts: everything killed, the exit the second signal's (128+N), not
    "tritonserver exited with code -9" as if it had crashed."""
    from toolkit.serve import lifecycle
    from toolkit.signals import Stopped, stop_signals_raise

    server, api, options = _serve_with_fake_parts(monkeypatch, tmp_path, _two_signals, fake_parts)
    with stop_signals_raise(), pytest.raises(Stopped) as stopped:
        lifecycle.start_serving(options)
    assert stopped.value.signum == signal.SIGINT
    assert api.wait(5) == -signal.SIGKILL and server.process.wait(5) == -signal.SIGKILL
