"""Options several commands share, declared once; build settings' options derived from their declarations.

Environment variables are declared here, explicitly, on the options they stand for (and shown in
--help): no option reads the environment unless it says so.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import click

from toolkit.build_settings import SETTINGS, BuildSettings, Setting, rows
from toolkit.settings import (
    API_KEYS,
    BODY_READ_BUDGET_BODIES,
    EXIT_TIMEOUT_S,
    MAX_STREAM_INTERVAL,
    OTEL_ENDPOINT,
    OTEL_SAMPLER,
    ApiLimits,
    api_keys,
)

REPO_ENV = "TOOLKIT_REPO"  # the repository a command works on
TRITON_URL_ENV = "TOOLKIT_TRITON_URL"  # Triton's gRPC address for the commands that talk to it
# The OpenAI API's limits, for `api` and `serve` alike: TOOLKIT_API_HEADER_TIMEOUT, ...
API_ENV_PREFIX = "TOOLKIT_API_"
DEFAULT_TRITON_GRPC = "127.0.0.1:8001"
DEFAULT_MAX_IN_FLIGHT = 64


def repo_option(
    help: str, *, default: Path | None = None, required: bool = False, exists: bool = False
):
    """-r/--repo: a repository folder (also $TOOLKIT_REPO)."""
    return click.option(
        "-r",
        "--repo",
        type=click.Path(path_type=Path, file_okay=False, exists=exists),
        default=default,
        required=required,
        envvar=REPO_ENV,
        show_envvar=True,
        help=help,
    )


def triton_url_option(*decls: str, default: str | None = DEFAULT_TRITON_GRPC, help: str):
    """Triton's address (also $TOOLKIT_TRITON_URL), under the command's own option names."""
    return click.option(*decls, default=default, envvar=TRITON_URL_ENV, show_envvar=True, help=help)


PORT = click.IntRange(1, 65535)  # a TCP port


def model_option(help: str, **declaration: Any):
    """-m/--model: what the command works with (a checkpoint to build or plan, a served model to call)."""
    return click.option("-m", "--model", help=help, **declaration)


def output_option(default: Path, help: str):
    """-o/--output: the folder the command writes."""
    return click.option(
        "-o", "--output", type=click.Path(path_type=Path), default=default, help=help
    )


def dry_run_option(help: str):
    """--dry-run: say what the command would do, and do nothing."""
    return click.option("--dry-run", is_flag=True, help=help)


def host_option(help: str):
    """--host: the address the command's server listens on."""
    return click.option("--host", default="127.0.0.1", help=help)


def port_option(*decls: str, default: int | None, help: str):
    """A TCP port the command listens on (or serves a server on), under the command's option names."""
    return click.option(*decls, type=PORT, default=default, help=help)


def timeout_option(
    help: str, *, default: float, minimum: float | None = None, name: str = "--timeout"
):
    """--timeout (or the command's own name for it): seconds the command waits, at least `minimum`."""
    kind = float if minimum is None else click.FloatRange(min=minimum)
    return click.option(name, type=kind, default=default, help=help)


def json_option(function):
    return click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")(
        function
    )


def drain_timeout_option(help: str):
    return click.option(
        "--drain-timeout", type=click.IntRange(min=1), default=EXIT_TIMEOUT_S, help=help
    )


def max_in_flight_option(function):
    return click.option(
        "--max-in-flight",
        type=click.IntRange(min=1),
        default=DEFAULT_MAX_IN_FLIGHT,
        envvar=f"{API_ENV_PREFIX}MAX_IN_FLIGHT",
        show_envvar=True,
        help="OpenAI API: generation requests served at once; more get 429 with Retry-After.",
    )(function)


def api_workers_option(*decls: str):
    return click.option(
        *decls,
        "api_workers" if "--api-workers" in decls else "workers",
        type=click.IntRange(1, 64),
        default=1,
        envvar=f"{API_ENV_PREFIX}WORKERS",
        show_envvar=True,
        help="OpenAI API: worker processes on its one port (one core relays ~10k streamed tokens/s); "
        "--max-in-flight and the metrics count them all.",
    )


def stream_interval_option(function):
    return click.option(
        "--stream-interval",
        type=click.IntRange(1, MAX_STREAM_INTERVAL),
        default=1,
        envvar=f"{API_ENV_PREFIX}STREAM_INTERVAL",
        show_envvar=True,
        show_default=True,
        help="OpenAI API: engine steps per streamed chunk after the first token, which goes at once (as "
        "trtllm-serve's and SGLang's stream_interval). Above 1, fewer, larger chunks cost the API less "
        "CPU per token; each token waits up to that many steps. The CPU and synthetic engines answer that "
        "often themselves; on GPU the API groups the engine's per-step responses.",
    )(function)


ENGINE_TRANSPORTS = ("grpc", "http")


