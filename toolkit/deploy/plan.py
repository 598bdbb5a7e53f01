"""`toolkit deploy` as a library call: a built repository -> the chart values that deploy it.

    plan_deployment(request) -> DeploymentPlan      checks the repository and the cluster values,
                                                     derives every value it can from the manifest
    write_deployment(plan) -> DeploymentResult      (toolkit.deploy.writer) values + chart copy

Order of precedence, lowest first: the chart's defaults, what the manifest says, the cluster
values files (-f), the flags. Facts of the repository (`model.*`, the GPU count) cannot be
overridden: a repository that cannot run where asked is refused with the value and the fix.
"""

from __future__ import annotations

import math
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from toolkit import __version__
from toolkit.deploy import fleet, sizing
from toolkit.deploy.fingerprint import fingerprint
from toolkit.deploy.reproduce import build_arguments
from toolkit.deploy.text import check_image_reference, check_strings
from toolkit.deploy.values import (
    chart_defaults,
    check_cluster_values,
    gpu_products_for,
    load_values_file,
    lookup,
    merge,
    schema_problems,
)
from toolkit.engine.info import EngineInfo
from toolkit.engine.layout import rank_engine_files
from toolkit.errors import DeployError, ToolkitError
from toolkit.repository.reader import Repository
from toolkit.serve.launcher import check_repository
from toolkit.targets import target_for
from toolkit.trtllm import PINNED_TRTLLM_VERSION, TRITON_TRTLLM_CONTAINER, container_for

GPU_TOLERATION = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
ROUTING_MODES = {"auto": "auto", "inference-pool": "inferencePool", "service": "service"}
DEFAULT_MOUNT_PATH = "/models"
# Requests waiting for the engine (queued for a batch slot, or not scheduled for lack of KV blocks)
# per replica: a saturation trigger.
WAITING_PER_REPLICA = 4
KV_CACHE_FRACTION = 0.8  # KV-cache use per replica (the endpoint picker's own saturation mark)
HTTP_ROUTE_MIN_S = 300
NAME = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?")  # matched whole (fullmatch)
NAME_MAX = 40  # the chart's names add up to 13 characters to it, within Kubernetes' 53 for releases
# A Secret's name: a DNS-1123 subdomain (the API server refuses a pod that names another).
SECRET_NAME = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
SECRET_NAME_MAX = 253
# A stopping replica holds its GPUs for the drain: longer than a day is a typo.
DRAIN_MAX_S = 86400
# The Gateway API's Duration (GEP-2257), as the chart's schema and the HTTPRoute CRD check it.
GATEWAY_DURATION = re.compile(r"([0-9]{1,5}(h|m|s|ms)){1,4}")
NAMESPACE = "NAMESPACE"  # the placeholder the printed commands use


@dataclass(frozen=True)
class DeployRequest:
    """What `toolkit deploy` was asked; None: from the repository, the cluster values, or a default."""

    repo: Path
    output: Path = Path("deployment")
    replicas: int | None = None  # default: the cluster values', else 1
    min_replicas: int | None = None
    max_replicas: int | None = None
    name: str | None = None
    image: str | None = None  # REGISTRY/REPO[:TAG] of the toolkit image
    values_files: tuple[Path, ...] = ()
    mount_path: str | None = None  # default: the cluster values' storage.mountPath, else /models
    build: bool = True
    auth: bool = True  # False: --no-auth
    api_key_secret: str | None = None  # default: <name>-api-keys
    hf_token_secret: str | None = None
    # auto | inference-pool | service; default: the cluster values', else auto
    routing: str | None = None
    concurrency_per_replica: float | None = None  # default: 0.8 x the engine's max_batch_size
    waiting_per_replica: float | None = None
    kv_cache_fraction: float | None = None
    drain_timeout: int | None = None
    startup_timeout: int | None = None
    route_hostnames: tuple[str, ...] = ()  # routing.httpRoute.hostnames: this release's own
    route_headers: tuple[str, ...] = ()  # NAME=VALUE: routing.httpRoute.headers
    gke: bool = False  # GKE's gateway: its health check and backend timeout policies
    otlp_endpoint: str | None = None  # tracing.otlpEndpoint
    trace_rate: float | None = None  # tracing.rate


