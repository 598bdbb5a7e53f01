"""The OpenAI API as its own process beside tritonserver (`toolkit serve --openai-port`).

A process of its own, not a thread: it keeps running after `toolkit serve --background`
returns, it gets its own GIL, and it stops with the server.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from toolkit.errors import ServerError
from toolkit.serve.launcher import _check_port_free, _client_host, _http_ok, log_tail
from toolkit.subprocs import stop_process
from toolkit.settings import cache_dir


def launch_api(*, triton_grpc_url: str, repo: Path, host: str, port: int, api_keys: tuple[str, ...],
               max_in_flight: int, timeout_s: float = 60.0) -> tuple[subprocess.Popen, Path]:
    _check_port_free(host, port)
    log_file = cache_dir("logs") / f"openai-api-{port}.log"
    env = dict(os.environ)
    if api_keys:  # through the environment, never on a command line that `ps` shows
        env["TOOLKIT_API_KEYS"] = ",".join(api_keys)
    argv = [sys.executable, "-m", "toolkit.cli.main", "api", "--triton-url", triton_grpc_url, "--repo", str(repo),
            "--host", host, "--port", str(port), "--max-in-flight", str(max_in_flight), "--log-level", "warning"]
    with open(log_file, "wb") as log:
        process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    url = f"http://{_client_host(host)}:{port}/health"
    deadline = time.monotonic() + timeout_s
    while not _http_ok(url):
        if process.poll() is not None or time.monotonic() > deadline:
            stop_process(process)
            raise ServerError(f"the OpenAI API on port {port} did not become healthy\n{log_tail(log_file)}", hint=f"see {log_file}")
        time.sleep(0.3)
    return process, log_file

