"""Launch tritonserver on a repository: plan the command, start it, wait for readiness, stop it."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from toolkit.errors import RepositoryError, ServerError
from toolkit.repository import contract as c
from toolkit.repository.sources import sources_digest
from toolkit.repository.writer import MANIFEST_FORMAT, read_manifest
from toolkit.serve.binary import TritonBinary, find_tritonserver
from toolkit.settings import cache_dir
from toolkit.subprocs import stop_process

PYTHON_TARGETS = ("cpu", "synthetic")


@dataclass(frozen=True)
class ServerConfig:
    repo: Path
    host: str = "127.0.0.1"
    http_port: int = 8000
    grpc_port: int = 8001
    metrics_port: int = 8002
    ready_timeout_s: float = 600.0
    log_file: Path | None = None
    extra_args: tuple[str, ...] = ()


@dataclass
class RunningServer:
    """A started tritonserver; `stop()` ends it (terminate -> wait -> kill)."""

    process: subprocess.Popen
    config: ServerConfig
    log_file: Path
    models: tuple[str, ...] = field(default_factory=tuple)
    stopping: bool = False  # set when we asked it to stop, so its exit code is not a failure

    @property
    def pid(self) -> int:
        return self.process.pid

    @property
    def http_url(self) -> str:
        return f"{_client_host(self.config.host)}:{self.config.http_port}"

    @property
    def grpc_url(self) -> str:
        return f"{_client_host(self.config.host)}:{self.config.grpc_port}"

    @property
    def metrics_url(self) -> str:
        return f"http://{_client_host(self.config.host)}:{self.config.metrics_port}/metrics"

    def stop(self, timeout_s: float = 20.0) -> int:
        return stop_process(self.process, timeout_s)


def check_repository(repo: Path) -> dict:
    """Refuse a missing, foreign or stale repository, saying what to rebuild."""
    if not repo.is_dir():
        raise RepositoryError(f"model repository {repo} does not exist", hint="build it with: toolkit build --target cpu --output " + str(repo))
    manifest = read_manifest(repo)
    rebuild = f"toolkit build --target {manifest.get('target', 'cpu')} --model {_model_arg(manifest)} --output {repo}"
    if manifest.get("format") != MANIFEST_FORMAT:
        raise RepositoryError(f"{repo} has manifest format {manifest.get('format')!r}; this toolkit reads format {MANIFEST_FORMAT}", hint=f"rebuild: {rebuild}")
    missing = [name for name in c.MODEL_NAMES if not (repo / name / "config.pbtxt").is_file()]
    if missing:
        raise RepositoryError(f"{repo} is incomplete: no config.pbtxt for {', '.join(missing)}", hint=f"rebuild: {rebuild}")
    if manifest.get("target") in PYTHON_TARGETS and manifest.get("sources_digest") != sources_digest():
        raise RepositoryError(
            f"{repo} was built by toolkit {manifest.get('toolkit_version')} from other model sources than this toolkit's",
            hint=f"rebuild: {rebuild}",
        )
    return manifest


def _model_arg(manifest: dict) -> str:
    source = manifest.get("model", {}).get("source", "")
    kind, _, value = source.partition(":")
    return {"embedded": value, "hf": f"hf:{value}", "local": value}.get(kind, source or "MODEL")


def engine_preflight(repo: Path, manifest: dict):
    """For a GPU repository: the engine's facts, after checking it can run here (else EngineBuildError)."""
    if manifest.get("target") in PYTHON_TARGETS:
        return None
    from toolkit.engine import check_engine_compatible
    from toolkit.repository.configs import parse_pbtxt

    config = parse_pbtxt((repo / c.ENGINE / "config.pbtxt").read_text())
    return check_engine_compatible(Path(config.parameters["gpt_model_path"].string_value))


def server_command(binary: TritonBinary, config: ServerConfig, world_size: int = 1) -> list[str]:
    if world_size > 1:
        from toolkit.serve.mpi import mpirun_command, tritonserver_rank_argv

        addresses = [f"--http-address={config.host}", f"--grpc-address={config.host}", f"--metrics-address={config.host}"]
        return mpirun_command(world_size, lambda rank: tritonserver_rank_argv(
            rank, str(config.repo), tritonserver=str(binary.executable), http_port=config.http_port,
            grpc_port=config.grpc_port, metrics_port=config.metrics_port,
            extra=[*(addresses if rank == 0 else []), "--exit-on-error=true", *config.extra_args]))
    argv = [
        str(binary.executable),
        f"--model-repository={config.repo}",
        f"--http-address={config.host}", f"--http-port={config.http_port}",
        f"--grpc-address={config.host}", f"--grpc-port={config.grpc_port}",
        f"--metrics-address={config.host}", f"--metrics-port={config.metrics_port}",
        "--exit-on-error=true", "--strict-readiness=true", "--log-verbose=0",
        # One shm prefix per server, so servers side by side never share Python-backend regions.
        f"--backend-config=python,shm-region-prefix-name=toolkit_{os.getpid()}_{config.grpc_port}_",
    ]
    if binary.backend_dir is not None:
        argv.append(f"--backend-directory={binary.backend_dir}")
    return argv + list(config.extra_args)