@dataclass(frozen=True)
class DeploymentPlan:
    request: DeployRequest
    repository: Repository
    name: str
    fingerprint: str
    # What goes into values.yaml: the manifest's values, then the cluster files', then the flags'.
    values: dict
    base_image: str | None  # NVIDIA's Triton container the toolkit image must be built on (GPU)
    notes: list[str] = field(default_factory=list)

    @property
    def target(self) -> str:
        return self.repository.target

    def commands(self, output: Path) -> list[str]:
        """What to run next, in order: the image, the Secrets (in the release's namespace), the release."""
        image = self.values["image"]
        dockerfile = "Dockerfile.gpu" if self.base_image else "Dockerfile.cpu"
        build_args = (
            f" --build-arg BASE_IMAGE={self.base_image} --build-arg TRTLLM_TAG=v{self.values['model']['trtllmVersion']}"
            if self.base_image
            else ""
        )
        commands = [
            "pip wheel --no-deps -w dist .   # in a checkout of the toolkit",
            f"docker build -f {output}/image/{dockerfile}{build_args} -t {image['repository']}:{image['tag']} . "
            f"&& docker push {image['repository']}:{image['tag']}",
        ]
        values = merge(chart_defaults(), self.values)  # what helm renders from
        secret = f"kubectl -n {NAMESPACE} create secret generic"
        auth = values["api"]["auth"]
        if auth["enabled"]:
            commands.append(
                f"{secret} {auth['existingSecret']} --from-file={auth['key']}=./api-keys.txt"
            )
        build = values["build"]
        if build["enabled"] and build["hfToken"]["secretName"]:
            token = build["hfToken"]
            commands.append(
                f'{secret} {token["secretName"]} --from-literal={token["key"]}="$HF_TOKEN"'
            )
        install = f"helm upgrade --install {self.name} {output}/chart -f {output}/values.yaml --namespace {NAMESPACE}"
        if build["enabled"]:
            # helm waits for the build hook up to --timeout (5 minutes by default).
            install += f" --timeout {sizing.helm_timeout_seconds(build['activeDeadlineSeconds'])}s"
        commands.append(install)
        return commands

    def to_dict(self) -> dict:
        return {
            "name": self.name,
            "repository": str(self.repository.path),
            "target": self.target,
            "fingerprint": self.fingerprint,
            "build_key": self.repository.manifest.build_key,
            "base_image": self.base_image,
            "values": self.values,
            "notes": list(self.notes),
        }


def plan_deployment(request: DeployRequest) -> DeploymentPlan:
    _check_request(request)
    repository = _checked_repository(request.repo)
    info = _checked_engine(repository)
    gpu = info is not None
    files: list[tuple[str, dict]] = []
    for path in request.values_files:
        data = load_values_file(path)
        check_cluster_values(data, repository.target, gpu, str(path))
        files.append((str(path), data))
    cluster: dict = {}
    for _, data in files:
        cluster = merge(cluster, data)
    name = _release_name(request, repository)
    shm_bytes = _shm_bytes(cluster, files)
    transport = _engine_transport(cluster, files)
    derived = _derived_values(request, repository, info, cluster, shm_bytes, transport)
    flags = _flag_values(request)
    # What follows from the load and drain times, from the ones that hold after the cluster values
    # and flags (and the chart's defaults under them all, as helm merges them).
    timing = merge(merge(merge(chart_defaults(), derived), cluster), flags)
    values = merge(merge(merge(derived, _timing_values(timing, repository)), cluster), flags)
    _fit_api_resources(values, files)
    _check_values(values, request, repository, info, name, files)
    return DeploymentPlan(
        request=request,
        repository=repository,
        name=name,
        fingerprint=values["model"]["fingerprint"],
        values=values,
        base_image=values["model"]["tritonImage"] or None,
        notes=_notes(values, repository, request, files, transport),
    )


# --- the repository -----------------------------------------------------------------------------
def _checked_repository(path: Path) -> Repository:
    """The repository as built, by this toolkit: the pods run this toolkit's image, and the build
    Job rebuilds with it (another release's repository would only fail there, after the build)."""
    return check_repository(Path(path).resolve(), same_toolkit=True, modified_fix=None)


