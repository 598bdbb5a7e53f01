"""Whether and where the stack traces: one decision from `--trace-rate`, `--otlp-endpoint` and the OTEL_* variables.

Off by default. On when an OTLP/HTTP endpoint is known (`--otlp-endpoint`, OTEL_EXPORTER_OTLP_ENDPOINT or
OTEL_EXPORTER_OTLP_TRACES_ENDPOINT) and a sampling rule is given: `--trace-rate R` (a fraction of the
requests that reach the API, parent-based: a client's sampled `traceparent` is always followed), or
OTEL_TRACES_SAMPLER (and _ARG) as the OpenTelemetry SDK reads them. OTEL_SDK_DISABLED=true keeps it off.

Every layer then exports to the same endpoint: the API (toolkit.trace.provider), tritonserver in its
OpenTelemetry mode (`triton_args`; it traces every request that carries a context, whatever its own
rate, so behind the API it runs at rate 0 and traces exactly what the API sampled), and the engines in
the Python backend (model_repo/common/tracing.py, switched on by `engine_environment`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from urllib.parse import urlsplit

from toolkit.errors import TraceError
from toolkit.settings import (
    OTEL_ENDPOINT,
    OTEL_SAMPLER,
    OTEL_SAMPLER_ARG,
    OTEL_SERVICE_NAME,
    OTEL_TRACES_ENDPOINT,
    OtelEnvironment,
    otel_environment,
)

DEFAULT_SERVICE = "toolkit"
TRACES_PATH = "/v1/traces"
# Read by the engines' tracing (model_repo/common/tracing.py): spans only when tritonserver runs with it.
ENGINE_SWITCH = "TOOLKIT_TRACE_ENGINES"
# Triton's batch span processor exports every 5 s by default (docs/user_guide/trace.md); 1 s keeps a
# trace whole within a second or two of its request, at one small POST a second.
TRITON_EXPORT_DELAY_MS = 1000


@dataclass(frozen=True)
class TracePlan:
    """Tracing as it will run: where spans go and how requests are sampled."""

    traces_url: str  # the OTLP/HTTP traces URL (…/v1/traces)
    api_ratio: float | None  # the API's parent-based ratio; None: OTEL_TRACES_SAMPLER decides
    service_name: str

    @property
    def triton_direct_rate(self) -> int:
        """Triton's own rate (1 in N) for requests that come without a context: 1/ratio."""
        ratio = 1.0 if self.api_ratio is None else self.api_ratio
        return max(1, round(1 / ratio))

    def to_dict(self) -> dict:
        return {
            "traces_url": self.traces_url,
            "api_ratio": self.api_ratio,
            "service_name": self.service_name,
        }


def plan_tracing(
    rate: float | None = None, endpoint: str | None = None, env: OtelEnvironment | None = None
) -> TracePlan | None:
    """The tracing to run, or None when it is off. `rate`: --trace-rate (0 turns it off whatever the
    environment says); `endpoint`: --otlp-endpoint, a base URL as OTEL_EXPORTER_OTLP_ENDPOINT; given
    without a rate or a sampler it is refused (it would trace nothing, silently)."""
    env = env or otel_environment()
    if rate is not None and not (math.isfinite(rate) and 0 <= rate <= 1):
        raise TraceError(
            f"--trace-rate {rate!r} is not a fraction of requests",
            hint="pass a number from 0 (off) to 1 (every request), e.g. --trace-rate 0.01",
            value=rate,
        )
    if endpoint and rate is None and env.sampler is None and not env.sdk_disabled:
        raise TraceError(
            f"--otlp-endpoint {endpoint} is set but nothing samples requests: tracing would stay off",
            hint="add --trace-rate 0.01 (1 % of requests) or --trace-rate 1 (every request), or set "
            "OTEL_TRACES_SAMPLER",
            value=endpoint,
        )
    if env.sdk_disabled or rate == 0 or (rate is None and env.sampler is None):
        return None
    if rate is None:
        _check_sampler(env)
    url = traces_url(endpoint, env)
    if url is None:
        raise TraceError(
            "tracing is on (--trace-rate or OTEL_TRACES_SAMPLER) but no OTLP endpoint is set",
            hint=f"set {OTEL_ENDPOINT}=http://127.0.0.1:4318 (or pass --otlp-endpoint); `toolkit trace "
            "collect` runs a receiver there",
        )
    return TracePlan(url, rate, env.service_name or DEFAULT_SERVICE)


# The SDK's own samplers by OTEL_TRACES_SAMPLER's value (opentelemetry.sdk.trace.sampling); the ratio
# ones read OTEL_TRACES_SAMPLER_ARG. The SDK takes any other name as parentbased_always_on, with a log
# line: a misspelt sampler traced every request.
SAMPLERS = (
    "always_on", "always_off", "traceidratio", "parentbased_always_on", "parentbased_always_off",
    "parentbased_traceidratio",
)  # fmt: skip


