"""The fleet's front: how many API workers a replica needs, how the endpoint picker scores it, and
the route and tracing values the flags set.

    api_values(repository, stages, transport)  -> the api workers and their CPU, from the plan's estimate
    picker_values(repository)       -> the picker's prefix weight, from whether the engine reuses KV
    front_flag_values(request)      -> routing.httpRoute hostnames/headers, routing.gke, tracing
"""

from __future__ import annotations

import re
import shlex

from toolkit.deploy import sizing
from toolkit.errors import DeployError
from toolkit.repository.reader import Repository
from toolkit.targets import target_for
from toolkit.trace.config import base_endpoint

# The picker's default weight for prefix affinity (its own default profile, v1.5.0 defaults.go).
PREFIX_WEIGHT = 3
HEADER_NAME = re.compile(r"^[A-Za-z0-9!#$%&'*+\-.^_`|~]+$")  # an HTTP token (RFC 9110)
HOSTNAME = re.compile(r"^(\*\.)?[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


def api_values(repository: Repository, stages: int, transport: str) -> tuple[dict, str]:
    """api.workers and api.resources for the tokens/s one replica streams at full batch, read from the
    engine over `transport` (api.engineTransport), and a note saying where the number came from."""
    slots = sizing.batch_slots(repository, stages)
    rate = target_for(repository).replica_tokens_per_s(repository, slots)
    workers = sizing.api_workers(rate, transport)
    source = (
        "no bound on a replica's tokens/s (the synthetic engine at step 0)"
        if rate is None
        else f"~{rate:,.0f} output tokens/s per replica at {slots} streams"
    )
    note = (
        f"the OpenAI API: {workers} worker process(es), {workers} CPU, for {source} at "
        f"{sizing.API_US_PER_TOKEN[transport]:g} us of API CPU per token over {transport} "
        f"(x{sizing.API_CPU_HEADROOM:g}); "
        "override with --set api.workers=N,api.resources.requests.cpu=N"
    )
    return {"workers": workers, "resources": sizing.api_resources(workers)}, note


def picker_values(repository: Repository) -> dict:
    """Prefix affinity only where the engine reuses prompt prefixes' KV blocks: elsewhere it would only
    pile requests onto one replica (the chart leaves the prefix scorer out at weight 0)."""
    reuses = target_for(repository).reuses_kv_cache(repository)
    return {"weights": {"prefixCache": PREFIX_WEIGHT if reuses else 0}}


def front_flag_values(
    hostnames: tuple[str, ...],
    headers: tuple[str, ...],
    gke: bool,
    otlp_endpoint: str | None,
    trace_rate: float | None,
) -> dict:
    """The values --route-hostname, --route-header, --gke, --otlp-endpoint and --trace-rate set."""
    values: dict = {}
    route: dict = {}
    if hostnames:
        route["hostnames"] = [_hostname(h) for h in hostnames]
    if headers:
        route["headers"] = [_header(h) for h in headers]
    if route:
        values["routing"] = {"httpRoute": route}
    if gke:
        values.setdefault("routing", {})["gke"] = {"enabled": True}
    tracing: dict = {}
    if otlp_endpoint:
        if not otlp_endpoint.startswith(("http://", "https://")):
            raise DeployError(
                f"--otlp-endpoint {shlex.quote(otlp_endpoint)} is not an http(s) URL",
                hint="pass the OTLP/HTTP base URL, e.g. --otlp-endpoint http://otel-collector.monitoring:4318",
            )
        tracing["otlpEndpoint"] = base_endpoint(otlp_endpoint, "--otlp-endpoint")
    if trace_rate is not None:
        tracing["rate"] = trace_rate
    if tracing:
        values["tracing"] = tracing
    return values


def _hostname(text: str) -> str:
    name = text.strip().lower()
    if not HOSTNAME.match(name) or len(name) > 253:
        raise DeployError(
            f"--route-hostname {shlex.quote(text)} is not a hostname the Gateway API takes",
            hint="pass a DNS name such as llama.example.com (or *.example.com)",
        )
    return name


def _header(text: str) -> dict:
    name, sep, value = text.partition("=")
    if not sep or not HEADER_NAME.match(name.strip()) or not value:
        raise DeployError(
            f"--route-header {shlex.quote(text)} is not NAME=VALUE",
            hint="pass a header clients send, e.g. --route-header x-model=llama-8b",
        )
    return {"name": name.strip(), "value": value}
