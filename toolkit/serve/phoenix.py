"""Arize Phoenix as the local trace viewer, started by `toolkit trace collect --phoenix`.

Phoenix needs a virtual environment of its own (it pulls protobuf 7 and a newer OpenTelemetry than
tritonclient allows; docs/tracing.md has the install line). It accepts OTLP/HTTP as protobuf only,
so the receiver forwards every batch to it as protobuf. Its agent assistant (with server-side bash)
and telemetry are turned off: a local viewer runs no agent and phones nobody.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from toolkit.errors import TraceError
from toolkit.serve.net import check_port_free, wait_http_ok
from toolkit.settings import cache_dir, child_environment
from toolkit.subprocs import start_process, stop_process

PHOENIX_INSTALL = (
    'python3 -m venv ~/phoenix && ~/phoenix/bin/pip install arize-phoenix "numpy<2" "pyarrow<23"'
)
READY_TIMEOUT_S = 120.0  # measured: ready after 23-27 s on a loaded 2-core machine


@dataclass(frozen=True)
class PhoenixPlan:
    executable: Path
    host: str
    port: int
    grpc_port: int
    working_dir: Path

    @property
    def ui_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def traces_url(self) -> str:
        return f"{self.ui_url}/v1/traces"

    def environment(self) -> dict[str, str]:
        return {
            **child_environment(),
            "PHOENIX_WORKING_DIR": str(self.working_dir),
            "PHOENIX_HOST": self.host,
            "PHOENIX_PORT": str(self.port),
            # Phoenix's OTLP/gRPC receiver binds every interface whatever PHOENIX_HOST says.
            "PHOENIX_GRPC_PORT": str(self.grpc_port),
            "PHOENIX_TELEMETRY_ENABLED": "false",
            "PHOENIX_DISABLE_AGENT_ASSISTANT": "true",
            "PHOENIX_AGENTS_DISABLE_BASH": "true",
        }


def plan_phoenix(executable: str, host: str = "127.0.0.1", port: int = 6006) -> PhoenixPlan:
    found = shutil.which(executable) or (executable if os.access(executable, os.X_OK) else None)
    if found is None:
        raise TraceError(
            f"no Phoenix executable at {executable!r}",
            hint=f"install it in a venv of its own: {PHOENIX_INSTALL}; then pass --phoenix ~/phoenix/bin/phoenix",
            value=executable,
        )
    check_port_free(host, port, "--phoenix-port")
    return PhoenixPlan(Path(found), host, port, port + 1, cache_dir("phoenix"))


def start_phoenix(plan: PhoenixPlan) -> tuple[subprocess.Popen, Path]:
    """Phoenix serving its UI and OTLP receiver; returns once its UI answers (or raises, stopped)."""
    log_file = cache_dir("logs") / "phoenix.log"
    process = start_process([str(plan.executable), "serve"], log_file, env=plan.environment())
    try:
        wait_http_ok(plan.ui_url, READY_TIMEOUT_S, process, "Phoenix")
    except BaseException:
        stop_process(process, 10)
        raise
    return process, log_file
