"""`toolkit deploy`: a built repository -> the Helm values and chart that run it on Kubernetes."""

from __future__ import annotations

from pathlib import Path

import click

from toolkit.cli.options import (
    dry_run_option,
    json_option,
    otlp_endpoint_option,
    output_option,
    repo_option,
    trace_rate_option,
)
from toolkit.cli.render import emit_json, emit_table, note
from toolkit.deploy import DeployRequest, plan_deployment, write_deployment
from toolkit.deploy.plan import ROUTING_MODES

# The options that leave a DeployRequest field unset (None) unless given: option -> (type, help); unset, the
# plan takes the cluster values', else works it out from the repository (or takes its default).
_PLANNED: dict[str, tuple[click.ParamType, str]] = {
    "replicas": (
        click.IntRange(min=1),
        "A fixed number of replicas, without autoscaling [default: the cluster values', else 1].",
    ),
    "min-replicas": (
        click.IntRange(min=1),
        "Autoscaling floor, and the count it starts from [default: the cluster values', else 1]; needs "
        "--max-replicas (or autoscaling in the cluster values).",
    ),
    "max-replicas": (
        click.IntRange(min=1),
        "Turn on KEDA autoscaling on the API's requests in flight, requests waiting for the engine and "
        "KV-cache use, up to this many replicas (instead of --replicas).",
    ),
    "name": (
        click.STRING,
        "Release name [default: <model>-<target>].",
    ),
    "image": (
        click.STRING,
        "Toolkit image REGISTRY/REPO[:TAG] built from deploy/image/ [tag default: <version>-<Triton container "
        "tag> (GPU) or <version>-cpu].",
    ),
    "mount-path": (
        click.STRING,
        "Where the replicas (and the build Job) mount the model volume, an absolute path [default: the "
        "cluster values' storage.mountPath, else /models].",
    ),
    "api-key-secret": (
        click.STRING,
        "Secret holding the API's bearer keys file (key `keys`), in the release's namespace "
        "[default: <name>-api-keys].",
    ),
    "hf-token-secret": (
        click.STRING,
        "Secret whose key `token` the build Job reads as HF_TOKEN (gated models).",
    ),
    "routing": (
        click.Choice(list(ROUTING_MODES)),
        "inference-pool (Gateway API Inference Extension), service, or auto: the pool where its CRDs are "
        "installed [default: the cluster values', else auto].",
    ),
    "concurrency-per-replica": (
        click.FloatRange(min=0, min_open=True),
        "Autoscaling target: the API's requests in flight per replica (running, or queued for a batch "
        "slot); the concurrency at which one replica meets your latency targets, from toolkit bench [default: "
        "0.8 x the engine's max_batch_size].",
    ),
    "waiting-per-replica": (
        click.FloatRange(min=0, min_open=True),
        "Autoscaling saturation trigger: requests waiting for the engine per replica (the API's in flight "
        "less the engine's scheduled: queued for a batch slot, or short of KV blocks) [4].",
    ),
    "kv-cache-fraction": (
        click.FloatRange(min=0, max=1, min_open=True),
        "Autoscaling target: KV-cache use per replica [0.8].",
    ),
    "drain-timeout": (
        click.IntRange(min=1),
        "Seconds a stopping replica lets in-flight requests finish, at most 86400 [from the longest "
        "request the limits allow: its wait for a batch slot, then its stream].",
    ),
    "startup-timeout": (
        click.IntRange(min=10),
        "Seconds a replica may take to load [from the weights' size at 200 MB/s, its files hashed at "
        "1 GB/s, plus start-up].",
    ),
}


def _planned_options(*names: str):
    def decorate(function):
        for name in reversed(names):
            kind, text = _PLANNED[name]
            function = click.option(f"--{name}", type=kind, default=None, help=text)(function)
        return function

    return decorate


