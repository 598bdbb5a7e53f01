"""The serve lifecycle: start tritonserver (and the OpenAI API), watch them, stop them, say how it ended.

    start_serving(options, on_wait) -> ServeSession      everything up and ready
    session.run_until_stopped(on_event) -> None          blocks; SIGINT/SIGTERM/SIGHUP drain and stop
                                                          (a second one stops at once: Stopped);
                                                          ServerError when a part dies on its own
    session.kill() -> None                                SIGKILL every process we started, at once

A dead part is never left behind a healthy-looking front: when tritonserver exits, the API exits,
or a model's Python-backend stub dies (the engine, pre/postprocessing, BLS), everything is stopped
(open streams end with an error as their connections close) and ServerError names what died, also
when it dies while a stop signal is being handled. No process of ours outlives the session: each
child's whole session (toolkit.subprocs) is ended on every exit; a stop signal during start-up ends what started
(SIGTERM and SIGHUP raise there, toolkit/signals.py).
"""

from __future__ import annotations

import dataclasses
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from toolkit.errors import ServerError
from toolkit.serve.launcher import RunningServer, ServerConfig, launch_server, log_tail
from toolkit.serve.net import check_port_free, client_host
from toolkit.settings import ApiLimits
from toolkit.signals import STOP_SIGNALS, Stopped, deferred_interrupts, replace, restore
from toolkit.subprocs import (
    command_line,
    process_alive,
    process_stopped,
    session_members,
    signal_session,
    stop_process,
    tail_lines,
)
from toolkit.trace.config import TracePlan

STUB = "triton_python_backend_stub"
WATCH_INTERVAL_S = 0.5
FAULT_GRACE_S = 2.0  # after a part died: how long tritonserver gets to exit before it is killed
# A stub stopped by a signal this long (SIGSTOP, a frozen cgroup) is taken as dead: its requests cannot
# move, and tritonserver, timing out on the locks the stub holds, may abort mid-stream.
STALLED_STUB_S = 5.0


@dataclass(frozen=True)
class ServeOptions:
    server: ServerConfig
    openai_port: int | None = None
    api_host: str = "127.0.0.1"
    api_keys: tuple[str, ...] = ()
    max_in_flight: int = 64
    api_log: Path | None = None
    api_limits: ApiLimits = ApiLimits()  # the OpenAI API's timeouts, body size and body read budget
    trace: TracePlan | None = None  # every layer's tracing (toolkit.trace.config); None: off
    api_workers: int = 1  # OpenAI API processes on its one port (toolkit.api.workers)
    # Triton traces only what carries a context: an API in front samples (also with openai_port).
    trace_context_only: bool = False
    tool_parser: str = "auto"  # how the OpenAI API reads tool calls (toolkit.api.tool_parsers)
    # The OpenAI API trusts special tokens in message content.
    special_tokens_in_messages: bool = False
    stream_interval: int = 1  # the OpenAI API's engine steps per streamed chunk (--stream-interval)
    # How the OpenAI API reads the engine: http (generate_stream; log probs, logit bias over gRPC), grpc.
    engine_transport: str = "http"