def launch_server(config: ServerConfig, on_wait: Callable[[str], None] = lambda _: None) -> RunningServer:
    _check_distinct_ports(config)
    manifest = check_repository(config.repo)
    engine = engine_preflight(config.repo, manifest)
    for port in {config.http_port, config.grpc_port, config.metrics_port}:
        _check_port_free(config.host, port)
    binary = find_tritonserver()
    if engine is not None and binary.bundled:
        raise ServerError(
            f"{config.repo} holds a TensorRT-LLM engine ({manifest.get('target')}), and the tritonserver found here "
            "(bundled by nvidia-pytriton) has no tensorrtllm backend",
            hint="serve it inside NVIDIA's Triton TRT-LLM container (nvcr.io/nvidia/tritonserver:<yy.mm>-trtllm-python-py3)",
        )
    log_file = config.log_file or cache_dir("logs") / f"tritonserver-{config.grpc_port}.log"
    with open(log_file, "wb") as log:
        argv = server_command(binary, config, engine.world_size if engine else 1)
        process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT,
                                   env=binary.env, start_new_session=True)
    server = RunningServer(process, config, log_file, c.MODEL_NAMES)
    try:
        wait_until_ready(server, on_wait)
    except BaseException:
        server.stop()
        raise
    return server


def wait_until_ready(server: RunningServer, on_wait: Callable[[str], None]) -> None:
    deadline = time.monotonic() + server.config.ready_timeout_s
    pending = list(server.models)
    while pending:
        if server.process.poll() is not None:
            raise ServerError(
                f"tritonserver exited with code {server.process.returncode} before its models were ready\n{log_tail(server.log_file)}",
                hint=f"read the full log: {server.log_file}",
            )
        if time.monotonic() > deadline:
            raise ServerError(
                f"models {', '.join(pending)} not ready after {server.config.ready_timeout_s:.0f}s\n{log_tail(server.log_file)}",
                hint="raise --ready-timeout, or read the log: " + str(server.log_file),
            )
        pending = [m for m in pending if not _http_ok(f"http://{server.http_url}/v2/models/{m}/ready")]
        if pending:
            on_wait(f"waiting for {', '.join(pending)}")
            time.sleep(0.5)


def log_tail(path: Path, lines: int = 15) -> str:
    """The server's error lines (why a model failed to load), then its last lines, without the tables."""
    try:
        text = [line for line in path.read_text(errors="replace").splitlines() if not line.startswith(("+", "|"))]
    except OSError:
        return "(no server log)"
    errors = [line for line in text if line[:1] == "E" and line[1:5].isdigit()][:10]
    tail = [line for line in text[-lines:] if line not in errors]
    return "--- tritonserver errors ---\n" + "\n".join(errors) + "\n--- tritonserver log (last lines) ---\n" + "\n".join(tail)


def _check_distinct_ports(config: ServerConfig) -> None:
    ports = {"--http-port": config.http_port, "--grpc-port": config.grpc_port, "--metrics-port": config.metrics_port}
    for flag, port in ports.items():
        others = [other for other, value in ports.items() if value == port and other != flag]
        if others:
            raise ServerError(f"{flag} and {others[0]} are both {port}", hint="give each endpoint its own port")


def _check_port_free(host: str, port: int) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host if host not in ("", "0.0.0.0") else "0.0.0.0", port))
        except OSError as exc:
            raise ServerError(f"port {port} on {host} is in use ({exc.strerror})", hint="pass a free port with --http-port / --grpc-port / --metrics-port") from exc


def _http_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return response.status == 200
    except (urllib.error.URLError, OSError):
        return False


def _client_host(host: str) -> str:
    return "127.0.0.1" if host in ("", "0.0.0.0") else host


def write_server_record(server: RunningServer) -> Path:
    record = cache_dir("servers") / f"{server.config.grpc_port}.json"
    record.write_text(json.dumps({"pid": server.pid, "repo": str(server.config.repo), "log": str(server.log_file),
                                  "http": server.http_url, "grpc": server.grpc_url, "metrics": server.metrics_url}))
    return record