def _check_sampler(env: OtelEnvironment) -> None:
    name = (env.sampler or "").lower()  # as the SDK reads it (no strip)
    if name not in SAMPLERS:
        raise TraceError(
            f"{OTEL_SAMPLER}={env.sampler} is not a sampler the OpenTelemetry SDK knows (it would trace "
            "every request instead)",
            hint=f"set it to one of {', '.join(SAMPLERS)}, or pass --trace-rate R instead",
            value=env.sampler,
        )
    if name.endswith("traceidratio"):
        try:
            ratio = float(env.sampler_arg or "")
        except ValueError:
            ratio = math.nan
        if not (math.isfinite(ratio) and 0 <= ratio <= 1):
            raise TraceError(
                f"{OTEL_SAMPLER_ARG}={env.sampler_arg or '(unset)'} is not a fraction of requests, which "
                f"{OTEL_SAMPLER}={env.sampler} reads (the SDK would trace every request instead)",
                hint=f"set {OTEL_SAMPLER_ARG} to a number from 0 to 1, e.g. 0.01",
                value=env.sampler_arg,
            )


def traces_url(endpoint: str | None, env: OtelEnvironment) -> str | None:
    """The traces URL as the OTLP exporters build it: a base endpoint gets /v1/traces appended, the
    traces-specific variable is used as it is."""
    if endpoint:
        return base_endpoint(endpoint, "--otlp-endpoint").rstrip("/") + TRACES_PATH
    if env.traces_endpoint:
        return http_url(env.traces_endpoint, OTEL_TRACES_ENDPOINT)
    if env.endpoint:
        return base_endpoint(env.endpoint, OTEL_ENDPOINT).rstrip("/") + TRACES_PATH
    return None


def base_endpoint(url: str, given_as: str) -> str:
    """An OTLP/HTTP base URL (`given_as`: the flag or variable it came from), to which /v1/traces is
    appended: one that already ends in it would send every span to …/v1/traces/v1/traces, a 404 that
    the exporters only log."""
    url = http_url(url, given_as)
    if url.rstrip("/").endswith(TRACES_PATH):
        raise TraceError(
            f"{_shown(given_as, url)} is a traces URL, but it takes the collector's base URL: "
            f"{TRACES_PATH} is appended to it",
            hint=f"drop {TRACES_PATH} ({url.rstrip('/')[: -len(TRACES_PATH)] or url}), or set the whole "
            f"traces URL in {OTEL_TRACES_ENDPOINT} instead",
            value=url,
        )
    return url


def _shown(given_as: str, value: str) -> str:
    """A value as the person wrote it: `--flag VALUE`, or `VARIABLE=VALUE`."""
    return f"{given_as}={value}" if given_as.isupper() else f"{given_as} {value}"


def http_url(url: str, given_as: str) -> str:
    """`url` as an http(s) URL of a host (http:// when it names none); TraceError naming `given_as`, the
    flag or variable it came from, when it is none."""
    url = url.strip()
    if "://" not in url:
        url = f"http://{url}"
    parsed = urlsplit(url)
    try:
        parsed.port  # noqa: B018 - raises on a port that is none (99999, abc)
    except ValueError:
        parsed = parsed._replace(netloc="")
    if (
        parsed.scheme not in ("http", "https")
        or not parsed.hostname
        or any(c.isspace() for c in url)
    ):
        raise TraceError(
            f"{_shown(given_as, repr(url))} is not an http(s) URL of a host: the toolkit exports OTLP "
            "over HTTP",
            hint="pass a URL such as http://127.0.0.1:4318 (OTLP/gRPC on 4317 is not used)",
            value=url,
        )
    return url


def triton_args(plan: TracePlan, *, behind_api: bool) -> list[str]:
    """tritonserver's --trace-config flags (names from its docs/user_guide/trace.md, recorded in
    tests/data/upstream/triton_trace.json). Behind the API, rate 0: only requests that carry the
    API's context (exactly those it sampled) are traced; alone, 1 in round(1/ratio) of the rest too."""
    rate = 0 if behind_api else plan.triton_direct_rate
    return [
        "--trace-config=mode=opentelemetry",
        f"--trace-config=opentelemetry,url={plan.traces_url}",
        f"--trace-config=rate={rate}",
        "--trace-config=level=TIMESTAMPS",
        "--trace-config=count=-1",
        f"--trace-config=opentelemetry,resource=service.name={plan.service_name}",
        f"--trace-config=opentelemetry,bsp_schedule_delay={TRITON_EXPORT_DELAY_MS}",
    ]


def engine_environment(plan: TracePlan) -> dict[str, str]:
    """What tritonserver's environment gets so that its Python-backend engines emit their spans to the
    same place (the stubs inherit it)."""
    return {
        ENGINE_SWITCH: "1",
        OTEL_TRACES_ENDPOINT: plan.traces_url,
        OTEL_SERVICE_NAME: plan.service_name,
    }