def engine_transport_option(function):
    return click.option(
        "--engine-transport",
        type=click.Choice(ENGINE_TRANSPORTS),
        default="http",
        envvar=f"{API_ENV_PREFIX}ENGINE_TRANSPORT",
        show_envvar=True,
        show_default=True,
        help="OpenAI API: how it reads the engine's token stream from tritonserver. http: Triton's "
        "generate_stream (server-sent events; ~0.4x the API CPU per streamed token of gRPC in "
        "perf/results/api_floor.md; requests with log probs or a logit bias still go over gRPC); grpc: "
        "ModelStreamInfer for every request.",
    )(function)


def openai_api_options(*worker_decls: str):
    """The OpenAI API's own options, for `api` and `serve` alike: its worker processes (under the command's
    option names), bearer keys, --max-in-flight, limits, tool-call parsing and special tokens."""

    def decorate(function):
        for option in (
            special_tokens_option,
            tool_parser_option,
            api_limit_options,
            max_in_flight_option,
            stream_interval_option,
            api_key_options,
            api_workers_option(*worker_decls),
        ):
            function = option(function)
        return function

    return decorate


def api_key_options(function):
    """-k/--api-key-file (repeatable) and a hidden --api-key that refuses a key on the command line; the
    command gets `api_keys`, the keys read (also from $TOOLKIT_API_KEYS) when it is invoked."""
    command = function

    @functools.wraps(command)
    def with_keys(*args, api_key_files, api_key, **kwargs):
        reject_api_key_value(api_key)
        return command(*args, api_keys=api_keys(api_key_files), **kwargs)

    function = click.option("--api-key", "api_key", default=None, hidden=True, expose_value=True)(
        with_keys
    )
    return click.option(
        "-k",
        "--api-key-file",
        "api_key_files",
        multiple=True,
        type=click.Path(exists=True, dir_okay=False, path_type=Path),
        help=f"OpenAI API: a file of bearer keys, one per line (repeatable); also {API_KEYS} (comma-separated). "
        "None: no auth.",
    )(function)


def reject_api_key_value(value: str | None) -> None:
    if value is not None:
        raise click.UsageError(
            "--api-key takes no key on the command line (every user of this machine can read it in `ps`); "
            f"put the key in a file and pass -k/--api-key-file FILE, or set {API_KEYS}"
        )


# --- the OpenAI API's limits (toolkit.settings.ApiLimits), for `api` and `serve` --------------------
MIB = 2**20
# option -> (ApiLimits field, the field's units per option unit, help)
_LIMITS: dict[str, tuple[str, float, str]] = {
    "header_timeout": (
        "header_timeout_s",
        1,
        "OpenAI API: seconds a client has to send a request's headers (from connecting, or from the "
        "previous response); then 408 and the connection is closed.",
    ),
    "body_timeout": (
        "body_timeout_s",
        1,
        "OpenAI API: seconds a client has to send a request's whole body once its headers are in; then "
        "408. No request counts against --max-in-flight before its body is in.",
    ),
    "max_body_mib": (
        "max_body_bytes",
        MIB,
        "OpenAI API: largest request body, in MiB; a larger one is refused with 413.",
    ),
    "body_read_budget_mib": (
        "body_read_budget_bytes",
        MIB,
        "OpenAI API: MiB of request bodies read at once (before admission), over all connections; a "
        "body that would pass it gets 503 with Retry-After at once.",
    ),
    "send_timeout": (
        "send_timeout_s",
        1,
        "OpenAI API: seconds a response write may wait for a client that does not read (its write "
        "buffer full); then the connection is closed and its generation cancelled.",
    ),
    "stall_timeout": (
        "stall_timeout_s",
        1,
        "OpenAI API: seconds with nothing at all from the engine while requests wait before those "
        "requests end (504, or an error event) and /health answers 503: a hung engine.",
    ),
}


def api_limit_options(function):
    """The ApiLimits options; the command gets them as one argument, `limits` (an ApiLimits, whose
    checks run when the command is invoked)."""
    command = function

    @functools.wraps(command)
    def with_limits(*args, **kwargs):
        kwargs["limits"] = api_limits({name: kwargs.pop(name) for name in _LIMITS})
        return command(*args, **kwargs)

    defaults = ApiLimits()
    function = with_limits
    for name, (field, scale, text) in reversed(_LIMITS.items()):
        default = getattr(defaults, field)
        shown: Any = True if default is not None else f"{BODY_READ_BUDGET_BODIES} x --max-body-mib"
        function = click.option(
            f"--{name.replace('_', '-')}",
            type=click.FloatRange(min=0, min_open=True),
            default=None if default is None else default / scale,
            show_default=shown,
            envvar=f"{API_ENV_PREFIX}{name.upper()}",
            show_envvar=True,
            help=text,
        )(function)
    return function


def api_limits(values: dict[str, float | None]) -> ApiLimits:
    """ApiLimits from the options' values (in their units: seconds, MiB)."""
    fields: dict[str, Any] = {}
    for name, value in values.items():
        field, scale, _ = _LIMITS[name]
        fields[field] = None if value is None else (int(value * scale) if scale != 1 else value)
    return ApiLimits(**fields)


