"""`toolkit api`: the OpenAI-compatible API in front of a running Triton server."""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass

import click

from toolkit.api.engine_http import http_address
from toolkit.api.reasoning import CHOICES as REASONING_CHOICES
from toolkit.cli.options import (
    drain_timeout_option,
    dry_run_option,
    host_option,
    openai_api_options,
    port_option,
    repo_option,
    trace_options,
    triton_url_option,
)
from toolkit.cli.render import emit_json, note
from toolkit.repository.reader import open_repository
from toolkit.serve.net import is_loopback


@dataclass(frozen=True)
class Accelerator:
    """An optional module uvicorn takes when installed, chosen by an option: auto, it, or the stock one."""

    flag: str
    parameter: str
    module: str
    stock: str
    what: str


ACCELERATORS = (
    Accelerator("--loop", "event_loop", "uvloop", "asyncio", "Event loop"),
    Accelerator("--http", "http_impl", "httptools", "h11", "HTTP parser"),
)


def accelerator_options(command):
    """One `auto | MODULE | STOCK` option per accelerator, in ACCELERATORS' order."""
    for accelerator in reversed(ACCELERATORS):
        command = click.option(
            accelerator.flag,
            accelerator.parameter,
            default="auto",
            type=click.Choice(["auto", accelerator.module, accelerator.stock]),
            help=f"{accelerator.what}: auto takes {accelerator.module} when installed.",
        )(command)
    return command


def refuse_missing_accelerators(chosen: dict[str, str]) -> None:
    """A named accelerator that is not installed is a bad parameter (auto falls back instead)."""
    for accelerator in ACCELERATORS:
        module, flag = accelerator.module, accelerator.flag
        if chosen[accelerator.parameter] == module and importlib.util.find_spec(module) is None:
            raise click.BadParameter(
                f"{module} is not installed; pip install {module}, or pass {flag} auto",
                param_hint=flag,
            )


def _http_address(param: click.Parameter, value: str | None) -> str | None:
    if value is not None:
        try:
            http_address(value)
        except ValueError as exc:
            raise click.BadParameter(str(exc), param=param) from None
    return value


@click.command("api")
@triton_url_option("-t", "--triton-url", help="Triton's gRPC address, host:port.")
@repo_option(
    "The served model repository (for its tokenizer, chat template and limits).",
    required=True,
    exists=True,
)
@host_option("Address to bind; 0.0.0.0 exposes the API to the network.")
@port_option("-p", "--port", default=9000, help="Port to listen on.")
@openai_api_options("-w", "--workers")
@click.option(
    "--engine-http-url",
    default=None,
    metavar="HOST:PORT",
    envvar="TOOLKIT_API_ENGINE_HTTP_URL",
    show_envvar=True,
    callback=lambda _ctx, param, value: _http_address(param, value),
    help="Triton's HTTP address: read the engine's token stream from its generate_stream (server-sent "
    "events; ~0.4x the CPU per streamed token of gRPC) instead of gRPC; requests with log probs or a "
    "logit bias still go over gRPC. (`toolkit serve --engine-transport http` sets it.)",
)
@click.option(
    "--model-name",
    default="tensorrt_llm",
    help="Triton model to call: tensorrt_llm (token ids; a disconnect cancels the engine's work) or ensemble / "
    "tensorrt_llm_bls (text in and out).",
)
@click.option(
    "--served-model-name",
    default=None,
    help="The model id clients send; default: the repository's model name.",
)
@click.option(
    "--reasoning-parser",
    default="auto",
    type=click.Choice(REASONING_CHOICES),
    help="How chat answers carry a reasoning model's <think> part (returned as reasoning_content, as vLLM's "
    "parser of that name): auto takes the repository's model's (DeepSeek-R1 distills: deepseek_r1), none "
    "leaves it in content.",
)
@accelerator_options
@click.option(
    "--log-level",
    default="info",
    type=click.Choice(["critical", "error", "warning", "info", "debug"]),
)
@trace_options
@drain_timeout_option(
    "On SIGTERM/Ctrl-C, seconds to let in-flight requests and streams finish (new connections are "
    "refused at once)."
)
@dry_run_option("Print the settings (keys counted, never shown) and exit.")
def command(
    triton_url,
    repo,
    host,
    port,
    workers,
    api_keys,
    max_in_flight,
    stream_interval,
    engine_http_url,
    limits,
    tool_parser,
    special_tokens_in_messages,
    model_name,
    served_model_name,
    reasoning_parser,
    event_loop,
    http_impl,
    log_level,
    trace,
    drain_timeout,
    dry_run,
):
    """Serve the OpenAI API (/v1/chat/completions, /v1/completions, /v1/models, /health, /metrics) over Triton gRPC."""
    from toolkit.api import ApiSettings, run_api

    refuse_missing_accelerators({"event_loop": event_loop, "http_impl": http_impl})
    open_repository(repo)  # a missing or foreign repository is refused before anything is announced
    settings = ApiSettings(
        triton_url,
        repo,
        model_name,
        served_model_name,
        api_keys,
        max_in_flight,
        limits=limits,
        trace=trace,
        reasoning_parser=reasoning_parser,
        tool_parser=tool_parser,
        special_tokens_in_messages=special_tokens_in_messages,
        stream_interval=stream_interval,
        engine_http_url=engine_http_url,
    )
    if dry_run:
        emit_json(
            {
                "triton_url": triton_url,
                "repo": str(repo),
                "host": host,
                "port": port,
                "model_name": model_name,
                "served_model_name": served_model_name,
                "reasoning_parser": reasoning_parser,
                "tool_parser": tool_parser,
                "api_keys": len(api_keys),
                "max_in_flight": max_in_flight,
                "stream_interval": stream_interval,
                "engine_http_url": engine_http_url,
                "header_timeout_s": limits.header_timeout_s,
                "body_timeout_s": limits.body_timeout_s,
                "max_body_bytes": limits.max_body_bytes,
                "body_read_budget_bytes": limits.read_budget_bytes,
                "send_timeout_s": limits.send_timeout_s,
                "stall_timeout_s": limits.stall_timeout_s,
                "loop": event_loop,
                "http": http_impl,
                "drain_timeout_s": drain_timeout,
                "trace": trace.to_dict() if trace else None,
                "workers": workers,
                "special_tokens_in_messages": special_tokens_in_messages,
            }
        )
        return
    if not is_loopback(host) and not api_keys:
        note(
            f"[yellow]warning:[/] binding {host} without API keys: anyone who reaches the port can generate"
        )
    note(
        f"OpenAI API on http://{host}:{port}/v1 -> Triton {triton_url} "
        f"({'API keys required' if api_keys else 'no auth'}"
        f"{f', {workers} worker processes' if workers > 1 else ''})"
    )
    if workers > 1:
        from toolkit.serve.api_process import api_payload, exec_api
        from toolkit.serve.net import check_port_free

        check_port_free(host, port, "--port")
        exec_api(
            api_payload(
                settings,
                host=host,
                port=port,
                workers=workers,
                log_level=log_level,
                loop=event_loop,
                http=http_impl,
                drain_timeout_s=drain_timeout,
            )  # fmt: skip
        )
    run_api(
        settings,
        host=host,
        port=port,
        log_level=log_level,
        loop=event_loop,
        http=http_impl,
        drain_timeout_s=drain_timeout,
    )
