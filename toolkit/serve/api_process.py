"""The OpenAI API as its own process beside tritonserver (`toolkit serve --openai-port`).

A process of its own, not a thread: it keeps running after `toolkit serve --background`
returns, it gets its own GIL, and it stops with the server. It is started as
`python -m toolkit.api` with its settings (API keys included) on stdin: no key on a command line.
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import asdict
from pathlib import Path

from toolkit.api.app import ApiSettings
from toolkit.errors import ServerError
from toolkit.serve.net import check_port_free, client_host, wait_http_ok
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
) -> tuple[subprocess.Popen, Path]:
    check_port_free(host, port, "--openai-port")
    log_file = log_file or cache_dir("logs") / f"openai-api-{port}.log"
    log_file.write_bytes(b"")
    payload = {
        **asdict(settings),
        "repo": str(settings.repo),
        "api_keys": list(settings.api_keys),
        "host": host,
        "port": port,
        "log_level": "warning",
        **({"drain_timeout_s": drain_timeout_s} if drain_timeout_s is not None else {}),
    }
    process = start_process(
        [sys.executable, "-m", "toolkit.api"],
        log_file,
        env=child_environment(),
        stdin=subprocess.PIPE,
        die_with_parent=not detached,
    )
    try:
        stdin = process.stdin
        if stdin is None:  # start_process was given stdin=PIPE
            raise ServerError("the OpenAI API process has no stdin", hint="this is a toolkit bug")
        stdin.write(json.dumps(payload).encode())
        stdin.close()
        wait_http_ok(
            f"http://{client_host(host)}:{port}/health", timeout_s, process, "the OpenAI API"
        )
    except BaseException as exc:
        stop_process(process)
        if isinstance(exc, (ServerError, OSError)):
            tail = "\n".join(tail_lines(log_file, 15))
            raise ServerError(
                f"the OpenAI API on port {port} did not become healthy\n{tail}",
                hint=f"see {log_file}",
            ) from exc
        raise
    return process, log_file
