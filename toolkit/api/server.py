"""Run the API with uvicorn: in the foreground (`toolkit api`, and `python -m toolkit.api`, the process of its own
that `toolkit serve --openai-port` starts) or on a thread of the calling process (`run_api_in_background`: tests,
an application that embeds the API)."""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from dataclasses import replace as replace_fields
from pathlib import Path
from typing import TYPE_CHECKING

from toolkit.api.app import ApiSettings, create_app
from toolkit.api.connection import bounded_protocol
from toolkit.errors import ServerError
from toolkit.fsutil import shared_folder_lock
from toolkit.settings import EXIT_TIMEOUT_S
from toolkit.signals import STOP_SIGNALS, replace, restore

if TYPE_CHECKING:
    import uvicorn

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 9000


def _uvicorn_server(
    settings: ApiSettings,
    host: str,
    port: int,
    log_level: str,
    loop: str = "auto",
    http: str = "auto",
    drain_timeout_s: int = EXIT_TIMEOUT_S,
    in_flight=None,
    engine_fault=None,
):
    import uvicorn

    config = uvicorn.Config(
        create_app(settings, in_flight, engine_fault),
        host=host,
        port=port,
        loop=loop,  # auto: uvloop when installed (a dependency), else asyncio
        # auto: httptools when installed (a dependency), else h11; with deadlines on request headers and writes
        http=bounded_protocol(
            http, settings.limits.header_timeout_s, settings.limits.send_timeout_s
        ),
        log_level=log_level,
        access_log=False,  # the access log would show paths only, but keep request lines out of logs by default
        # On SIGTERM/Ctrl-C: stop accepting at once, let open requests and streams finish this long.
        timeout_graceful_shutdown=drain_timeout_s,
        lifespan="on",
    )
    return uvicorn.Server(config)


def run_api(
    settings: ApiSettings,
    *,
    host: str = DEFAULT_HOST,
    port: int = DEFAULT_PORT,
    log_level: str = "info",
    loop: str = "auto",
    http: str = "auto",
    drain_timeout_s: int = EXIT_TIMEOUT_S,
    workers: int = 1,
) -> None:
    """Serve in the foreground until interrupted (Ctrl-C or SIGTERM, then in-flight requests get
    `drain_timeout_s` seconds to finish while new connections are refused). `workers` > 1: that many
    processes on the port (toolkit.api.workers), in a process that has not imported prometheus_client
    without PROMETHEUS_MULTIPROC_DIR set (`python -m toolkit.api`, as the launchers start it)."""
    # The API reads the repository as it starts (each worker that starts again too): it holds the same
    # shared lock as tritonserver, so that `toolkit build` does not replace it under a running API.
    with shared_folder_lock(Path(settings.repo)):
        _run_api(settings, host, port, log_level, loop, http, drain_timeout_s, workers)


def _run_api(settings, host, port, log_level, loop, http, drain_timeout_s, workers) -> None:
    if workers > 1:
        _run_workers(settings, workers, host, port, log_level, loop, http, drain_timeout_s)
        return
    server = _uvicorn_server(settings, host, port, log_level, loop, http, drain_timeout_s)
    # SIGHUP too (a closed terminal): uvicorn's own handlers take SIGINT and SIGTERM only.
    previous = replace_signals(server)
    try:
        server.run()
    finally:
        restore(previous)
    if not server.started:
        raise ServerError(
            f"the API could not start on {host}:{port}",
            hint="is the port taken? pick another with --port",
        )


def _run_workers(settings, workers, host, port, log_level, loop, http, drain_timeout_s) -> None:
    from toolkit.api.workers import SharedFault, SharedInFlight, Supervisor

    limits = settings.limits
    # The body read budget is each worker's: its share of the whole, but room for the largest body.
    share = max(limits.max_body_bytes, limits.read_budget_bytes // workers)
    worker_settings = replace_fields(
        settings, limits=replace_fields(limits, body_read_budget_bytes=share)
    )

    def serve_one(sock, worker) -> int:
        server = _uvicorn_server(
            worker_settings, host, port, log_level, loop, http, drain_timeout_s,
            in_flight=SharedInFlight(worker), engine_fault=SharedFault(worker),
        )  # fmt: skip
        threading.Thread(target=_tell_when_serving, args=(server, worker), daemon=True).start()
        restore_default = replace_signals(server)
        try:
            server.run(sockets=[sock])
        finally:
            restore(restore_default)
        return 0 if server.started else 1

    code = Supervisor(workers, host, port, serve_one, drain_timeout_s).serve()
    if code != 0:
        raise ServerError(
            f"the API workers on {host}:{port} stopped with an error",
            hint="read the API log above (a worker that could not start says why)",
        )


def _tell_when_serving(server, worker) -> None:
    """Raise the worker's flag once uvicorn serves (its startup, the app's lifespan, is done)."""
    while not server.started and not server.should_exit:
        time.sleep(0.05)
    if server.started:
        worker.serving()


def replace_signals(server) -> dict:
    """Our handlers for the stop signals until uvicorn installs its own: they ask it to exit, and take
    the signal uvicorn re-raises after a clean drain (which would end it as killed by SIGTERM)."""
    if threading.current_thread() is not threading.main_thread():
        return {}
    return replace(STOP_SIGNALS, lambda _signum, _frame: setattr(server, "should_exit", True))


@dataclass
class ApiServerHandle:
    """A running API on a background thread; `stop()` shuts it down gracefully."""

    url: str
    server: uvicorn.Server
    thread: threading.Thread

    def stop(self, timeout_s: float = 10.0) -> None:
        self.server.should_exit = True
        self.thread.join(timeout_s)

    @property
    def alive(self) -> bool:
        return self.thread.is_alive()


def run_api_in_background(
    settings: ApiSettings,
    *,
    host: str = DEFAULT_HOST,
    port: int = DEFAULT_PORT,
    log_level: str = "warning",
    start_timeout_s: float = 30.0,
    http: str = "auto",
) -> ApiServerHandle:
    """Start the API on a daemon thread with its own event loop; return once it accepts connections."""
    server = _uvicorn_server(settings, host, port, log_level, http=http)
    thread = threading.Thread(target=server.run, name=f"toolkit-api-{port}", daemon=True)
    thread.start()
    deadline = time.monotonic() + start_timeout_s
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            server.should_exit = True
            raise ServerError(
                f"the OpenAI API did not start on {host}:{port}",
                hint="is the port taken? pick another port",
            )
        time.sleep(0.02)
    logging.getLogger("toolkit.api").info("OpenAI API on http://%s:%d/v1", host, port)
    return ApiServerHandle(f"http://{host}:{port}", server, thread)