@dataclass
class ServeSession:
    options: ServeOptions
    server: RunningServer
    api: subprocess.Popen | None = None
    api_log: Path | None = None
    stubs: dict[int, str] = field(default_factory=dict)  # pid -> model name
    stop_requested: int | None = None  # the signal that asked us to stop
    forced: int | None = None  # a second stop signal: killed without waiting
    stopped_since: dict[int, float] = field(default_factory=dict)  # stub pid -> when seen stopped
    # The stop-signal handlers ours replaced while we hold them (hold_stop_signals), else None.
    replaced_handlers: dict | None = None
    # The API process from its start, before it answers (api is set then): what kill() ends meanwhile.
    starting_api: subprocess.Popen | None = None

    def endpoints(self) -> dict:
        found = {
            "http": self.server.http_url,
            "grpc": self.server.grpc_url,
            "metrics": self.server.metrics_url,
            "pid": self.server.pid,
            "log": str(self.server.log_file),
        }
        if self.api is not None:
            host = client_host(self.options.api_host)
            found.update(
                {
                    "openai": f"http://{host}:{self.options.openai_port}/v1",
                    "openai_pid": self.api.pid,
                    "openai_log": str(self.api_log),
                }
            )
        return found

    def run_until_stopped(self, on_event: Callable[[str], None] = lambda _: None) -> None:
        """Block until a stop signal (then drain and stop: returns) or until a part dies (ServerError).
        A signal that arrived since start_serving returned (its stop_requested) drains at once; a second
        one since (forced) has killed everything already: Stopped."""
        self.hold_stop_signals()
        try:
            if self.forced is not None:  # its handler killed everything already
                raise Stopped(self.forced)
            while self.stop_requested is None:
                failure = self.check()
                if failure:
                    # its first line: the error raised next shows the whole of it (a log's tail)
                    on_event(f"[red]{failure.splitlines()[0]}[/]: stopping everything")
                    self.stop_after_fault()
                    raise ServerError(failure, hint=f"read the server log: {self.server.log_file}")
                time.sleep(WATCH_INTERVAL_S)
            on_event(
                f"{signal.Signals(self.stop_requested).name}: finishing in-flight requests, then stopping"
                " (again to stop at once)"
            )
            failure = self.check()  # died just before the signal, within the last watch interval
            if failure:
                self.stop_after_fault()
                raise ServerError(failure, hint=f"read the server log: {self.server.log_file}")
            server_code, api_code = self.stop()
            if self.forced is not None:
                raise Stopped(self.forced)
            if self.server.held_models:
                on_event(
                    "[yellow]tritonserver had finished every request but still had "
                    f"{self.server.held_models} model(s) loaded, with clients connected to its gRPC port "
                    "(Triton 2.51 keeps a model loaded while a client's stream whose last request went to "
                    "it stays open), so it was ended instead of waiting out the drain timeout[/]"
                )
            # Triton's exit timeout cut them (it exits 1), or it was killed as the drain ran out (its
            # engines still busy) or 5 s past it, still finishing them
            cut = server_code == 1 and _drain_cut(self.server.log_file)
            if cut or (server_code == -signal.SIGKILL and not self.server.held_models):
                on_event(
                    f"[yellow]the drain timeout ({self.server.config.exit_timeout_s:g} s, --drain-timeout) "
                    "ended requests that were still running[/]"
                )
                server_code = 0  # what the operator asked for, not a crash
            failure = _stopped_badly(server_code, api_code)
            if failure:
                raise ServerError(failure, hint=f"read the server log: {self.server.log_file}")
        finally:
            self.release_stop_signals()

    def hold_stop_signals(self) -> None:
        """From now on a first stop signal asks for a drain (stop_requested), a second kills at once."""
        if self.replaced_handlers is None:
            self.replaced_handlers = replace(STOP_SIGNALS, self._request_stop)

    def release_stop_signals(self) -> None:
        if self.replaced_handlers is not None:
            restore(self.replaced_handlers)
            self.replaced_handlers = None

    def check(self) -> str | None:
        """What has died on its own, or None while everything runs."""
        code = self.server.process.poll()
        if code is not None:
            # Which stubs were gone by then: tritonserver 2.51 may abort as a stub is killed (or the stubs
            # end within their watch interval after it), so the log alone does not say which came first.
            dead = ", ".join(
                f"{model} (pid {pid})"
                for pid, model in self.stubs.items()
                if not process_alive(pid)
            )
            gone = (
                f", and these models' processes (Python-backend stubs) died: {dead}" if dead else ""
            )
            return f"tritonserver exited with code {code}{gone}\n{log_tail(self.server.log_file)}"
        if self.api is not None and self.api.poll() is not None:
            tail = "\n".join(tail_lines(self.api_log, 15)) if self.api_log else ""
            return f"the OpenAI API exited with code {self.api.returncode}\n{tail}"
        for pid, model in self.stubs.items():
            if not process_alive(pid):
                return (
                    f"the {model} model's process (Python-backend stub, pid {pid}) died; Triton would keep "
                    "reporting it ready while failing every request, so the server is stopped"
                )
            stalled = self._stalled_for(pid)
            if stalled >= STALLED_STUB_S:
                return (
                    f"the {model} model's process (Python-backend stub, pid {pid}) has been stopped "
                    f"(SIGSTOP or a frozen cgroup) for {stalled:.0f} s; its requests cannot progress and Triton "
                    "would keep reporting it ready, so the server is stopped"
                )
        return None

    def check_starting(self) -> None:
        """While the API starts: Stopped for a stop signal received, ServerError for a part that died
        (tritonserver, a stub: the API's health would wait on it until its start timeout)."""
        if self.stop_requested is not None:
            raise Stopped(self.stop_requested)
        failure = self.check()
        if failure:
            raise ServerError(
                f"while the OpenAI API was starting, {failure}",
                hint=f"read the server log: {self.server.log_file}",
            )

    def _stalled_for(self, pid: int) -> float:
        """How long `pid` has been seen stopped by a signal (0 while it runs)."""
        if not process_stopped(pid):
            self.stopped_since.pop(pid, None)
            return 0.0
        return time.monotonic() - self.stopped_since.setdefault(pid, time.monotonic())

    def stop(self) -> tuple[int | None, int | None]:
        """Stop both at once, draining: the API stops admitting at once and finishes its streams as Triton
        finishes them; Triton is signalled once its engines hold nothing (RunningServer.stop), all within
        the drain timeout. Returns their exit codes (Triton's, the API's)."""
        grace = self.server.config.exit_timeout_s + 5
        codes: dict[str, int | None] = {"server": None, "api": None}

        def stop_server() -> None:
            codes["server"] = self.server.stop()  # drains the engines, then signals

        def stop_api() -> None:
            if self.api is not None:
                codes["api"] = stop_process(self.api, grace)

        threads = [threading.Thread(target=stop_server)]
        if self.api is not None:
            threads.append(threading.Thread(target=stop_api))
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        return codes["server"], codes["api"]

    def kill(self) -> None:
        """SIGKILL every process of tritonserver's and the API's sessions now (a second stop signal)."""
        for process in (self.server.process, self.api or self.starting_api):
            if process is not None:
                signal_session(process.pid, signal.SIGKILL)
        self.server.release_shared_memory()

    def stop_after_fault(self) -> None:
        """Stop at once: requests on a dead part never finish, so draining would only hold clients for
        the whole drain timeout. Triton goes first (its streams end with an error as it closes them),
        then the API, which relays those errors to its own streams before it exits."""
        self.server.stop(FAULT_GRACE_S)
        if self.api is not None:
            stop_process(self.api, FAULT_GRACE_S + 5)

    def _request_stop(self, signum, _frame) -> None:
        if self.stop_requested is None:
            self.stop_requested = signum
            return
        # A second signal: stop waiting for in-flight requests. Kill rather than raise here: an
        # exception would land wherever the main thread is (joining the stop threads) and abandon them.
        self.forced = signum
        self.kill()