def _checked_engine(repository: Repository) -> EngineInfo | None:
    """A compiled engine's facts (None for the Python engines); DeployError when its files are missing or
    not the ones the manifest names."""
    target = target_for(repository)
    try:
        info = target.compiled_engine(repository)
    except ToolkitError as exc:
        raise DeployError(
            f"the {repository.target} engine of {repository.path} is missing or incomplete: {exc.message}",
            hint=f"rebuild it: {repository.rebuild_command}",
        ) from exc
    if info is None:
        return None
    section = repository.manifest.engine
    if info.world_size != section.world_size or info.trtllm_version != section.trtllm_version:
        raise DeployError(
            f"{info.engine_dir} holds a TensorRT-LLM {info.trtllm_version} engine with {info.world_size} "
            f"ranks; the manifest of {repository.path} names {section.trtllm_version} with {section.world_size}",
            hint=f"rebuild it: {repository.rebuild_command}",
        )
    if container_for(info.trtllm_version) is None:
        raise DeployError(
            f"the engine of {repository.path} was built by TensorRT-LLM {info.trtllm_version}, which no Triton "
            "container the toolkit knows carries; an engine loads only in the release that built it",
            hint=f"rebuild it with TensorRT-LLM {PINNED_TRTLLM_VERSION} ({TRITON_TRTLLM_CONTAINER}): "
            f"{repository.rebuild_command}",
        )
    return info


def _container(info: EngineInfo) -> str:
    """The Triton TRT-LLM container of a checked engine (_checked_engine refuses one that has none)."""
    container = container_for(info.trtllm_version)
    if container is None:
        raise DeployError(
            f"no Triton container carries TensorRT-LLM {info.trtllm_version}",
            hint=f"rebuild with TensorRT-LLM {PINNED_TRTLLM_VERSION}",
        )
    return container


def engine_files(info: EngineInfo) -> list[Path]:
    return rank_engine_files(Path(info.engine_dir), info.world_size)


# --- values -------------------------------------------------------------------------------------
def _release_name(request: DeployRequest, repository: Repository) -> str:
    if request.name is not None:
        name = request.name
    else:
        slug = re.sub(r"[^a-z0-9]+", "-", repository.served_model_name.lower()).strip("-")
        name = f"{slug}-{repository.target}"[:NAME_MAX].strip("-")
        name = name if name[:1].isalpha() else f"m-{name}"[:NAME_MAX]
    if not NAME.fullmatch(name) or len(name) > NAME_MAX:
        raise DeployError(
            f"--name {name!r} is not a release name: lowercase letters, digits and '-', starting with a "
            f"letter, at most {NAME_MAX} characters",
            hint="pass --name with such a name",
        )
    return name


def _shm_bytes(cluster: dict, files: list[tuple[str, dict]]) -> int:
    """Bytes of the triton container's (and the build Job's) /dev/shm: triton.shmSize as helm will
    render it, the cluster files' over the chart's default."""
    size = lookup(merge(chart_defaults(), cluster), "triton.shmSize")
    found = sizing.quantity_bytes(size)
    if found is None:
        raise DeployError(
            f"{_given('triton.shmSize', None, None, files, size)} is not a Kubernetes quantity of memory",
            hint="write it as e.g. 16Gi (binary suffixes Ki, Mi, Gi, Ti) or 16G (decimal)",
        )
    return found


def _fit_api_resources(values: dict, files: list[tuple[str, dict]]) -> None:
    """A cluster file that sets api.workers but not the API's resources gets them for its workers (a
    core each, memory per process), not for the count toolkit deploy derived."""
    workers = lookup(values, "api.workers")
    set_workers = any(lookup(data, "api.workers") is not None for _, data in files)
    set_resources = any(lookup(data, "api.resources") is not None for _, data in files)
    if set_workers and not set_resources and isinstance(workers, int) and workers >= 1:
        values["api"]["resources"] = sizing.api_resources(workers)


def _engine_transport(cluster: dict, files: list[tuple[str, dict]]) -> str:
    """How the API reads the engine (api.engineTransport, the cluster files' over the chart's default):
    its CPU per token, and so the workers it needs, depend on it."""
    transport = lookup(merge(chart_defaults(), cluster), "api.engineTransport")
    if transport not in sizing.API_US_PER_TOKEN:
        raise DeployError(
            f"{_given('api.engineTransport', None, None, files, transport)} is not an engine transport",
            hint=f"set api.engineTransport to one of {', '.join(sorted(sizing.API_US_PER_TOKEN))} "
            "(http: Triton's generate_stream, the default)",
        )
    return transport


