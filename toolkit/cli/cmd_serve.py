"""`toolkit serve`: run a repository on tritonserver until stopped (or, with --background, until ready)."""

from __future__ import annotations

from pathlib import Path

import click

from toolkit.cli.options import (
    drain_timeout_option,
    engine_transport_option,
    host_option,
    json_option,
    openai_api_options,
    port_option,
    repo_option,
    timeout_option,
    trace_options,
)
from toolkit.cli.render import emit_json, note, stderr_console
from toolkit.errors import ServerError
from toolkit.serve.launcher import ServerConfig, remove_server_record, write_server_record
from toolkit.serve.lifecycle import ServeOptions, start_serving
from toolkit.serve.net import is_loopback, triton_address


@click.command("serve")
@repo_option("Repository written by toolkit build.", default=Path("model_repository"))
@host_option(
    "Address for the OpenAI API and the metrics endpoint; Triton's HTTP/gRPC stay on 127.0.0.1 unless "
    "--expose-triton."
)
@port_option("--http-port", default=8000, help="Triton HTTP port.")
@port_option("--grpc-port", default=8001, help="Triton gRPC port.")
@port_option("--metrics-port", default=8002, help="Triton Prometheus metrics port.")
@click.option(
    "--metrics-host",
    default=None,
    help="Address for the metrics endpoint alone [default: --host]; e.g. 0.0.0.0 with --host 127.0.0.1 "
    "keeps Triton's HTTP/gRPC and the API on loopback and lets scrapers in (toolkit deploy's pods).",
)
@port_option(
    "--openai-port", default=None, help="Also serve the OpenAI-compatible API on this port."
)
@openai_api_options("--api-workers")
@engine_transport_option
@click.option(
    "--expose-triton",
    is_flag=True,
    help="Bind Triton's HTTP and gRPC ports to --host too (they check no API key).",
)
@click.option(
    "--allow-modified",
    is_flag=True,
    help="Serve a repository whose files differ from its manifest.",
)
@timeout_option(
    "Seconds to wait for every model to be ready.",
    default=600.0,
    minimum=1,
    name="--ready-timeout",
)
@trace_options
@click.option(
    "--trace-context-only",
    is_flag=True,
    help="Traces: Triton traces only requests that carry a trace context (an OpenAI API in front "
    "samples them; on by itself with --openai-port).",
)
@drain_timeout_option("On SIGTERM/Ctrl-C, seconds to let in-flight requests finish.")
@click.option(
    "--log-file",
    type=click.Path(path_type=Path),
    default=None,
    help="Server log (default: in the toolkit cache).",
)
@click.option(
    "--background",
    is_flag=True,
    help="Return once ready, leaving the server running; prints its PID.",
)
@json_option
def command(
    repo,
    host,
    http_port,
    grpc_port,
    metrics_port,
    metrics_host,
    openai_port,
    api_workers,
    api_keys,
    max_in_flight,
    stream_interval,
    engine_transport,
    limits,
    tool_parser,
    special_tokens_in_messages,
    expose_triton,
    allow_modified,
    ready_timeout,
    trace,
    trace_context_only,
    drain_timeout,
    log_file,
    background,
    as_json,
):
    """Serve a model repository with tritonserver (and the OpenAI API with --openai-port)."""
    triton_host = triton_address(_triton_host(host, expose_triton, openai_port), "--host")
    config = ServerConfig(
        repo=repo.resolve(),
        host=triton_host,
        metrics_host=triton_address(
            metrics_host or host, "--metrics-host" if metrics_host else "--host"
        ),
        http_port=http_port,
        grpc_port=grpc_port,
        metrics_port=metrics_port,
        ready_timeout_s=ready_timeout,
        exit_timeout_s=drain_timeout,
        log_file=log_file,
        allow_modified=allow_modified,
    )
    if openai_port is not None and openai_port in (http_port, grpc_port, metrics_port):
        raise ServerError(
            f"--openai-port {openai_port} is also Triton's port",
            hint="give --openai-port a port of its own (not --http-port, --grpc-port or --metrics-port)",
        )
    options = ServeOptions(
        config,
        openai_port=openai_port,
        api_host=host,
        api_keys=api_keys,
        max_in_flight=max_in_flight,
        api_limits=limits,
        trace=trace,
        trace_context_only=trace_context_only,
        api_workers=api_workers,
        tool_parser=tool_parser,
        special_tokens_in_messages=special_tokens_in_messages,
        stream_interval=stream_interval,
        engine_transport=engine_transport,
    )
    with stderr_console.status(f"starting tritonserver on {repo} ...") as status:
        session = start_serving(
            options,
            on_wait=lambda message: status.update(f"tritonserver: {message}"),
            detached=background,
        )
    try:
        endpoints = session.endpoints()
        if as_json:
            emit_json(endpoints)
        else:
            for key, value in endpoints.items():
                click.echo(f"{key:11} {value}")
        # What bench reads to find this server's repository and metrics (the foreground's too: the
        # quickstart serves in the foreground, on ports of its own).
        write_server_record(
            session.server,
            {"openai": endpoints.get("openai"), "openai_pid": endpoints.get("openai_pid")},
        )
        if background:
            pids = " ".join(str(p) for p in (endpoints["pid"], endpoints.get("openai_pid")) if p)
            note(f"server running in the background; stop it with: kill {pids}")
            return
        note("ready; Ctrl-C (or SIGTERM) drains in-flight requests and stops")
        session.run_until_stopped(on_event=note)
    except BaseException:
        session.kill()  # whatever ended us outside the drain (a second signal, a fault): nothing stays
        raise
    finally:
        session.release_stop_signals()  # run_until_stopped's own, or what start_serving left held
        if not background:
            remove_server_record(session.server)
    note("stopped")


def _triton_host(host: str, expose_triton: bool, openai_port: int | None) -> str:
    if is_loopback(host) or expose_triton:
        if expose_triton and not is_loopback(host):
            note(
                f"[yellow]warning:[/] Triton's HTTP and gRPC ports are open on {host} with no API key: anyone who "
                "reaches them can generate"
            )
        return host
    if openai_port is None:
        raise ServerError(
            f"--host {host} would open nothing but the metrics endpoint: Triton's HTTP and gRPC ports stay on "
            "127.0.0.1, where no API key is checked",
            hint="add --openai-port PORT (the OpenAI API, with --api-key-file) to serve on that address, or "
            "--expose-triton to open Triton's ports unauthenticated",
        )
    return "127.0.0.1"