# --- tracing (toolkit.trace.config), for `api` and `serve` -----------------------------------------
TRACE_RATE_ENV = "TOOLKIT_TRACE_RATE"


def trace_options(function):
    """--trace-rate and --otlp-endpoint; the command gets `trace`, a TracePlan or None (off), decided
    when it is invoked (with the OTEL_* variables)."""
    command = function

    @functools.wraps(command)
    def with_trace(*args, **kwargs):
        from toolkit.trace.config import plan_tracing

        kwargs["trace"] = plan_tracing(kwargs.pop("trace_rate"), kwargs.pop("otlp_endpoint"))
        return command(*args, **kwargs)

    function = otlp_endpoint_option(
        f"Traces: the OTLP/HTTP endpoint (base URL) every layer exports to [default: {OTEL_ENDPOINT}]; "
        f"with --trace-rate or {OTEL_SAMPLER}."
    )(with_trace)
    return trace_rate_option(
        "Traces: the fraction of requests traced across the API, Triton and the engine (0: off, "
        f"the default unless {OTEL_SAMPLER} is set); a client's sampled traceparent is always followed.",
        envvar=TRACE_RATE_ENV,
    )(function)


def otlp_endpoint_option(help: str):
    """--otlp-endpoint: where traces go (None: the command's default)."""
    return click.option("--otlp-endpoint", default=None, metavar="URL", help=help)


def trace_rate_option(help: str, envvar: str | None = None):
    """--trace-rate: the fraction of requests traced (None: the command's default)."""
    return click.option(
        "--trace-rate",
        type=click.FloatRange(0, 1),
        default=None,
        envvar=envvar,
        show_envvar=envvar is not None,
        help=help,
    )


# --- build settings: options derived from toolkit.build_settings, one declaration each ------------
class SettingType(click.ParamType):
    """A build setting's value, parsed and checked by its declaration (the rule recipes use too)."""

    def __init__(self, row: Setting):
        self.row = row
        self.name = row.kind.__name__

    def convert(self, value, param, ctx):
        if not isinstance(value, str):
            return value
        try:
            return self.row.parse_text(value)
        except ValueError as exc:
            self.fail(f"{exc} (fix: pass {self.row.flag} as {self.row.expected()})", param, ctx)

    def get_metavar(self, param, ctx=None) -> str:
        if self.row.multiple:
            return "NAME=PATH"
        if self.row.choices:
            return "[" + "|".join(str(choice) for choice in self.row.choices) + "]"
        return {int: "INTEGER", float: "FLOAT", str: "TEXT", Path: "PATH"}[self.row.kind]


def setting_options(*names: str):
    """click options for these build settings (all of them when none is named), in the table's order."""

    def decorate(function):
        for row in reversed(list(rows(names or None))):
            text = f"{row.help} [default: {row.default}]"
            if row.kind is bool:
                decls = [f"--{row.option}/--{row.negation}", row.name]
                function = click.option(*decls, default=None, help=text)(function)
            elif row.multiple:  # repeatable NAME=PATH: the pairs, or None when not given
                function = click.option(
                    f"--{row.option}",
                    row.name,
                    type=SettingType(row),
                    multiple=True,
                    callback=lambda _ctx, _param, value: tuple(value) or None,
                    help=text,
                )(function)
            else:
                decls = [*([row.short] if row.short else []), f"--{row.option}", row.name]
                function = click.option(
                    *decls, type=SettingType(row), default=None, show_default=False, help=text
                )(function)
        return function

    return decorate


def pop_settings(values: dict) -> BuildSettings:
    """The BuildSettings among a command's keyword arguments (removed from `values`)."""
    return BuildSettings(**{name: values.pop(name) for name in SETTINGS if name in values})


def tool_parser_option(function):
    """--tool-parser: how the OpenAI API reads tool calls from the output (toolkit.api.tool_parsers)."""
    from toolkit.api.tool_parsers import CHOICES

    return click.option(
        "--tool-parser",
        default="auto",
        type=click.Choice(CHOICES),
        show_default=True,
        help="OpenAI API: how tool calls are read from the output with tool_choice auto: auto picks the family "
        "whose markers the model's tokenizer has (hermes: Qwen2.5 <tool_call>, mistral: [TOOL_CALLS], "
        "llama3_json: Llama 3.x JSON and <|python_tag|>); none reads no calls.",
    )(function)


def special_tokens_option(function):
    """--special-tokens-in-messages: trust special-token text in chat message content."""
    return click.option(
        "--special-tokens-in-messages",
        is_flag=True,
        help="OpenAI API, trusted callers only: read special-token text in chat message content "
        "(<|im_start|>, ...) as those tokens. Off, content is plain text, as at OpenAI, and no message "
        "can forge a turn of another role.",
    )(function)
