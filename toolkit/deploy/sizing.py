"""The numbers a deployment takes from its repository: load time, drain time, memory, bounds.

Each is a small function of the manifest (and, for a GPU repository, the engine files), with its
assumption named beside it; `toolkit deploy` flags override every one of them.
"""

from __future__ import annotations

import math
import re
from pathlib import Path

from toolkit.repository.reader import Repository
from toolkit.targets import target_for

GIB = 2**30
# A replica reads its weights from a network volume (NFS, CephFS, EFS, Filestore) at 200 MB/s or
# better; slower storage needs --startup-timeout.
LOAD_BYTES_PER_S = 200e6
# toolkit serve checks every file of the repository against its manifest's sha256 before it starts
# Triton (the init container hashes them first and leaves memos in the pod's cache; a miss hashes
# again): at 1 GB/s or better from the page cache or the volume.
HASH_BYTES_PER_S = 1e9
# Before a replica's first probe: scheduling, pulling the image (NVIDIA's Triton TRT-LLM container
# is about 20 GB: 400 s at 50 MB/s) and starting it. Only the Deployment's progress deadline counts it.
IMAGE_PULL_S = 600
DRAIN_MIN_S, DRAIN_MAX_S = 30, 900
# The autoscaler holds a replica's requests in flight at this fraction of its batch slots.
SLOTS_TARGET = 0.8
# The HPA (KEDA's too) changes the count only when a metric is this far past its target (Kubernetes'
# --horizontal-pod-autoscaler-tolerance, 0.1 by default).
HPA_TOLERANCE = 0.1
# Beyond preStop + drain: toolkit serve's own 5 s past Triton's exit timeout, and slack.
GRACE_MARGIN_S = 15
# Checkpoints on the hub are bf16, 2 bytes per parameter (the memory plan counts the parameters).
CHECKPOINT_BYTES_PER_PARAMETER = 2
# helm waits for the build hook this much past the Job's own deadline, so a build that runs out of
# time is reported with the Job's reason (DeadlineExceeded), not as helm's timeout.
HELM_TIMEOUT_MARGIN_S = 300
# Kubernetes resource quantities (memory): a number, optionally with a decimal or binary suffix.
QUANTITY = re.compile(r"([0-9]+(?:\.[0-9]+)?)(Ki|Mi|Gi|Ti|Pi|Ei|k|M|G|T|P|E)?")  # matched whole
QUANTITY_UNITS: dict[str | None, int] = {
    None: 1,
    **{s: 1000 ** (i + 1) for i, s in enumerate(("k", "M", "G", "T", "P", "E"))},
    **{s: 1024 ** (i + 1) for i, s in enumerate(("Ki", "Mi", "Gi", "Ti", "Pi", "Ei"))},
}


def weight_bytes(repository: Repository, engine_files: list[Path] | None = None) -> int:
    """Bytes a replica loads: every rank's engine file (GPU), or the checkpoint in the repository (CPU)."""
    return target_for(repository).load_bytes(repository, engine_files)


def repository_bytes(repository: Repository) -> int:
    """Bytes of every file the manifest records: what a replica hashes before it serves."""
    return sum(record.size for record in repository.manifest.files.values())


def startup_seconds(repository: Repository, load_bytes: int, hash_bytes: int = 0) -> int:
    """How long a replica may take to become ready (start, check its files, load its weights),
    rounded up to 10 s."""
    seconds = (
        target_for(repository).start_seconds
        + hash_bytes / HASH_BYTES_PER_S
        + load_bytes / LOAD_BYTES_PER_S
    )
    return int(math.ceil(seconds / 10) * 10)


def progress_deadline_seconds(startup_s: int) -> int:
    """The Deployment's progressDeadlineSeconds: image pull and the load, before a rollout is reported
    as stalled (the build Job is done before helm applies the Deployment)."""
    return IMAGE_PULL_S + startup_s


def helm_timeout_seconds(build_deadline_s: int) -> int:
    """`helm upgrade --timeout` with a build Job: helm waits for the pre-install/pre-upgrade hook that
    long (5 minutes by default), so past the Job's own activeDeadlineSeconds."""
    return build_deadline_s + HELM_TIMEOUT_MARGIN_S