def _derived_values(
    request: DeployRequest,
    repository: Repository,
    info: EngineInfo | None,
    cluster: dict,
    shm_bytes: int,
    transport: str,
) -> dict:
    """Every value the manifest (and the engine files) decide; `shm_bytes` goes into the memory."""
    manifest = repository.manifest
    gpu = info is not None
    world_size = info.world_size if info else 1
    stages = info.pp_size if info else 1  # pipeline stages: one micro-batch in flight per stage
    load_bytes = sizing.weight_bytes(repository, engine_files(info) if info else None)
    startup_s = sizing.startup_seconds(repository, load_bytes, sizing.repository_bytes(repository))
    drain_s = sizing.drain_seconds(repository)
    limits = repository.limits
    api, _ = fleet.api_values(repository, stages, transport)
    values: dict[str, Any] = {
        "replicas": 1,
        "storage": {"mountPath": DEFAULT_MOUNT_PATH},
        "model": {
            "name": repository.served_model_name,
            "target": manifest.target,
            "source": manifest.model.source,
            "fingerprint": fingerprint(manifest),
            "worldSize": world_size,
            "pipelineStages": stages,
            "trtllmVersion": info.trtllm_version if info else "",
            "tritonImage": _container(info) if info else "",
        },
        "startup": {"timeoutSeconds": startup_s},
        "drain": {"timeoutSeconds": drain_s},
        "triton": {
            "resources": sizing.triton_resources(repository, load_bytes, world_size, shm_bytes)
        },
        "api": {"maxInFlight": sizing.max_in_flight(repository, stages), **api},
        "routing": {
            "mode": "auto",
            "epp": {
                **fleet.picker_values(repository),
                "prefixCache": {
                    "blockSizeTokens": limits.kv_block_size,
                    "lruCapacityPerServer": limits.kv_cache_blocks,
                },
            },
        },
        "autoscaling": {
            # Scale before requests queue: most of the engine's batch slots, until `toolkit bench`
            # measures the concurrency one replica serves within its latency targets (docs/deploy.md).
            "concurrencyPerReplica": sizing.concurrency_per_replica(repository, stages),
            "waitingPerReplica": WAITING_PER_REPLICA,
            "kvCacheFraction": KV_CACHE_FRACTION,
        },
        "gpu": {"count": world_size if gpu else 0, "products": []},
    }
    if gpu:
        where = ", ".join(str(p) for p in request.values_files) or "no -f files"
        values["gpu"]["products"] = gpu_products_for(manifest.target, cluster, where)
        values["tolerations"] = [GPU_TOLERATION]
    if request.build:
        values["build"] = {
            "enabled": True,
            "args": build_arguments(repository),
            "resources": sizing.build_resources(repository, world_size, shm_bytes),
            "gpuCount": sizing.build_gpu_count(repository, world_size) if gpu else 0,
        }
    else:
        values["build"] = {"enabled": False, "args": []}
        values["model"]["repositoryPath"] = str(repository.path)
    return values


def _timing_values(values: dict, repository: Repository) -> dict:
    """The grace period, the rollout's deadline, the route timeout and the autoscaler's behaviour,
    from the load and drain times in `values` (the chart's defaults under everything else)."""
    startup_s = values["startup"]["timeoutSeconds"]
    drain_s = values["drain"]["timeoutSeconds"]
    grace_s = sizing.grace_seconds(drain_s, lookup(values, "drain.preStopSeconds"))
    route_s = _route_seconds(drain_s, repository)
    return {
        "drain": {"terminationGracePeriodSeconds": grace_s},
        "strategy": {"progressDeadlineSeconds": sizing.progress_deadline_seconds(startup_s)},
        "routing": {
            "httpRoute": {"requestTimeout": sizing.gateway_duration(route_s)},
            # GKE's load balancer cuts a backend's response at this (its default: 30 s)
            "gke": {"backendTimeoutSec": route_s},
        },
        "autoscaling": sizing.scaling_behavior(startup_s, grace_s),
    }


def _route_seconds(drain_s: int, repository: Repository) -> int:
    """The route's timeout: a request may wait for a batch slot before its first token, then stream,
    and the gateway must let it (and a drain no shorter than that)."""
    return max(HTTP_ROUTE_MIN_S, drain_s, sizing.request_seconds(repository))


