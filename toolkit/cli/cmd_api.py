"""`toolkit api`: the OpenAI-compatible API in front of a running Triton server."""

from __future__ import annotations

import importlib.util

import click

from toolkit.api.reasoning import CHOICES as REASONING_CHOICES
from toolkit.cli.options import (
    api_key_options,
    api_limit_options,
    drain_timeout_option,
    max_in_flight_option,
    reject_api_key_value,
    repo_option,
    special_tokens_option,
    tool_parser_option,
    triton_url_option,
)
from toolkit.cli.render import emit_json, note
from toolkit.repository.reader import open_repository
from toolkit.serve.net import is_loopback
from toolkit.settings import api_keys as read_api_keys


@click.command("api")
@triton_url_option("-t", "--triton-url", help="Triton's gRPC address, host:port.")
@repo_option(
    "The served model repository (for its tokenizer, chat template and limits).",
    required=True,
    exists=True,
)
@click.option(
    "--host", default="127.0.0.1", help="Address to bind; 0.0.0.0 exposes the API to the network."
)
@click.option(
    "-p", "--port", default=9000, type=click.IntRange(1, 65535), help="Port to listen on."
)
@api_key_options
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
@tool_parser_option
@max_in_flight_option
@api_limit_options
@click.option(
    "--loop",
    "event_loop",
    default="auto",
    type=click.Choice(["auto", "uvloop", "asyncio"]),
    help="Event loop: auto takes uvloop when installed.",
)
@click.option(
    "--http",
    "http_impl",
    default="auto",
    type=click.Choice(["auto", "httptools", "h11"]),
    help="HTTP parser: auto takes httptools when installed.",
)
@click.option(
    "--log-level",
    default="info",
    type=click.Choice(["critical", "error", "warning", "info", "debug"]),
)
@drain_timeout_option(
    "On SIGTERM/Ctrl-C, seconds to let in-flight requests and streams finish (new connections are "
    "refused at once)."
)
@special_tokens_option
@click.option(
    "--dry-run", is_flag=True, help="Print the settings (keys counted, never shown) and exit."
)
def command(
    triton_url,
    repo,
    host,
    port,
    api_key_files,
    api_key,
    model_name,
    served_model_name,
    reasoning_parser,
    tool_parser,
    max_in_flight,
    limits,
    event_loop,
    http_impl,
    log_level,
    drain_timeout,
    special_tokens_in_messages,
    dry_run,
):
    """Serve the OpenAI API (/v1/chat/completions, /v1/completions, /v1/models, /health, /metrics) over Triton gRPC."""
    from toolkit.api import ApiSettings, run_api

    reject_api_key_value(api_key)
    for choice, module, flag in (
        (event_loop, "uvloop", "--loop"),
        (http_impl, "httptools", "--http"),
    ):
        if choice == module and importlib.util.find_spec(module) is None:
            raise click.BadParameter(
                f"{module} is not installed; pip install {module}, or pass {flag} auto",
                param_hint=flag,
            )
    keys = read_api_keys(api_key_files)
    open_repository(repo)  # a missing or foreign repository is refused before anything is announced
    settings = ApiSettings(
        triton_url,
        repo,
        model_name,
        served_model_name,
        keys,
        max_in_flight,
        limits=limits,
        reasoning_parser=reasoning_parser,
        tool_parser=tool_parser,
        special_tokens_in_messages=special_tokens_in_messages,
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
                "api_keys": len(keys),
                "max_in_flight": max_in_flight,
                "header_timeout_s": limits.header_timeout_s,
                "body_timeout_s": limits.body_timeout_s,
                "max_body_bytes": limits.max_body_bytes,
                "body_read_budget_bytes": limits.read_budget_bytes,
                "send_timeout_s": limits.send_timeout_s,
                "stall_timeout_s": limits.stall_timeout_s,
                "loop": event_loop,
                "http": http_impl,
                "drain_timeout_s": drain_timeout,
                "special_tokens_in_messages": special_tokens_in_messages,
            }
        )
        return
    if not is_loopback(host) and not keys:
        note(
            f"[yellow]warning:[/] binding {host} without API keys: anyone who reaches the port can generate"
        )
    note(
        f"OpenAI API on http://{host}:{port}/v1 -> Triton {triton_url} "
        f"({'API keys required' if keys else 'no auth'})"
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
