"""The numbers a deployment takes from its repository: load time, drain time, memory, bounds.

Each is a small function of the manifest (and, for a GPU repository, the engine files), with its
assumption named beside it; `toolkit deploy` flags override every one of them.
"""

from __future__ import annotations

import math
from pathlib import Path

from toolkit.repository import contract as c
from toolkit.repository.engines import CpuEngine, SyntheticEngine, TrtllmEngine
from toolkit.repository.reader import Repository

GIB = 2**30
# A replica reads its weights from a network volume (NFS, CephFS, EFS, Filestore) at 200 MB/s or
# better; slower storage needs --startup-timeout.
LOAD_BYTES_PER_S = 200e6
# Before and after the weights: container start, MPI ranks, CUDA contexts, the Python models,
# the KV pool allocation and CUDA graph capture (GPU); torch import and model build (CPU).
GPU_START_S = 180
CPU_START_S = 60
# toolkit serve checks every file of the repository against its manifest's sha256 before it starts
# Triton (the init container hashes them first and leaves memos in the pod's cache; a miss hashes
# again): at 1 GB/s or better from the page cache or the volume.
HASH_BYTES_PER_S = 1e9
# Before a replica's first probe: scheduling, pulling the image (NVIDIA's Triton TRT-LLM container
# is about 20 GB: 400 s at 50 MB/s) and starting it. Only the Deployment's progress deadline counts it.
IMAGE_PULL_S = 600
# Measured decode steps run slower than the planner's roofline bound (a lower bound) under load.
ROOFLINE_MARGIN = 2.0
# The slowest CPU stream the drain is sized for, in tokens/s (measure yours with toolkit bench).
CPU_TOKENS_PER_S = 10.0
DRAIN_MIN_S, DRAIN_MAX_S = 30, 900
# Beyond preStop + drain: toolkit serve's own 5 s past Triton's exit timeout, and slack.
GRACE_MARGIN_S = 15
SHM_BYTES = 2 * GIB
HOST_OVERHEAD_BYTES = 2 * GIB  # Python, tokenizers, the API's and Triton's own memory
GPU_HOST_OVERHEAD_BYTES = 8 * GIB  # plus CUDA, MPI and TensorRT-LLM's host buffers
FP32_BYTES = 4
# The build Job holds the checkpoint in host memory (transformers' load, ModelOpt's quantization
# and calibration) and the TensorRT-LLM checkpoint converted from it: two copies at once. Checkpoints
# on the hub are bf16, 2 bytes per parameter (the memory plan counts the parameters).
BUILD_CHECKPOINT_COPIES = 2
CHECKPOINT_BYTES_PER_PARAMETER = 2


def weight_bytes(repository: Repository, engine_files: list[Path] | None = None) -> int:
    """Bytes a replica loads: every rank's engine file (GPU), or the checkpoint in the repository (CPU)."""
    if engine_files is not None:
        return sum(path.stat().st_size for path in engine_files)
    prefix = f"{c.ENGINE}/1/weights/"
    return sum(
        size for name, (size, _, _) in repository.manifest.files.items() if name.startswith(prefix)
    )


def repository_bytes(repository: Repository) -> int:
    """Bytes of every file the manifest records: what a replica hashes before it serves."""
    return sum(size for size, _, _ in repository.manifest.files.values())


def startup_seconds(load_bytes: int, gpu: bool, hash_bytes: int = 0) -> int:
    """How long a replica may take to become ready (check its files, load its weights), rounded up to 10 s."""
    seconds = (
        (GPU_START_S if gpu else CPU_START_S)
        + hash_bytes / HASH_BYTES_PER_S
        + load_bytes / LOAD_BYTES_PER_S
    )
    return int(math.ceil(seconds / 10) * 10)


def progress_deadline_seconds(startup_s: int, build_wait_s: int = 0) -> int:
    """The Deployment's progressDeadlineSeconds: image pull, the init container's wait for the build
    Job (`build_wait_s`, 0 without one) and the load, before a rollout is reported as stalled."""
    return IMAGE_PULL_S + build_wait_s + startup_s


def longest_stream_seconds(repository: Repository) -> float:
    """The longest generation a replica may be running when it is told to stop (max_output_len tokens)."""
    tokens = repository.limits.max_output_len
    plan = repository.memory_plan
    if plan is not None:
        return tokens * plan.decode_step_ms_at_max_batch / 1000 * ROOFLINE_MARGIN
    engine = repository.engine
    if isinstance(engine, SyntheticEngine):
        return tokens * engine.step_time_ms / 1000 * ROOFLINE_MARGIN
    return tokens / CPU_TOKENS_PER_S


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


def kv_pool_bytes(repository: Repository) -> int:
    """Host bytes of the CPU engine's KV pool: keys and values, fp32, every layer, every token."""
    facts = repository.manifest.model["facts"]
    per_token = 2 * facts["num_layers"] * facts["num_kv_heads"] * facts["head_dim"] * FP32_BYTES
    return per_token * repository.limits.kv_cache_tokens


def triton_resources(repository: Repository, load_bytes: int, world_size: int) -> dict:
    """Requests (and a memory limit equal to them) for the triton container; GPUs are the chart's."""
    engine = repository.engine
    if isinstance(engine, CpuEngine):
        memory = HOST_OVERHEAD_BYTES + 2 * load_bytes + kv_pool_bytes(repository)
        cpus = engine.num_threads or 4
    elif isinstance(engine, SyntheticEngine):
        memory, cpus = HOST_OVERHEAD_BYTES, 2
    else:
        memory, cpus = GPU_HOST_OVERHEAD_BYTES + load_bytes, 2 + 2 * world_size
    memory = (
        f"{math.ceil((memory + SHM_BYTES) / GIB)}Gi"  # /dev/shm is memory the pod is charged for
    )
    return {"requests": {"cpu": str(cpus), "memory": memory}, "limits": {"memory": memory}}


def max_in_flight(repository: Repository) -> int:
    """What the API admits at once: the engine's batch slots and its waiting room, nothing Triton would take."""
    limits = repository.limits
    return limits.max_batch_size + (limits.max_queue_size or limits.max_batch_size)


def checkpoint_bytes(repository: Repository) -> int:
    """Bytes of the checkpoint the build reads: bf16 for every parameter the memory plan counts (GPU),
    else the checkpoint the repository carries."""
    plan = repository.memory_plan
    if plan is not None:
        return plan.parameter_count * CHECKPOINT_BYTES_PER_PARAMETER
    return weight_bytes(repository)


def build_resources(repository: Repository, world_size: int) -> dict:
    """CPU and memory requests for the build Job (its GPUs are the chart's). No memory limit: a
    conversion that needs more than planned may use what the node has free instead of dying
    after hours of work; the request keeps the scheduler off nodes that lack it."""
    gpu = isinstance(repository.engine, TrtllmEngine)
    overhead = GPU_HOST_OVERHEAD_BYTES if gpu else HOST_OVERHEAD_BYTES
    memory = overhead + BUILD_CHECKPOINT_COPIES * checkpoint_bytes(repository) + SHM_BYTES
    cpus = 4 + 2 * world_size if gpu else 2
    return {"requests": {"cpu": str(cpus), "memory": f"{math.ceil(memory / GIB)}Gi"}}


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