def _timeout_notes(
    values: dict, repository: Repository, files: list[tuple[str, dict]]
) -> list[str]:
    """Timeouts a cluster file set shorter than the longest request: the gateway (or GKE's load
    balancer) would cut such streams. Said, not refused: a shorter cap may be meant."""
    longest = _route_seconds(values["drain"]["timeoutSeconds"], repository)
    route = lookup(values, "routing.httpRoute.requestTimeout")
    backend = lookup(values, "routing.gke.backendTimeoutSec")
    notes = []
    if isinstance(route, str) and sizing.gateway_seconds(route) < longest:
        notes.append(
            f"{_given('routing.httpRoute.requestTimeout', None, None, files, route)} is shorter than "
            f"this repository's longest request (~{longest} s: a wait for a batch slot, then "
            f"max_output_len tokens): the gateway cuts such streams (toolkit deploy's: "
            f"{sizing.gateway_duration(longest)})"
        )
    gke = lookup(values, "routing.gke.enabled")
    if gke and isinstance(backend, (int, float)) and backend < longest:
        notes.append(
            f"{_given('routing.gke.backendTimeoutSec', None, None, files, backend)} is shorter than "
            f"the longest request (~{longest} s): GKE's load balancer cuts a response at it "
            f"(toolkit deploy's: {longest})"
        )
    return notes


def _flag_values(request: DeployRequest) -> dict:
    """Values the flags that were given set; they beat the cluster files."""
    values: dict = {}
    if request.replicas is not None:
        values["replicas"] = request.replicas
    if request.mount_path is not None:
        values["storage"] = {"mountPath": request.mount_path}
    if request.routing is not None:
        values["routing"] = {"mode": ROUTING_MODES[request.routing]}
    if request.image:
        repository, tag = _split_image(request.image)
        values["image"] = {"repository": repository, **({"tag": tag} if tag else {})}
    if not request.auth:
        values["api"] = {"auth": {"enabled": False}}
    elif request.api_key_secret:
        values["api"] = {"auth": {"existingSecret": request.api_key_secret}}
    if request.hf_token_secret:
        values["build"] = {"hfToken": {"secretName": request.hf_token_secret}}
    scaling: dict = {}
    if request.max_replicas is not None:
        scaling["enabled"] = True
        scaling["maxReplicas"] = request.max_replicas
    if request.min_replicas is not None:
        scaling["minReplicas"] = request.min_replicas
    if request.concurrency_per_replica is not None:
        scaling["concurrencyPerReplica"] = request.concurrency_per_replica
    if request.waiting_per_replica is not None:
        scaling["waitingPerReplica"] = request.waiting_per_replica
    if request.kv_cache_fraction is not None:
        scaling["kvCacheFraction"] = request.kv_cache_fraction
    if scaling:
        values["autoscaling"] = scaling
    if request.drain_timeout is not None:
        values["drain"] = {"timeoutSeconds": request.drain_timeout}
    if request.startup_timeout is not None:
        values["startup"] = {"timeoutSeconds": request.startup_timeout}
    front = fleet.front_flag_values(
        request.route_hostnames,
        request.route_headers,
        request.gke,
        request.otlp_endpoint,
        request.trace_rate,
    )
    return merge(values, front)


def _check_request(request: DeployRequest) -> None:
    """Flags the chart's schema or the API server would refuse after `helm upgrade`: refused here,
    naming the value and the fix."""
    if request.mount_path is not None and not _absolute(request.mount_path):
        raise DeployError(
            f"--mount-path {shlex.quote(request.mount_path)} is not an absolute path: the replicas and the "
            "build Job mount the model volume there, and the repository names its engine by absolute path",
            hint=f"pass an absolute path, e.g. --mount-path {DEFAULT_MOUNT_PATH}",
        )
    if request.drain_timeout is not None and request.drain_timeout > DRAIN_MAX_S:
        raise DeployError(
            f"--drain-timeout {request.drain_timeout} is more than a day ({DRAIN_MAX_S} s): a stopping "
            "replica holds its GPUs for the whole drain",
            hint=f"pass --drain-timeout {DRAIN_MAX_S} or less (toolkit bench measures your longest requests)",
        )
    for flag, name in (
        ("--api-key-secret", request.api_key_secret),
        ("--hf-token-secret", request.hf_token_secret),
    ):
        if name is not None:
            _check_secret_name(f"{flag} {shlex.quote(name)}", name, f"pass {flag} with such a name")


