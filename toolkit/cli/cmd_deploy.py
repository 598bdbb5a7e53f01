"""`toolkit deploy`: a built repository -> the Helm values and chart that run it on Kubernetes."""

from __future__ import annotations

from pathlib import Path

import click

from toolkit.cli.options import json_option, repo_option
from toolkit.cli.render import emit_json, emit_table, note
from toolkit.deploy import DeployRequest, plan_deployment, write_deployment
from toolkit.deploy.plan import ROUTING_MODES


@click.command("deploy")
@repo_option(
    "Repository written by toolkit build (GPU: with its engine).", default=Path("model_repository")
)
@click.option(
    "--replicas",
    type=click.IntRange(min=1),
    default=None,
    help="A fixed number of replicas, without autoscaling [default: the cluster values', else 1].",
)
@click.option(
    "--min-replicas",
    type=click.IntRange(min=1),
    default=None,
    help="Autoscaling floor, and the count it starts from [default: the cluster values', else 1]; needs "
    "--max-replicas (or autoscaling in the cluster values).",
)
@click.option(
    "--max-replicas",
    type=click.IntRange(min=1),
    default=None,
    help="Turn on KEDA autoscaling on the API's requests in flight, requests waiting for the engine and "
    "KV-cache use, up to this many replicas (instead of --replicas).",
)
@click.option(
    "-o",
    "--output",
    type=click.Path(path_type=Path),
    default=Path("deployment"),
    help="Folder to write values.yaml, chart/ and image/ into (only an empty one or one toolkit deploy wrote).",
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
@click.option("--name", default=None, help="Release name [default: <model>-<target>].")
@click.option(
    "--image",
    default=None,
    help="Toolkit image REGISTRY/REPO[:TAG] built from deploy/image/ [tag default: <version>-<Triton container "
    "tag> (GPU) or <version>-cpu].",
)
@click.option(
    "--mount-path",
    default=None,
    help="Where the replicas (and the build Job) mount the model volume, an absolute path [default: the "
    "cluster values' storage.mountPath, else /models].",
)
@click.option(
    "--no-build",
    "no_build",
    is_flag=True,
    help="No build Job: the repository (and its engine) are already on the volume under --mount-path, "
    "at the paths --repo names.",
)
@click.option(
    "--api-key-secret",
    default=None,
    help="Secret holding the API's bearer keys file (key `keys`), in the release's namespace "
    "[default: <name>-api-keys].",
)
@click.option(
    "--no-auth",
    is_flag=True,
    help="Serve the API without keys (anyone who reaches it can generate).",
)
@click.option(
    "--hf-token-secret",
    default=None,
    help="Secret whose key `token` the build Job reads as HF_TOKEN (gated models).",
)
@click.option(
    "--routing",
    type=click.Choice(list(ROUTING_MODES)),
    default=None,
    help="inference-pool (Gateway API Inference Extension), service, or auto: the pool where its CRDs are "
    "installed [default: the cluster values', else auto].",
)
@click.option(
    "--concurrency-per-replica",
    type=click.FloatRange(min=0, min_open=True),
    default=None,
    help="Autoscaling target: the API's requests in flight per replica (running, or queued for a batch "
    "slot); the concurrency at which one replica meets your latency targets, from toolkit bench [default: "
    "0.8 x the engine's max_batch_size].",
)
@click.option(
    "--waiting-per-replica",
    type=click.FloatRange(min=0, min_open=True),
    default=None,
    help="Autoscaling saturation trigger: requests waiting for the engine per replica (the API's in flight "
    "less the engine's scheduled: queued for a batch slot, or short of KV blocks) [4].",
)
@click.option(
    "--kv-cache-fraction",
    type=click.FloatRange(min=0, max=1, min_open=True),
    default=None,
    help="Autoscaling target: KV-cache use per replica [0.8].",
)
@click.option(
    "--drain-timeout",
    type=click.IntRange(min=1),
    default=None,
    help="Seconds a stopping replica lets in-flight requests finish, at most 86400 [from the longest "
    "request the limits allow: its wait for a batch slot, then its stream].",
)
@click.option(
    "--startup-timeout",
    type=click.IntRange(min=10),
    default=None,
    help="Seconds a replica may take to load [from the weights' size at 200 MB/s, its files hashed at "
    "1 GB/s, plus start-up].",
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
@click.option(
    "--otlp-endpoint",
    default=None,
    metavar="URL",
    help="Traces: the OTLP/HTTP endpoint (base URL) the API, Triton and the engines export to.",
)
@click.option(
    "--trace-rate",
    type=click.FloatRange(0, 1),
    default=None,
    help="Traces: the fraction of requests traced [0.01].",
)
@click.option("--dry-run", is_flag=True, help="Print the values; write nothing.")
@json_option
def command(
    repo,
    replicas,
    min_replicas,
    max_replicas,
    output,
    values_files,
    name,
    image,
    mount_path,
    no_build,
    api_key_secret,
    no_auth,
    hf_token_secret,
    routing,
    concurrency_per_replica,
    waiting_per_replica,
    kv_cache_fraction,
    drain_timeout,
    startup_timeout,
    route_hostnames,
    route_headers,
    gke,
    otlp_endpoint,
    trace_rate,
    dry_run,
    as_json,
):
    """Render the Kubernetes deployment of a built repository: Triton + the OpenAI API per replica,
    a build Job, inference-aware routing, KEDA autoscaling (see docs/deploy.md)."""
    request = DeployRequest(
        repo=repo,
        output=output,
        replicas=replicas,
        min_replicas=min_replicas,
        max_replicas=max_replicas,
        name=name,
        image=image,
        values_files=tuple(values_files),
        mount_path=mount_path,
        build=not no_build,
        auth=not no_auth,
        api_key_secret=api_key_secret,
        hf_token_secret=hf_token_secret,
        routing=routing,
        concurrency_per_replica=concurrency_per_replica,
        waiting_per_replica=waiting_per_replica,
        kv_cache_fraction=kv_cache_fraction,
        drain_timeout=drain_timeout,
        startup_timeout=startup_timeout,
        route_hostnames=tuple(route_hostnames),
        route_headers=tuple(route_headers),
        gke=gke,
        otlp_endpoint=otlp_endpoint,
        trace_rate=trace_rate,
    )
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