def gateway_duration(seconds: int) -> str:
    """A Gateway API duration (GEP-2257: up to four NUMBER+unit parts, each number at most 5 digits):
    hours, minutes and seconds, e.g. 102800 -> 28h33m20s."""
    hours, rest = divmod(int(seconds), 3600)
    minutes, secs = divmod(rest, 60)
    parts = [f"{n}{unit}" for n, unit in ((hours, "h"), (minutes, "m"), (secs, "s")) if n]
    return "".join(parts) or "0s"


def gateway_seconds(duration: str) -> float:
    """Seconds of a Gateway API duration (gateway_duration's form, ms too): 1h2m3s -> 3723."""
    units = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 0.001}
    return sum(int(n) * units[unit] for n, unit in re.findall(r"([0-9]+)(ms|h|m|s)", duration))


def quantity_bytes(value) -> int | None:
    """Bytes of a Kubernetes memory quantity (2Gi, 500M, 1073741824); None when it is not one."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value if value >= 0 else None
    match = QUANTITY.fullmatch(str(value).strip()) if isinstance(value, str) else None
    if match is None:
        return None
    return math.ceil(float(match.group(1)) * QUANTITY_UNITS[match.group(2)])


def longest_stream_seconds(repository: Repository) -> float:
    """The longest generation a replica may be running when it is told to stop (max_output_len tokens)."""
    tokens = repository.limits.max_output_len
    return tokens / target_for(repository).slowest_stream_tokens_per_s(repository)


def queue_wait_seconds(repository: Repository) -> float:
    """The longest an admitted request waits for a batch slot before its first token: the API admits
    max_batch_size + max_queue_size (see max_in_flight), so up to max_queue_size wait, and they start
    max_batch_size at a time, each wave after a stream of the longest kind has finished."""
    limits = repository.limits
    waiting = max_in_flight(repository) - limits.max_batch_size
    return math.ceil(waiting / limits.max_batch_size) * longest_stream_seconds(repository)


def request_seconds(repository: Repository) -> int:
    """The longest request a replica may hold: its wait for a batch slot, then the longest stream."""
    return int(math.ceil(queue_wait_seconds(repository) + longest_stream_seconds(repository)))


def drain_seconds(repository: Repository) -> int:
    """Seconds in-flight requests get after SIGTERM (the queued ones too: Triton finishes every request
    it holds): the longest request, within [30 s, 15 min]."""
    return int(min(DRAIN_MAX_S, max(DRAIN_MIN_S, request_seconds(repository))))


def grace_seconds(drain_s: int, prestop_s: int) -> int:
    """terminationGracePeriodSeconds: preStop, the drain, and toolkit serve's own margin past it."""
    return prestop_s + drain_s + GRACE_MARGIN_S


def triton_resources(
    repository: Repository, load_bytes: int, world_size: int, shm_bytes: int
) -> dict:
    """Requests (and a memory limit equal to them) for the triton container; GPUs are the chart's.
    `shm_bytes`: the /dev/shm memory emptyDir (triton.shmSize), whose pages count against the limit."""
    needs = target_for(repository).resources(repository, load_bytes, world_size)
    memory = f"{math.ceil((needs.memory_bytes + shm_bytes) / GIB)}Gi"
    return {"requests": {"cpu": str(needs.cpus), "memory": memory}, "limits": {"memory": memory}}


def batch_slots(repository: Repository, pipeline_stages: int = 1) -> int:
    """Requests the engine runs at once: max_batch_size per micro-batch, and a pipeline-parallel engine
    keeps one micro-batch per stage in flight (TensorRT-LLM's capacity scheduler holds
    max_batch_size x pp requests)."""
    return repository.limits.max_batch_size * pipeline_stages


def concurrency_per_replica(repository: Repository, pipeline_stages: int = 1) -> int:
    """The autoscaler's default target of requests in flight per replica: SLOTS_TARGET of the engine's
    batch slots. Past them a request only queues (TTFT grows by a whole stream for every slots' worth
    queued), and the HPA acts only 10 % past its target: at 0.8 it starts adding a replica at about
    0.88 x the slots, before a request queues, and the slots left absorb the growth while the new
    replica loads. Measure your own with toolkit bench."""
    return max(1, int(batch_slots(repository, pipeline_stages) * SLOTS_TARGET))


def max_in_flight(repository: Repository, pipeline_stages: int = 1) -> int:
    """What the API admits at once: the engine's batch slots and its waiting room, nothing Triton would take."""
    limits = repository.limits
    return batch_slots(repository, pipeline_stages) + (
        limits.max_queue_size or limits.max_batch_size
    )