def _absolute(path: str) -> bool:
    return path.startswith("/") and len(path) > 1


def _check_secret_name(given: str, name: str, fix: str) -> None:
    if not SECRET_NAME.fullmatch(name) or len(name) > SECRET_NAME_MAX:
        raise DeployError(
            f"{given} is not a Secret name: lowercase letters, digits, '-' and '.', starting and "
            f"ending with a letter or digit, at most {SECRET_NAME_MAX} characters",
            hint=fix,
        )


def _split_image(image: str) -> tuple[str, str | None]:
    """REGISTRY[:PORT]/REPO[:TAG] -> (repository, tag or None); a digest is not a tag we can check."""
    if "@" in image:
        raise DeployError(
            f"--image {image} names a digest; toolkit deploy checks the tag against the engines' container",
            hint="pass --image REGISTRY/REPO or REGISTRY/REPO:TAG",
        )
    head, _, last = image.rpartition("/")
    repository, tag = image, None
    if ":" in last:
        repo, tag = last.split(":", 1)
        repository = f"{head}/{repo}" if head else repo
    check_image_reference(repository, tag, image)
    return repository, tag


# --- checks on the merged values ----------------------------------------------------------------
def _check_values(
    values: dict,
    request: DeployRequest,
    repository: Repository,
    info: EngineInfo | None,
    name: str,
    files: list[tuple[str, dict]],
) -> None:
    _check_replicas(request, values, files)
    _check_scaling_target(request, values, files)
    _fill_image(values, repository, info)
    if info is not None and int(lookup(values, "gpu.count", 0)) != info.world_size:
        raise DeployError(
            f"gpu.count={lookup(values, 'gpu.count')} in the cluster values, but the {repository.target} "
            f"engines have {info.world_size} ranks (tensor x pipeline parallel), one GPU each",
            hint=f"remove gpu.count from the cluster values (toolkit deploy sets it to {info.world_size})",
        )
    auth = values.setdefault("api", {}).setdefault("auth", {})
    if auth.get("enabled", True) and not auth.get("existingSecret"):
        auth["existingSecret"] = f"{name}-api-keys"
    _check_cluster_settings(values, request, files)
    check_strings(values, files)  # every string helm will paste into the objects
    _check_schema(values, files)
    if not request.build:
        _check_on_volume(repository, info, values["storage"]["mountPath"])


SCHEMA_PROBLEMS_SHOWN = 5


def _check_schema(values: dict, files: list[tuple[str, dict]]) -> None:
    """What the chart's values.schema.json refuses (an unknown key, a wrong type), said before anything
    is written: helm would refuse the install that toolkit deploy printed."""
    problems = schema_problems(merge(chart_defaults(), values))
    if not problems:
        return
    said = []
    for key, message in problems[:SCHEMA_PROBLEMS_SHOWN]:
        where = [path for path, data in files if lookup(data, key) is not None]
        said.append(f"{key or 'the values'}{f' in {where[-1]}' if where else ''} ({message})")
    more = len(problems) - len(said)
    raise DeployError(
        "the chart's values.schema.json refuses "
        + "; ".join(said)
        + (f"; and {more} more" if more else ""),
        hint="fix or remove each (deploy/values.yaml documents every key the chart takes)",
    )


def _check_cluster_settings(
    values: dict, request: DeployRequest, files: list[tuple[str, dict]]
) -> None:
    """Values of the cluster files (or flags) that the chart's schema or the API server would refuse."""
    mount = values["storage"]["mountPath"]
    if not isinstance(mount, str) or not _absolute(mount):
        given = _given("storage.mountPath", "--mount-path", request.mount_path, files, mount)
        raise DeployError(
            f"{given} is not an absolute path: the replicas and the build Job mount the model volume there",
            hint=f"set storage.mountPath to an absolute path there, or pass --mount-path {DEFAULT_MOUNT_PATH}",
        )
    route = lookup(values, "routing.httpRoute.requestTimeout")
    if not isinstance(route, str) or not GATEWAY_DURATION.fullmatch(route):
        given = _given("routing.httpRoute.requestTimeout", None, None, files, route)
        raise DeployError(
            f"{given} is not a Gateway API duration: up to four parts of at most 5 digits and h, m, "
            "s or ms",
            hint="write it as e.g. 1h30m or 600s, or leave it out (toolkit deploy sizes it)",
        )
    for key, flag, flag_value in (
        ("api.auth.existingSecret", "--api-key-secret", request.api_key_secret),
        ("build.hfToken.secretName", "--hf-token-secret", request.hf_token_secret),
    ):
        name = lookup(values, key)
        if name:
            given = _given(key, flag, flag_value, files, name)
            _check_secret_name(given, str(name), f"name the Secret in {key} with such a name")


