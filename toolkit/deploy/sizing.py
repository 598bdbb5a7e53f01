"""The numbers a deployment takes from its repository: load time, drain time, memory, bounds.

Each is a small function of the manifest (and, for a GPU repository, the engine files), with its
assumption named beside it; `toolkit deploy` flags override every one of them.
"""

from __future__ import annotations

import math
from pathlib import Path

from toolkit.repository import contract as c
from toolkit.repository.engines import CpuEngine, SyntheticEngine
from toolkit.repository.reader import Repository

GIB = 2**30
# A replica reads its weights from a network volume (NFS, CephFS, EFS, Filestore) at 200 MB/s or
# better; slower storage needs --startup-timeout.
LOAD_BYTES_PER_S = 200e6
# Before and after the weights: container start, MPI ranks, CUDA contexts, the Python models,
# the KV pool allocation and CUDA graph capture (GPU); torch import and model build (CPU).
GPU_START_S = 180
CPU_START_S = 60
# Measured decode steps run slower than the planner's roofline bound (a lower bound) under load.
ROOFLINE_MARGIN = 2.0
# The slowest CPU stream the drain is sized for, in tokens/s (measure yours with toolkit bench).
CPU_TOKENS_PER_S = 10.0
DRAIN_MIN_S, DRAIN_MAX_S = 30, 900
PRESTOP_S = 5
GRACE_MARGIN_S = (
    15  # beyond preStop + drain: toolkit serve's own 5 s past Triton's exit timeout, and slack
)
SHM_BYTES = 2 * GIB
HOST_OVERHEAD_BYTES = 2 * GIB  # Python, tokenizers, the API's and Triton's own memory
GPU_HOST_OVERHEAD_BYTES = 8 * GIB  # plus CUDA, MPI and TensorRT-LLM's host buffers
FP32_BYTES = 4


def weight_bytes(repository: Repository, engine_files: list[Path] | None = None) -> int:
    """Bytes a replica loads: every rank's engine file (GPU), or the checkpoint in the repository (CPU)."""
    if engine_files is not None:
        return sum(path.stat().st_size for path in engine_files)
    prefix = f"{c.ENGINE}/1/weights/"
    return sum(
        size for name, (size, _, _) in repository.manifest.files.items() if name.startswith(prefix)
    )


def startup_seconds(load_bytes: int, gpu: bool) -> int:
    """How long a replica may take to become ready, rounded up to 10 s."""
    seconds = (GPU_START_S if gpu else CPU_START_S) + load_bytes / LOAD_BYTES_PER_S
    return int(math.ceil(seconds / 10) * 10)


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


def drain_seconds(repository: Repository) -> int:
    """Seconds in-flight streams get after SIGTERM: the longest stream, within [30 s, 15 min]."""
    return int(min(DRAIN_MAX_S, max(DRAIN_MIN_S, math.ceil(longest_stream_seconds(repository)))))


def grace_seconds(drain_s: int, prestop_s: int = PRESTOP_S) -> int:
    """terminationGracePeriodSeconds as the chart computes it."""
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
