"""Launch tritonserver on a repository: check it, plan the command, start it, wait for readiness, stop it."""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from toolkit import __version__
from toolkit.errors import RepositoryError, ServerError
from toolkit.fsutil import shared_folder_lock
from toolkit.repository import contract as c
from toolkit.repository.reader import Repository, open_repository
from toolkit.repository.sources import sources_digest
from toolkit.serve.binary import TritonBinary, find_tritonserver
from toolkit.serve.drain import clients_connected, held_by_idle_streams, wait_until_engines_idle
from toolkit.serve.net import check_port_free, client_host, http_ok
from toolkit.settings import EXIT_TIMEOUT_S, cache_dir, child_environment
from toolkit.signals import deferred_interrupts
from toolkit.subprocs import process_alive, start_process, stop_process, tail_lines
from toolkit.targets import target_for
from toolkit.trace.config import TracePlan, engine_environment, triton_args

# A drain that ran out with engines busy: how long tritonserver gets after its SIGTERM before it is killed.
CUT_GRACE_S = 1.0


@dataclass(frozen=True)
class ServerConfig:
    repo: Path
    host: str = "127.0.0.1"  # Triton's HTTP and gRPC endpoints
    http_port: int = 8000
    grpc_port: int = 8001
    metrics_port: int = 8002
    metrics_host: str | None = None  # default: host
    ready_timeout_s: float = 600.0
    exit_timeout_s: int = EXIT_TIMEOUT_S
    log_file: Path | None = None
    allow_modified: bool = False  # serve a repository whose files differ from its manifest
    extra_args: tuple[str, ...] = ()
    # Tracing (toolkit.trace.config): Triton's OpenTelemetry mode and the engines' spans; None: off.
    trace: TracePlan | None = None
    traced_by_api: bool = (
        False  # the OpenAI API samples: Triton traces only what carries its context
    )


@dataclass
class RunningServer:
    """A started tritonserver; `stop()` ends it (terminate -> wait -> kill, the whole process group)."""

    process: subprocess.Popen
    config: ServerConfig
    log_file: Path
    repository: Repository
    models: tuple[str, ...] = field(default_factory=tuple)
    # How the last drain's wait for idle engines ended (toolkit.serve.drain), None before any drain.
    drain_outcome: str | None = None
    # Models the stopping server kept loaded for idle client streams, and was ended for (0: none).
    held_models: int = 0

    @property
    def pid(self) -> int:
        return self.process.pid

    @property
    def http_url(self) -> str:
        return f"{client_host(self.config.host)}:{self.config.http_port}"

    @property
    def grpc_url(self) -> str:
        return f"{client_host(self.config.host)}:{self.config.grpc_port}"

    @property
    def metrics_url(self) -> str:
        return f"http://{client_host(self.config.metrics_host or self.config.host)}:{self.config.metrics_port}/metrics"

    def stop(self, timeout_s: float | None = None) -> int | None:
        """Its exit code (None: it could not be waited for, e.g. it was not our child).

        With no `timeout_s`, a drain: first wait, up to the drain timeout (`exit_timeout_s`), for the
        engines to hold nothing (toolkit.serve.drain: a stopping Triton 2.51 strands ensemble streams),
        then SIGTERM. Engines still busy at the drain timeout: killed CUT_GRACE_S after the SIGTERM (the
        requests had their drain). Otherwise what is left is Triton's to finish, and it is killed 5 s
        past the drain timeout, or as soon as its log shows it waits only on clients' idle gRPC streams
        (`held_models`). `drain_outcome` says how the wait ended. With `timeout_s` (after a fault):
        SIGTERM at once, killed after `timeout_s`.
        """
        give_up = None
        if timeout_s is None:
            drain_end = time.monotonic() + self.config.exit_timeout_s
            try:
                self.drain_outcome = wait_until_engines_idle(
                    self.metrics_url, drain_end, lambda: self.process.poll() is None
                )
            except Exception as exc:  # noqa: BLE001 - whatever the wait met, the server is stopped
                self.drain_outcome = f"failed: {type(exc).__name__}: {exc}"
            if self.drain_outcome == "timeout":
                # The drain is spent on requests still running: they are cut now, not given Triton's
                # exit timeout on top (a 1 s drain let a stream run 2 s and finish).
                timeout_s = CUT_GRACE_S
            else:
                timeout_s = max(drain_end + 5 - time.monotonic(), 1.0)
            give_up = self._held_by_idle_streams_from(_size(self.log_file))
        code = stop_process(self.process, timeout_s, give_up=give_up)
        self.release_shared_memory()
        return code

    def _held_by_idle_streams_from(self, offset: int) -> Callable[[], bool]:
        """For stop_process: whether the stopping server, its log read from `offset`, only waits on
        clients' idle gRPC streams (toolkit.serve.drain.held_by_idle_streams); records their count."""

        def give_up() -> bool:
            try:
                with open(self.log_file, "rb") as log:
                    log.seek(offset)
                    since = log.read().decode(errors="replace")
            except OSError:
                return False
            held = held_by_idle_streams(since)
            # a model still unloading (a slow finalize) looks the same, but no client holds it
            if held and clients_connected(self.config.grpc_port):
                self.held_models = held
            return self.held_models > 0

        return give_up

    def release_shared_memory(self) -> None:
        """Unlink what is left of this server's Python-backend regions: a stub killed (by us, past the
        drain, or by a signal) never unlinks its own, and tritonserver unlinks them only on a clean unload."""
        remove_shared_memory(self.config)


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def check_repository(
    repo: Path,
    *,
    allow_modified: bool = False,
    same_toolkit: bool = False,
    modified_fix: str | None = "serve it as it is with --allow-modified",
) -> Repository:
    """Open `repo` and refuse what cannot be served as built: foreign, stale, modified files, other model sources.

    `same_toolkit`: refuse a repository built by another toolkit release or from other model sources
    for every target, not only for the Python engines (for callers whose next step runs this toolkit
    on it: toolkit deploy's image and build Job). `modified_fix`: the caller's other way out of
    modified files, beside rebuilding (None: rebuilding only).
    """
    repository = open_repository(repo)
    manifest = repository.manifest
    current = sources_digest()
    stale = manifest.sources_digest != current
    if same_toolkit and (stale or manifest.toolkit_version != __version__):
        raise RepositoryError(
            f"{repo} was built by toolkit {manifest.toolkit_version} (model sources {manifest.sources_digest}); "
            f"this is toolkit {__version__} (model sources {current})",
            hint=f"rebuild it with this toolkit ({repository.rebuild_command}), or use toolkit "
            f"{manifest.toolkit_version}",
        )
    stale_reason = target_for(repository).check_sources(repository, current)
    if stale_reason is not None:
        raise RepositoryError(
            f"{repo} {stale_reason}", hint=f"rebuild: {repository.rebuild_command}"
        )
    changes = repository.file_changes()
    if changes and not allow_modified:
        listed = ", ".join(f"{change.path} ({change.change})" for change in changes[:5])
        more = f" and {len(changes) - 5} more" if len(changes) > 5 else ""
        # The rebuild replaces edited files only when told to (toolkit build refuses otherwise).
        raise RepositoryError(
            f"{repo} differs from what toolkit build wrote: {listed}{more}",
            hint=f"rebuild it, discarding those changes ({repository.rebuild_command} --discard-changes)"
            + (f", or {modified_fix}" if modified_fix else ""),
        )
    return repository


