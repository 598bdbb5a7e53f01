"""Environment variables, parsed in one place.

Ours carry the TOOLKIT_ prefix; the Hugging Face ones are read by huggingface_hub itself and only
looked at here to phrase a hint. Secrets (API keys) are read here and handed on in memory: never
on a command line, never into the environment of a child that does not need them.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from toolkit.errors import ToolkitError

HOME = "TOOLKIT_HOME"
API_KEYS = "TOOLKIT_API_KEYS"  # comma-separated bearer keys for the OpenAI API
TRTLLM_BIN_DIR = "TOOLKIT_TRTLLM_BIN_DIR"  # folder holding trtllm-build (default: PATH)
TRTLLM_PYTHON = "TOOLKIT_TRTLLM_PYTHON"  # interpreter that imports tensorrt_llm (default: python3)
TRTLLM_EXAMPLES_DIR = (
    "TOOLKIT_TRTLLM_EXAMPLES_DIR"  # examples/ of a TensorRT-LLM checkout at the pinned tag
)
SECRET_VARIABLES = (API_KEYS, "HF_TOKEN", "HUGGING_FACE_HUB_TOKEN")
# OpenTelemetry's own variables (opentelemetry.io/docs/specs/otel/configuration/sdk-environment-variables):
# the SDKs of the API, of tritonserver and of the engines read them themselves; the toolkit looks at these.
OTEL_ENDPOINT = "OTEL_EXPORTER_OTLP_ENDPOINT"  # base URL; /v1/traces is appended
OTEL_TRACES_ENDPOINT = "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"  # the traces URL, used as it is
OTEL_SAMPLER = "OTEL_TRACES_SAMPLER"
OTEL_SAMPLER_ARG = "OTEL_TRACES_SAMPLER_ARG"
OTEL_SERVICE_NAME = "OTEL_SERVICE_NAME"
OTEL_SDK_DISABLED = "OTEL_SDK_DISABLED"


# --stream-interval's bound: tokens per streamed chunk (model_repo/common/engine_requests.py MAX_STREAM_INTERVAL).
MAX_STREAM_INTERVAL = 1024

# On SIGTERM/Ctrl-C: how long tritonserver (--exit-timeout-secs) and the API let in-flight requests finish.
EXIT_TIMEOUT_S = 30
# The default body read budget, in largest bodies: enough for a few large prompts arriving at once,
# while the memory they hold stays a small multiple of --max-body-mib (docs/api.md, "Memory").
BODY_READ_BUDGET_BODIES = 4


@dataclass(frozen=True)
class ApiLimits:
    """What one client may hold of the OpenAI API before it is refused (`toolkit api` / `toolkit serve` options).

    A request's headers must arrive within `header_timeout_s` of the connection opening (or of the
    previous response on a kept-alive connection), else 408 and the connection is closed; its whole
    body within `body_timeout_s` of its headers, else 408. One deadline for the whole body, not an
    idle timeout: a client sending a byte a second is never idle, yet must not hold a connection
    forever. A body over `max_body_bytes` is a 413 (at once when Content-Length says so). A request
    counts against --max-in-flight only once its whole body has arrived. Only generation requests'
    bodies are read, and all of those being read at once hold at most `read_budget_bytes` (else 503).
    A response write that waits `send_timeout_s` for a client that does not read closes the connection.
    When nothing at all comes from the engine for `stall_timeout_s` while requests wait (a hung engine
    behind a Triton that still answers readiness), those requests end and /health turns 503.
    """

    header_timeout_s: float = 10.0
    body_timeout_s: float = 30.0
    # 8 MiB: a 128k-token prompt is ~0.5-1 MB of JSON (up to ~3 MB with every character \u-escaped).
    max_body_bytes: int = 8 * 2**20
    # Bytes of bodies being read (before admission) across all connections; None: BODY_READ_BUDGET_BODIES bodies.
    body_read_budget_bytes: int | None = None
    send_timeout_s: float = 30.0
    # Far above the slowest normal wait for a token (docs/api.md, "A hung engine").
    stall_timeout_s: float = 120.0

    def __post_init__(self) -> None:
        if not self.stall_timeout_s > 0:
            raise ToolkitError(
                f"the stall timeout must be a positive number of seconds, not {self.stall_timeout_s!r}",
                hint="pass --stall-timeout above 0, or leave it at its default",
            )
        if self.read_budget_bytes < self.max_body_bytes:
            raise ToolkitError(
                f"the body read budget ({self.read_budget_bytes} bytes) is smaller than the largest body "
                f"({self.max_body_bytes} bytes): no body that large could ever be read",
                hint="raise --body-read-budget-mib to at least --max-body-mib, or leave it at its default",
            )

    @property
    def read_budget_bytes(self) -> int:
        """Bytes of request bodies the API reads at once, before admission (the explicit budget or the default)."""
        if self.body_read_budget_bytes is not None:
            return self.body_read_budget_bytes
        return BODY_READ_BUDGET_BODIES * self.max_body_bytes


def toolkit_home() -> Path:
    """Where the toolkit keeps caches (converted checkpoints, build cache, logs); TOOLKIT_HOME overrides."""
    env = os.environ.get(HOME)
    if env:
        return Path(env).expanduser()
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "toolkit"


def cache_dir(*parts: str) -> Path:
    path = toolkit_home().joinpath(*parts)
    path.mkdir(parents=True, exist_ok=True)
    return path


def hub_offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "") not in ("", "0")


@dataclass(frozen=True)
class TrtllmTools:
    """Where the TensorRT-LLM tools are: TOOLKIT_TRTLLM_* or the defaults."""

    trtllm_build: str
    python: str
    examples_dir: str


def trtllm_tools() -> TrtllmTools:
    bin_dir = os.environ.get(TRTLLM_BIN_DIR)
    examples = os.environ.get(TRTLLM_EXAMPLES_DIR) or str(
        toolkit_home() / "TensorRT-LLM" / "examples"
    )
    return TrtllmTools(
        trtllm_build=str(Path(bin_dir) / "trtllm-build") if bin_dir else "trtllm-build",
        python=os.environ.get(TRTLLM_PYTHON) or "python3",
        examples_dir=examples,
    )


def api_keys(key_files: tuple[Path, ...] | list[Path] = ()) -> tuple[str, ...]:
    """Bearer keys from files (one per line, `#` comments) and TOOLKIT_API_KEYS, blanks dropped, order kept.

    A key file or a set TOOLKIT_API_KEYS that holds no key is an error: it means keys were meant (a
    secret mounted empty, a variable left blank), and serving without any would turn authentication
    off without a word."""
    keys: list[str] = []
    for path in key_files:
        found = _key_file(Path(path))
        if not found:
            raise ToolkitError(
                f"the API key file {path} holds no API key (only blank lines or # comments)",
                hint="put one key per line in it, or leave --api-key-file out to serve without keys",
                value=str(path),
            )
        keys += found
    variable = os.environ.get(API_KEYS)
    if variable is not None and variable != "":
        found = [part.strip() for part in variable.split(",") if part.strip()]
        if not found:
            raise ToolkitError(
                f"{API_KEYS} is set but holds no API key ({variable!r})",
                hint=f"set it to comma-separated keys, or unset {API_KEYS} to serve without keys",
            )
        keys += found
    return tuple(dict.fromkeys(keys))


def _key_file(path: Path) -> list[str]:
    """The keys of one key file."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise ToolkitError(
            f"cannot read the API key file {path}: {exc.strerror}",
            hint="pass a readable file with one key per line to --api-key-file",
        ) from exc
    except UnicodeDecodeError as exc:
        raise ToolkitError(
            f"the API key file {path} is not UTF-8 text (byte {exc.start}: {exc.reason})",
            hint="pass a text file with one key per line to --api-key-file",
        ) from exc
    return [line.strip() for line in lines if line.strip() and not line.lstrip().startswith("#")]


