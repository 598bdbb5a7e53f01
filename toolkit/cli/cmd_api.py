"""`toolkit api`: the OpenAI-compatible API in front of a running Triton server."""

from __future__ import annotations

import functools
import importlib.util
from pathlib import Path

import click

from toolkit.cli.options import api_key_options, reject_api_key_value
from toolkit.cli.render import emit_json, note
from toolkit.repository.reader import open_repository
from toolkit.serve.net import is_loopback
from toolkit.settings import BODY_READ_BUDGET_BODIES, EXIT_TIMEOUT_S, ApiLimits
from toolkit.settings import api_keys as read_api_keys

# The options api_limit_options adds, in api_limits' order.
LIMIT_OPTIONS = (
    "header_timeout",
    "body_timeout",
    "max_body_mib",
    "body_read_budget_mib",
    "send_timeout",
    "stall_timeout",
)


SPECIAL_TOKENS_OPTION = click.option(
    "--special-tokens-in-messages",
    is_flag=True,
    help="OpenAI API, trusted callers only: read special-token text in chat message content "
    "(<|im_start|>, ...) as those tokens. Off, content is plain text, as at OpenAI, and no message "
    "can forge a turn of another role.",
)


def api_limit_options(function):
    """--header-timeout, --body-timeout, --max-body-mib, --body-read-budget-mib, --send-timeout,
    --stall-timeout (toolkit.settings.ApiLimits), for `api` and `serve`: the command gets them as one
    argument, `limits` (an ApiLimits; its checks run when the command is invoked)."""

    command = function

    @functools.wraps(command)
    def with_limits(*args, **kwargs):
        kwargs["limits"] = api_limits(*(kwargs.pop(name) for name in LIMIT_OPTIONS))
        return command(*args, **kwargs)

    defaults = ApiLimits()
    function = with_limits
    for option in reversed(
        (
            click.option(
                "--header-timeout",
                type=click.FloatRange(min=0, min_open=True),
                default=defaults.header_timeout_s,
                help="OpenAI API: seconds a client has to send a request's headers (from connecting, or from "
                "the previous response); then 408 and the connection is closed.",
            ),
            click.option(
                "--body-timeout",
                type=click.FloatRange(min=0, min_open=True),
                default=defaults.body_timeout_s,
                help="OpenAI API: seconds a client has to send a request's whole body once its headers are in; "
                "then 408. No request counts against --max-in-flight before its body is in.",
            ),
            click.option(
                "--max-body-mib",
                type=click.FloatRange(min=0, min_open=True),
                default=defaults.max_body_bytes / 2**20,
                help="OpenAI API: largest request body, in MiB; a larger one is refused with 413.",
            ),
            click.option(
                "--body-read-budget-mib",
                type=click.FloatRange(min=0, min_open=True),
                default=None,
                show_default=f"{BODY_READ_BUDGET_BODIES} x --max-body-mib",
                help="OpenAI API: MiB of request bodies read at once (before admission), over all "
                "connections; a body that would pass it gets 503 with Retry-After at once.",
            ),
            click.option(
                "--send-timeout",
                type=click.FloatRange(min=0, min_open=True),
                default=defaults.send_timeout_s,
                help="OpenAI API: seconds a response write may wait for a client that does not read "
                "(its write buffer full); then the connection is closed and its generation cancelled.",
            ),
            click.option(
                "--stall-timeout",
                type=click.FloatRange(min=0, min_open=True),
                default=defaults.stall_timeout_s,
                help="OpenAI API: seconds with nothing at all from the engine while requests wait before "
                "those requests end (504, or an error event) and /health answers 503: a hung engine.",
            ),
        )
    ):
        function = option(function)
    return function


def api_limits(
    header_timeout: float,
    body_timeout: float,
    max_body_mib: float,
    body_read_budget_mib: float | None,
    send_timeout: float,
    stall_timeout: float,
) -> ApiLimits:
    return ApiLimits(
        header_timeout_s=header_timeout,
        body_timeout_s=body_timeout,
        max_body_bytes=int(max_body_mib * 2**20),
        body_read_budget_bytes=None
        if body_read_budget_mib is None
        else int(body_read_budget_mib * 2**20),
        send_timeout_s=send_timeout,
        stall_timeout_s=stall_timeout,
    )


@click.command("api")
@click.option(
    "-t", "--triton-url", default="127.0.0.1:8001", help="Triton's gRPC address, host:port."
)
@click.option(
    "-r",
    "--repo",
    "repo",
    required=True,
    type=click.Path(exists=True, file_okay=False, path_type=Path),
    help="The served model repository (for its tokenizer, chat template and limits).",
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
    "--max-in-flight",
    default=64,
    type=click.IntRange(1),
    help="Generation requests served at once; more get 429 with Retry-After.",
)
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
@click.option(
    "--drain-timeout",
    type=click.IntRange(min=1),
    default=EXIT_TIMEOUT_S,
    help="On SIGTERM/Ctrl-C, seconds to let in-flight requests and streams finish (new connections are "
    "refused at once).",
)
@SPECIAL_TOKENS_OPTION
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