def server_command(binary: TritonBinary, config: ServerConfig, world_size: int = 1) -> list[str]:
    endpoints = [
        f"--http-address={config.host}",
        f"--http-port={config.http_port}",
        f"--grpc-address={config.host}",
        f"--grpc-port={config.grpc_port}",
        f"--metrics-address={config.metrics_host or config.host}",
        f"--metrics-port={config.metrics_port}",
    ]
    common = [
        "--exit-on-error=true",
        "--strict-readiness=true",
        "--log-verbose=0",
        f"--exit-timeout-secs={config.exit_timeout_s}",
    ]
    if binary.backend_dir is not None:
        common.append(f"--backend-directory={binary.backend_dir}")
    if config.trace is not None:
        common += triton_args(config.trace, behind_api=config.traced_by_api)
    if world_size > 1:
        from toolkit.serve.mpi import mpirun_command, tritonserver_rank_argv

        return mpirun_command(
            world_size,
            lambda rank: tritonserver_rank_argv(
                rank,
                str(config.repo),
                tritonserver=str(binary.executable),
                endpoints=endpoints,
                shm_prefix=shm_prefix(config, rank),
                extra=[*common, *config.extra_args],
            ),
        )
    return [
        str(binary.executable),
        f"--model-repository={config.repo}",
        *endpoints,
        *common,
        f"--backend-config=python,shm-region-prefix-name={shm_prefix(config)}",
        *config.extra_args,
    ]


def shm_prefix(config: ServerConfig, rank: int = 0) -> str:
    """One Python-backend shared-memory prefix per server and rank, so servers side by side never share regions."""
    return f"toolkit_{os.getpid()}_{config.grpc_port}_r{rank}_"


SHM_DIR = Path("/dev/shm")


def remove_shared_memory(config: ServerConfig) -> None:
    """Unlink every region of this server (all ranks). A region still mapped stays readable by whoever
    maps it until they exit; no new process can open it."""
    prefix = shm_prefix(config, 0).removesuffix("r0_")
    try:
        entries = [entry for entry in SHM_DIR.iterdir() if entry.name.startswith(prefix)]
    except OSError:
        return  # no /dev/shm (not Linux)
    for entry in entries:
        entry.unlink(missing_ok=True)


