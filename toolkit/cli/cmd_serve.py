"""`toolkit serve`: run a repository on tritonserver until interrupted (or, with --background, until ready)."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import click

from toolkit.cli.render import emit_json, note, stderr_console
from toolkit.errors import ServerError
from toolkit.serve.launcher import ServerConfig, launch_server, log_tail, write_server_record
from toolkit.subprocs import stop_process


@click.command("serve")
@click.option("-r", "--repo", type=click.Path(path_type=Path), default=Path("model_repository"), help="Repository written by toolkit build.")
@click.option("--host", default="127.0.0.1", help="Address to bind (0.0.0.0 for every interface).")
@click.option("--http-port", type=click.IntRange(1, 65535), default=8000)
@click.option("--grpc-port", type=click.IntRange(1, 65535), default=8001)
@click.option("--metrics-port", type=click.IntRange(1, 65535), default=8002)
@click.option("--ready-timeout", type=click.FloatRange(min=1), default=600.0, help="Seconds to wait for every model to be ready.")
@click.option("--log-file", type=click.Path(path_type=Path), default=None, help="Server log (default: in the toolkit cache).")
@click.option("--openai-port", type=click.IntRange(1, 65535), default=None, help="Also serve the OpenAI-compatible API on this port.")
@click.option("-k", "--api-key", "api_keys", multiple=True, help="OpenAI API: accept this bearer key (repeatable; also TOOLKIT_API_KEYS).")
@click.option("--max-in-flight", type=click.IntRange(min=1), default=64, help="OpenAI API: requests at once before 429.")
@click.option("--background", is_flag=True, help="Return once ready, leaving the server running; prints its PID.")
@click.option("--json", "as_json", is_flag=True, help="Print the endpoints as JSON.")
def command(repo, host, http_port, grpc_port, metrics_port, ready_timeout, log_file, openai_port, api_keys, max_in_flight,
            background, as_json):
    """Serve a model repository with tritonserver."""
    config = ServerConfig(repo=repo.resolve(), host=host, http_port=http_port, grpc_port=grpc_port,
                          metrics_port=metrics_port, ready_timeout_s=ready_timeout, log_file=log_file)
    with stderr_console.status(f"starting tritonserver on {repo} ...") as status:
        server = launch_server(config, on_wait=lambda message: status.update(f"tritonserver: {message}"))
    endpoints = {"http": server.http_url, "grpc": server.grpc_url, "metrics": server.metrics_url,
                 "pid": server.pid, "log": str(server.log_file)}
    api = None
    if openai_port is not None:
        from toolkit.api import parse_api_keys
        from toolkit.serve.api_process import launch_api

        keys = parse_api_keys(api_keys, os.environ.get("TOOLKIT_API_KEYS"))
        try:
            api, api_log = launch_api(triton_grpc_url=server.grpc_url, repo=config.repo, host=host, port=openai_port,
                                      api_keys=keys, max_in_flight=max_in_flight)
        except BaseException:
            server.stop()
            raise
        endpoints.update({"openai": f"http://{server.http_url.rsplit(':', 1)[0]}:{openai_port}/v1", "openai_pid": api.pid,
                          "openai_log": str(api_log)})
    if as_json:
        emit_json(endpoints)
    else:
        for key, value in endpoints.items():
            click.echo(f"{key:8} {value}")
    if background:
        write_server_record(server)
        pids = " ".join(str(p) for p in (server.pid, api.pid if api else None) if p)
        note(f"server running in the background; stop it with: kill {pids}")
        return
    _forward_signals(server)
    note("ready; Ctrl-C stops the server")
    code = server.process.wait()
    if api is not None:
        stop_process(api)
    if code not in (0, -signal.SIGTERM, -signal.SIGINT) and not server.stopping:
        raise ServerError(f"tritonserver exited with code {code}\n{log_tail(server.log_file)}", hint=f"see {server.log_file}")


def _forward_signals(server) -> None:
    def forward(signum, _frame):
        server.stopping = True
        server.process.send_signal(signum)

    signal.signal(signal.SIGINT, forward)
    signal.signal(signal.SIGTERM, forward)
