"""The OpenAI API as its own process beside tritonserver (`toolkit serve --openai-port`).

A process of its own, not a thread: it keeps running after `toolkit serve --background`
returns, it gets its own GIL, and it stops with the server. It is started as
`python -m toolkit.api` with its settings (API keys included) on stdin: no key on a command line.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import NoReturn

from toolkit.api.app import ApiSettings
from toolkit.api.workers import METRICS_DIR_ENV, metrics_dir
from toolkit.errors import ServerError
from toolkit.serve.net import NotHealthy, check_port_free, client_host, wait_http_ok
from toolkit.settings import cache_dir, child_environment
from toolkit.subprocs import start_process, stop_process, tail_lines


def launch_api(
    settings: ApiSettings,
    *,
    host: str,
    port: int,
    timeout_s: float = 60.0,
    log_file: Path | None = None,
    detached: bool = False,
    drain_timeout_s: int | None = None,
    workers: int = 1,
    watch: Callable[[], None] | None = None,
    on_started: Callable[[subprocess.Popen], None] | None = None,
) -> tuple[subprocess.Popen, Path]:
    """Start the API and wait until it answers /health; `watch` raises to end the wait (net.wait_http_ok):
    what it raises is raised as it is, after the API process is stopped. `on_started` gets the process
    as soon as it exists (the caller may have to kill it while it starts)."""
    check_port_free(host, port, "--openai-port")
    log_file = log_file or cache_dir("logs") / f"openai-api-{port}.log"
    log_file.write_bytes(b"")
    payload = api_payload(
        settings, host=host, port=port, workers=workers, drain_timeout_s=drain_timeout_s
    )
    process = start_process(
        [sys.executable, "-m", "toolkit.api"],
        log_file,
        env=api_environment(port, workers),
        stdin=subprocess.PIPE,
        die_with_parent=not detached,
    )
    try:
        if on_started is not None:
            on_started(process)
        stdin = process.stdin
        if stdin is None:  # start_process was given stdin=PIPE
            raise ServerError("the OpenAI API process has no stdin", hint="this is a toolkit bug")
        stdin.write(json.dumps(payload).encode())
        stdin.close()
        wait_http_ok(
            f"http://{client_host(host)}:{port}/health",
            timeout_s,
            process,
            "the OpenAI API",
            watch=watch,
        )
    except BaseException as exc:
        stop_process(process)
        if isinstance(exc, (NotHealthy, OSError)):
            tail = "\n".join(tail_lines(log_file, 15))
            raise ServerError(
                f"the OpenAI API on port {port} did not become healthy\n{tail}",
                hint=f"see {log_file}",
            ) from exc
        raise
    return process, log_file


def api_payload(settings: ApiSettings, *, host: str, port: int, workers: int, **run) -> dict:
    """What `python -m toolkit.api` reads on stdin: the settings (keys included) and how to run."""
    return {
        **asdict(settings),
        "repo": str(settings.repo),
        "api_keys": list(settings.api_keys),
        "host": host,
        "port": port,
        "log_level": run.pop("log_level", "warning"),
        "workers": workers,
        **{key: value for key, value in run.items() if value is not None},
    }


def exec_api(payload: dict) -> NoReturn:
    """Become `python -m toolkit.api` (this process, its pid and its signals), the payload on stdin:
    for API workers, whose supervisor must start in a process where prometheus_client has not been
    imported yet (`toolkit api --workers N`)."""
    read, write = os.pipe()
    os.write(write, json.dumps(payload).encode())  # well under a pipe's buffer: settings and keys
    os.close(write)
    os.dup2(read, 0)
    os.close(read)
    sys.stdout.flush()
    sys.stderr.flush()
    env = api_environment(int(payload["port"]), int(payload["workers"]))
    os.execve(sys.executable, [sys.executable, "-m", "toolkit.api"], env)


def api_environment(port: int, workers: int) -> dict:
    """The API process's environment: no secrets; with workers, where their shared metrics live."""
    env = child_environment()
    env.pop(METRICS_DIR_ENV, None)
    if workers > 1:
        env[METRICS_DIR_ENV] = str(metrics_dir(port))
    return env