def launch_server(
    config: ServerConfig, on_wait: Callable[[str], None] = lambda _: None, *, detached: bool = False
) -> RunningServer:
    """Start tritonserver and wait until every model is ready. `detached`: it may outlive this process."""
    _check_distinct_ports(config)
    repository = check_repository(config.repo, allow_modified=config.allow_modified)
    target = target_for(repository)
    world_size = target.preflight(repository)
    for flag, port in (
        ("--http-port", config.http_port),
        ("--grpc-port", config.grpc_port),
        ("--metrics-port", config.metrics_port),
    ):
        check_port_free(
            config.metrics_host or config.host if flag == "--metrics-port" else config.host,
            port,
            flag,
        )
    binary = find_tritonserver()
    target.check_server(repository, binary.bundled)
    log_file = config.log_file or cache_dir("logs") / f"tritonserver-{config.grpc_port}.log"
    try:
        log_file.parent.mkdir(parents=True, exist_ok=True)
        log_file.write_bytes(b"")
    except OSError as exc:
        raise ServerError(
            f"cannot write the server log {log_file}: {exc.strerror}",
            hint="pass a --log-file in a folder you can write to",
        ) from exc
    argv = server_command(binary, config, world_size)
    # tritonserver and its stubs need no secrets: API keys and hub tokens stay out of their environment.
    env = child_environment(binary.env)
    if config.trace is not None:
        env.update(
            engine_environment(config.trace)
        )  # the engines' spans (model_repo/common/tracing.py)
    # tritonserver holds a shared lock on the repository for its whole life: `toolkit build` will not
    # replace a repository under a running server (its stubs and the API's workers that start again
    # would read the new build while the rest run the old one).
    with shared_folder_lock(config.repo) as held:
        process = start_process(
            argv, log_file, env=env, die_with_parent=not detached, pass_fds=(held,)
        )
    server = RunningServer(process, config, log_file, repository, c.MODEL_NAMES)
    try:
        wait_until_ready(server, on_wait)
    except BaseException:
        with deferred_interrupts():  # a second Ctrl-C must not abandon this stop
            server.stop(10)
        raise
    return server


def wait_until_ready(server: RunningServer, on_wait: Callable[[str], None]) -> None:
    deadline = time.monotonic() + server.config.ready_timeout_s
    pending = list(server.models)
    while pending:
        if server.process.poll() is not None:
            raise ServerError(
                f"tritonserver exited with code {server.process.returncode} before its models were "
                f"ready\n{log_tail(server.log_file)}",
                hint=f"read the full log: {server.log_file}",
            )
        if time.monotonic() > deadline:
            raise ServerError(
                f"models {', '.join(pending)} not ready after "
                f"{server.config.ready_timeout_s:.0f}s\n{log_tail(server.log_file)}",
                hint="raise --ready-timeout, or read the log: " + str(server.log_file),
            )
        pending = [
            m for m in pending if not http_ok(f"http://{server.http_url}/v2/models/{m}/ready")
        ]
        if pending:
            on_wait(f"waiting for {', '.join(pending)}")
            time.sleep(0.5)


def log_tail(path: Path, lines: int = 15) -> str:
    """The server's error lines (why a model failed to load), then its last lines, without the tables."""
    text = [line for line in tail_lines(path, 2000) if not line.startswith(("+", "|"))]
    if not text:
        return "(no server log)"
    errors = [line for line in text if line[:1] == "E" and line[1:5].isdigit()][:10]
    tail = [line for line in text[-lines:] if line not in errors]
    return (
        "--- tritonserver errors ---\n"
        + "\n".join(errors)
        + "\n--- tritonserver log (last lines) ---\n"
        + "\n".join(tail)
    )


def _check_distinct_ports(config: ServerConfig) -> None:
    ports = {
        "--http-port": config.http_port,
        "--grpc-port": config.grpc_port,
        "--metrics-port": config.metrics_port,
    }
    for flag, port in ports.items():
        others = [other for other, value in ports.items() if value == port and other != flag]
        if others:
            raise ServerError(
                f"{flag} and {others[0]} are both {port}", hint="give each endpoint its own port"
            )


def write_server_record(server: RunningServer, extra: dict | None = None) -> Path:
    """What `toolkit serve` started, for `toolkit bench` to find the repository and metrics it serves."""
    record = cache_dir("servers") / f"{server.config.grpc_port}.json"
    record.write_text(
        json.dumps(
            {
                "pid": server.pid,
                "repo": str(server.config.repo),
                "log": str(server.log_file),
                "http": server.http_url,
                "grpc": server.grpc_url,
                "metrics": server.metrics_url,
                **(extra or {}),
            }
        )
    )
    return record


def remove_server_record(server: RunningServer) -> None:
    (cache_dir("servers") / f"{server.config.grpc_port}.json").unlink(missing_ok=True)


def read_server_record(grpc_url: str) -> dict | None:
    """What `toolkit serve` recorded for a live server on this gRPC port (repo, metrics URL), else None."""
    port = grpc_url.rsplit(":", 1)[-1]
    try:
        data = json.loads((cache_dir("servers") / f"{port}.json").read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or not process_alive(int(data.get("pid", 0) or 0)):
        return None  # a record left by a server that is gone
    return data