def start_serving(
    options: ServeOptions,
    on_wait: Callable[[str], None] = lambda _: None,
    *,
    detached: bool = False,
) -> ServeSession:
    """Start tritonserver, wait for its models, then the OpenAI API if asked; on any failure stop what started.
    The API's port is checked first: a busy one is named before the minutes a GPU engine takes to load."""
    if options.openai_port is not None:
        check_port_free(options.api_host, options.openai_port, "--openai-port")
    config = options.server
    if options.trace is not None:
        behind_api = options.openai_port is not None or options.trace_context_only
        config = dataclasses.replace(config, trace=options.trace, traced_by_api=behind_api)
    server = launch_server(config, on_wait, detached=detached)
    session = ServeSession(options, server)
    try:
        session.stubs = python_stubs(server.pid)
        # Triton answers requests from here on, and the API from the moment it answers /health, which
        # a client (a readiness probe) may see before our own poll does: a stop signal from now on is
        # the session's, so that one arriving just after start-up drains what clients sent instead of
        # killing it. Until the API answers, a first signal still aborts start-up (check_starting).
        if threading.current_thread() is threading.main_thread():
            session.hold_stop_signals()
        _start_api(session, detached)
        if session.forced is not None:  # a second signal killed what had started
            raise Stopped(session.forced)
        if detached and session.stop_requested is not None:
            raise Stopped(session.stop_requested)  # the command was told to stop before it returned
    except BaseException as exc:  # a failed API, or a stop signal: nothing that started may stay
        with deferred_interrupts():  # a second signal must not abandon this stop
            if session.forced is not None:
                session.kill()
            server.stop(10)
            if session.api is not None:
                stop_process(session.api, 10)
        session.release_stop_signals()
        if session.forced is not None:
            raise Stopped(session.forced) from exc  # a second signal killed what had started
        raise
    if detached:
        session.release_stop_signals()  # the command returns now; the server runs on without it
    return session