def _given(key: str, flag: str | None, flag_value, files: list[tuple[str, dict]], value) -> str:
    """How a person wrote `value`: the flag, the cluster file that set `key` (the last one), or the default."""
    if flag_value is not None:
        return f"{flag} {shlex.quote(str(flag_value))}"
    where = [path for path, data in files if lookup(data, key) is not None]
    if where:
        return f"{key}={value} in {where[-1]}"
    return f"{key}={value} (the chart's default)"


def _check_replicas(request: DeployRequest, values: dict, files: list[tuple[str, dict]]) -> None:
    """A fixed count >= 1, or autoscaling between 1 <= min <= max; never both, no scale to zero."""
    scaling = values["autoscaling"]
    if not scaling.get("enabled"):
        if request.min_replicas is not None:
            raise DeployError(
                "--min-replicas needs --max-replicas (autoscaling runs between the two)",
                hint="add --max-replicas N, or drop --min-replicas for a fixed --replicas",
            )
        replicas = values["replicas"]
        if not isinstance(replicas, int) or replicas < 1:
            given = _given("replicas", "--replicas", request.replicas, files, replicas)
            raise DeployError(
                f"{given}: a deployment needs 1 replica or more", hint="pass --replicas 1 or more"
            )
        return
    if request.replicas is not None:
        on = _given("autoscaling.enabled", "--max-replicas", request.max_replicas, files, "true")
        off = "drop --max-replicas" if request.max_replicas is not None else f"turn off {on}"
        raise DeployError(
            f"--replicas {request.replicas} is a fixed count, but autoscaling is on ({on}): KEDA "
            "decides the count, between the autoscaling floor and ceiling",
            hint="drop --replicas and pass --min-replicas N for the floor (the count it starts from), "
            f"or {off} for a fixed count",
        )
    low = scaling.setdefault("minReplicas", lookup(chart_defaults(), "autoscaling.minReplicas"))
    high = scaling.get("maxReplicas")
    low_given = _given(
        "autoscaling.minReplicas", "--min-replicas", request.min_replicas, files, low
    )
    if high is None:
        on = _given("autoscaling.enabled", "--max-replicas", None, files, "true")
        raise DeployError(
            f"autoscaling is on ({on}) without a ceiling",
            hint="pass --max-replicas N, or set autoscaling.maxReplicas in that file",
        )
    high_given = _given(
        "autoscaling.maxReplicas", "--max-replicas", request.max_replicas, files, high
    )
    if not (isinstance(low, int) and isinstance(high, int) and 1 <= low <= high):
        raise DeployError(
            f"autoscaling needs 1 <= floor <= ceiling: {low_given}, {high_given}",
            hint="pass 1 <= --min-replicas <= --max-replicas (no scale to zero: a replica takes minutes "
            "to load)",
        )


def _check_scaling_target(
    request: DeployRequest, values: dict, files: list[tuple[str, dict]]
) -> None:
    """A replica's requests in flight never pass the API's cap (it answers 429 past it, and the picker
    sends a full replica nothing), and the HPA acts only HPA_TOLERANCE past its target: a target that
    close to the cap, or past it, never adds a replica, and the fleet answers 429s at its floor."""
    scaling = values["autoscaling"]
    target, cap = scaling.get("concurrencyPerReplica"), lookup(values, "api.maxInFlight")
    numbers = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in (target, cap))
    if not scaling.get("enabled") or not numbers or target * (1 + sizing.HPA_TOLERANCE) < cap:
        return
    target_given = _given(
        "autoscaling.concurrencyPerReplica", "--concurrency-per-replica",
        request.concurrency_per_replica, files, target,
    )  # fmt: skip
    cap_given = (
        _given("api.maxInFlight", None, None, files, cap)
        if any(lookup(data, "api.maxInFlight") is not None for _, data in files)
        else f"api.maxInFlight={cap} (the engine's batch slots and queue)"
    )
    highest = math.floor(cap / (1 + sizing.HPA_TOLERANCE))
    if highest * (1 + sizing.HPA_TOLERANCE) >= cap:
        highest -= 1
    raise DeployError(
        f"the autoscaler's target of requests in flight per replica ({target_given}) is beyond what "
        f"one replica ever holds: the API answers 429 past {cap_given}, and the HPA adds a replica only "
        f"{sizing.HPA_TOLERANCE:.0%} past its target, so the fleet would never grow",
        hint=(
            f"pass --concurrency-per-replica {highest} or less (toolkit bench measures what one "
            "replica serves within your latency targets), or raise api.maxInFlight"
            if highest >= 1
            else "raise api.maxInFlight (or leave it to toolkit deploy: the engine's batch slots and queue)"
        ),
    )