# The OpenAI API's CPU per streamed token, by how it reads the engine (the chart's api.engineTransport),
# where each engine response is an event of its own, as a GPU engine answers every step:
# perf/results/api_front_end_gpu_pace.md (32 and 64 streams at 20 ms steps) read 96.8-99.3 us over
# Triton's HTTP generate_stream and 186.4-188.8 us over gRPC; rounded up. (A single gRPC figure, 106 us
# from perf/results/stack_ceiling.md's busier load, sized the API before: half what gRPC costs at this pace.)
API_US_PER_TOKEN = {"http": 100.0, "grpc": 190.0}
# Spare CPU on top, for admission bursts and the event loop's own latency (a loop near 100 % queues
# every stream behind every other).
API_CPU_HEADROOM = 1.25
API_MAX_WORKERS = 64
MIB = 2**20
# Resident memory: one API process (tokenizer, gRPC channel, uvicorn) and each worker besides.
API_MEMORY_BYTES = 1024 * MIB
API_WORKER_MEMORY_BYTES = 384 * MIB


def api_workers(tokens_per_s: float | None, transport: str) -> int:
    """API processes for a replica streaming `tokens_per_s`: one core relays 1e6 / API_US_PER_TOKEN
    tokens/s over `transport`, with API_CPU_HEADROOM to spare (None: unknown, one)."""
    if tokens_per_s is None:
        return 1
    cores = tokens_per_s * API_US_PER_TOKEN[transport] / 1e6 * API_CPU_HEADROOM
    return clamp(cores, 1, API_MAX_WORKERS)


def api_resources(workers: int) -> dict:
    """The api container's requests: a core per worker; memory per process, twice that as the limit."""
    memory = API_MEMORY_BYTES + (workers - 1) * API_WORKER_MEMORY_BYTES
    return {
        "requests": {"cpu": str(workers), "memory": f"{math.ceil(memory / MIB)}Mi"},
        "limits": {"memory": f"{math.ceil(2 * memory / MIB)}Mi"},
    }


def checkpoint_bytes(repository: Repository) -> int:
    """Bytes of the checkpoint the build reads: bf16 for every parameter the memory plan counts (GPU),
    else the checkpoint the repository carries."""
    plan = repository.memory_plan
    if plan is not None:
        return plan.parameter_count * CHECKPOINT_BYTES_PER_PARAMETER
    return weight_bytes(repository)


def build_resources(repository: Repository, world_size: int, shm_bytes: int) -> dict:
    """CPU and memory requests for the build Job (its GPUs are the chart's), its /dev/shm
    (`shm_bytes`, triton.shmSize) included. No memory limit: a conversion that needs more than
    planned may use what the node has free instead of dying after hours of work; the request keeps
    the scheduler off nodes that lack it."""
    needs = target_for(repository).build_resources(checkpoint_bytes(repository), world_size)
    memory = needs.memory_bytes + shm_bytes
    return {"requests": {"cpu": str(needs.cpus), "memory": f"{math.ceil(memory / GIB)}Gi"}}


def build_gpu_count(repository: Repository, world_size: int) -> int:
    """GPUs the build Job needs: the engine's ranks, or more where its calibration spreads the bf16
    checkpoint over more (--calib-gpus, recorded in the manifest's settings)."""
    calibration = repository.manifest.settings.calib_gpus or 0
    return max(world_size, calibration)


def clamp(value: float, low: int, high: int) -> int:
    return int(min(high, max(low, math.ceil(value))))


def scaling_behavior(startup_s: int, grace_s: int) -> dict:
    """HPA behaviour through KEDA, from load time and grace period (HPA bounds: period <= 1800 s,
    stabilization window <= 3600 s).

    Up: no stabilization (a queue is a reason now), at most 2 pods or +100% per load time, so each
    decision sees the replicas the previous one added. Down: only after the lower recommendation
    held for twice the load time (a replica dropped too early costs a full reload), one replica per
    grace period, so at most one replica drains at a time.
    """
    return {
        "scaleUp": {"stabilizationWindowSeconds": 0, "periodSeconds": clamp(startup_s, 60, 1800)},
        "scaleDown": {
            "stabilizationWindowSeconds": clamp(2 * startup_s, 300, 3600),
            "periodSeconds": clamp(grace_s, 60, 1800),
        },
    }