def _start_api(session: ServeSession, detached: bool) -> None:
    options, server = session.options, session.server
    if options.openai_port is None:
        return
    from toolkit.api.app import ApiSettings
    from toolkit.serve.api_process import launch_api

    settings = ApiSettings(
        triton_url=server.grpc_url,
        repo=options.server.repo,
        api_keys=options.api_keys,
        max_in_flight=options.max_in_flight,
        limits=options.api_limits,
        trace=options.trace,
        tool_parser=options.tool_parser,
        special_tokens_in_messages=options.special_tokens_in_messages,
        stream_interval=options.stream_interval,
        engine_http_url=server.http_url if options.engine_transport == "http" else None,
    )
    session.api, session.api_log = launch_api(
        settings,
        host=options.api_host,
        port=options.openai_port,
        log_file=options.api_log,
        detached=detached,
        drain_timeout_s=options.server.exit_timeout_s,  # streams drain as long as Triton's requests
        workers=options.api_workers,
        watch=session.check_starting,
        on_started=lambda process: setattr(session, "starting_api", process),
    )


def _drain_cut(log_file: Path) -> bool:
    """Whether tritonserver's exit code 1 is its drain timeout running out (it then cancels what runs)."""
    return any("Exit timeout expired" in line for line in tail_lines(log_file, 40))


def _stopped_badly(server_code: int | None, api_code: int | None) -> str | None:
    """Why a requested stop did not end cleanly: tritonserver or the API exiting with an error (a crash
    while draining), not 0 after the drain or our own SIGTERM/SIGKILL past the drain timeout."""
    ours = (0, -signal.SIGTERM, -signal.SIGKILL)
    if server_code is not None and server_code not in ours:
        return f"tritonserver exited with code {server_code} while stopping"
    if api_code is not None and api_code not in ours:
        return f"the OpenAI API exited with code {api_code} while stopping"
    return None


def python_stubs(server_pid: int) -> dict[int, str]:
    """The Python-backend stub processes in a tritonserver's session, by model (their first argument is the
    model's model.py path: <repo>/<model>/<version>/model.py). The session, not the children nor the
    process group: under mpirun (tensor parallel) the stubs are grandchildren of the leader, in the
    process group mpirun made for their rank."""
    stubs = {}
    for pid in session_members(server_pid):
        argv = command_line(pid)
        if argv and Path(argv[0]).name == STUB and len(argv) > 1:
            stubs[pid] = Path(argv[1]).parent.parent.name
    return stubs