@click.command("deploy")
@repo_option(
    "Repository written by toolkit build (GPU: with its engine).", default=Path("model_repository")
)
@_planned_options("replicas", "min-replicas", "max-replicas")
@output_option(
    Path("deployment"),
    "Folder to write values.yaml, chart/ and image/ into (only an empty one or one toolkit deploy wrote).",
)
@click.option(
    "-f",
    "--values",
    "values_files",
    multiple=True,
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="Cluster values (YAML, chart keys: image, storage, gpu.targets, autoscaling.prometheus, ...); "
    "repeatable, later files win.",
)
@_planned_options("name", "image", "mount-path")
@click.option(
    "--no-build",
    "no_build",
    is_flag=True,
    help="No build Job: the repository (and its engine) are already on the volume under --mount-path, "
    "at the paths --repo names.",
)
@_planned_options("api-key-secret")
@click.option(
    "--no-auth",
    is_flag=True,
    help="Serve the API without keys (anyone who reaches it can generate).",
)
@_planned_options(
    "hf-token-secret",
    "routing",
    "concurrency-per-replica",
    "waiting-per-replica",
    "kv-cache-fraction",
    "drain-timeout",
    "startup-timeout",
)
@click.option(
    "--route-hostname",
    "route_hostnames",
    multiple=True,
    help="The gateway route matches requests for this hostname only (repeatable): two releases on one "
    "Gateway need a hostname or a --route-header of their own.",
)
@click.option(
    "--route-header",
    "route_headers",
    multiple=True,
    metavar="NAME=VALUE",
    help="The gateway route matches requests carrying this header only (repeatable).",
)
@click.option(
    "--gke",
    is_flag=True,
    help="GKE's gateway: a HealthCheckPolicy on the API's /health and a GCPBackendPolicy with the "
    "longest request as its backend timeout (GKE's own default cuts streams at 30 s).",
)
@otlp_endpoint_option(
    "Traces: the OTLP/HTTP endpoint (base URL) the API, Triton and the engines export to."
)
@trace_rate_option("Traces: the fraction of requests traced [0.01].")
@dry_run_option("Print the values; write nothing.")
@json_option
def command(output, no_build, no_auth, dry_run, as_json, **fields):
    """Render the Kubernetes deployment of a built repository: Triton + the OpenAI API per replica,
    a build Job, inference-aware routing, KEDA autoscaling (see docs/deploy.md)."""
    # Every other option is the DeployRequest field of its name (repeatable ones arrive as tuples).
    request = DeployRequest(output=output, build=not no_build, auth=not no_auth, **fields)
    plan = plan_deployment(request)
    if dry_run:
        data = {"dry_run": True, **plan.to_dict(), "commands": plan.commands(output.resolve())}
        return emit_json(data) if as_json else _print(data)
    result = write_deployment(plan, output)
    data = {**plan.to_dict(), "output": str(result.path), "commands": result.commands}
    if as_json:
        return emit_json(data)
    _print(data)


def _print(data: dict) -> None:
    values = data["values"]
    scaling = values["autoscaling"]
    rows = [
        ("release", data["name"]),
        ("repository", f"{data['repository']} ({data['target']})"),
        ("fingerprint", data["fingerprint"]),
        ("image", f"{values['image']['repository']}:{values['image']['tag']}"),
        (
            "GPUs per replica",
            f"{values['gpu']['count']} {' '.join(values['gpu']['products'])}".strip(),
        ),
        (
            "replicas",
            f"{scaling['minReplicas']}..{scaling['maxReplicas']} (KEDA)"
            if scaling.get("enabled")
            else str(values["replicas"]),
        ),
        (
            "startup / drain",
            f"{values['startup']['timeoutSeconds']}s / {values['drain']['timeoutSeconds']}s",
        ),
        ("build Job", "yes" if values["build"]["enabled"] else "no (--no-build)"),
        ("routing", values["routing"]["mode"]),
    ]
    if "output" in data:
        rows.append(("written to", data["output"]))
    emit_table("deployment" + (" (dry run)" if data.get("dry_run") else ""), rows)
    for line in data["notes"]:
        note(f"[yellow]note:[/] {line}")
    click.echo("next:", err=True)
    for line in data["commands"]:
        click.echo(f"  $ {line}", err=True)  # unwrapped, to copy and paste