@dataclass(frozen=True)
class OtelEnvironment:
    """What the OTEL_* variables say, as far as the toolkit decides anything from them."""

    endpoint: str | None = None
    traces_endpoint: str | None = None
    sampler: str | None = None
    sampler_arg: str | None = None
    service_name: str | None = None
    sdk_disabled: bool = False


def otel_environment(values: dict | None = None) -> OtelEnvironment:
    env = dict(os.environ) if values is None else values
    return OtelEnvironment(
        endpoint=env.get(OTEL_ENDPOINT) or None,
        traces_endpoint=env.get(OTEL_TRACES_ENDPOINT) or None,
        sampler=env.get(OTEL_SAMPLER) or None,
        sampler_arg=env.get(OTEL_SAMPLER_ARG) or None,
        service_name=env.get(OTEL_SERVICE_NAME) or None,
        sdk_disabled=env.get(OTEL_SDK_DISABLED, "").strip().lower() == "true",
    )


def child_environment(base: dict | None = None, *, keep_secrets: tuple[str, ...] = ()) -> dict:
    """A copy of the environment for a child process, without the secrets it does not need."""
    env = dict(os.environ if base is None else base)
    for name in SECRET_VARIABLES:
        if name not in keep_secrets:
            env.pop(name, None)
    return env