def _fill_image(values: dict, repository: Repository, info: EngineInfo | None) -> None:
    """The toolkit image: its repository from --image or the cluster values; its tag carries the base."""
    image = values.setdefault("image", {})
    if not image.get("repository"):
        raise DeployError(
            "no toolkit image: neither --image nor the cluster values (image.repository) name one",
            hint="build it from deploy/image/ and pass --image REGISTRY/toolkit",
        )
    base_tag = _container(info).rsplit(":", 1)[1] if info else "cpu"
    image.setdefault("tag", f"{__version__}-{base_tag}")
    if info is not None and base_tag not in image["tag"]:
        raise DeployError(
            f"image tag {image['tag']!r} does not carry {base_tag}: the {repository.target} engines only load "
            f"in TensorRT-LLM {info.trtllm_version} ({container_for(info.trtllm_version)})",
            hint=f"build the image on that container and tag it {__version__}-{base_tag} "
            "(or drop the tag from --image)",
        )


def _check_on_volume(repository: Repository, info: EngineInfo | None, mount_path: str) -> None:
    """--no-build: the replicas see the volume at `mount_path`, so the repository (and the engine it
    names by absolute path) must already be there, at the paths the build wrote."""
    root = mount_path.rstrip("/") + "/"
    paths = [("repository", str(repository.path))]
    if info is not None:
        paths.append(("engine", str(Path(info.engine_dir).resolve())))
    for what, path in paths:
        if not path.startswith(root):
            raise DeployError(
                f"--no-build: the {what} {path} is not under --mount-path {mount_path}, where the replicas "
                "see the volume",
                hint=f"build on the volume (toolkit build --output {root}<name>/repository"
                + (f" --engine-dir {root}<name>/engines" if info else "")
                + "), or drop --no-build to let the cluster's build Job make it",
            )


def _notes(
    values: dict,
    repository: Repository,
    request: DeployRequest,
    files: list[tuple[str, dict]],
    transport: str,
) -> list[str]:
    notes = []
    if not values["api"]["auth"].get("enabled", True):
        notes.append("no API keys (--no-auth): anyone who reaches the API can generate")
    notes += target_for(repository).deploy_notes(repository, values["drain"]["timeoutSeconds"])
    notes += _timeout_notes(values, repository, files)
    if not any(lookup(data, "api.workers") is not None for _, data in files):
        stages = int(lookup(values, "model.pipelineStages", 1))
        notes.append(fleet.api_values(repository, stages, transport)[1])
    scaling = values["autoscaling"]
    if scaling.get("enabled"):
        set_in = [path for path, data in files if lookup(data, "replicas") is not None]
        if set_in:
            notes.append(
                f"replicas={values['replicas']} in {set_in[-1]} is not used: with autoscaling KEDA "
                f"scales between {scaling.get('minReplicas', 1)} and {scaling['maxReplicas']}"
            )
        if request.concurrency_per_replica is None and not any(
            lookup(data, "autoscaling.concurrencyPerReplica") is not None for _, data in files
        ):
            notes.append(
                f"autoscaling holds {scaling['concurrencyPerReplica']} requests in flight per replica "
                f"({sizing.SLOTS_TARGET} x the engine's max_batch_size {repository.limits.max_batch_size}); "
                "measure the concurrency that meets your latency targets with toolkit bench and pass "
                "--concurrency-per-replica"
            )
    return notes
