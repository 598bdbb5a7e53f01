"""mpirun for a multi-GPU engine: one tritonserver per rank, as NVIDIA's launch_triton_server.py does.

Rank 0 serves every model and the HTTP/gRPC/metrics endpoints; ranks above 0 load only the
engine model (they join its MPI world) and open no endpoints. Each rank gets its own Python
backend shared-memory prefix so their stubs do not collide.
"""

from __future__ import annotations

from typing import Callable, Sequence

ENGINE_MODEL = "tensorrt_llm"


def shm_prefix(rank: int) -> str:
    return f"prefix{rank}_"


def tritonserver_rank_argv(
    rank: int,
    model_repository: str,
    *,
    tritonserver: str = "tritonserver",
    http_port: int = 8000,
    grpc_port: int = 8001,
    metrics_port: int = 8002,
    extra: Sequence[str] = (),
) -> list[str]:
    argv = [tritonserver, f"--model-repository={model_repository}", "--disable-auto-complete-config"]
    if rank == 0:
        argv += [f"--http-port={http_port}", f"--grpc-port={grpc_port}", f"--metrics-port={metrics_port}"]
    else:
        argv += [
            "--model-control-mode=explicit",
            f"--load-model={ENGINE_MODEL}",
            "--allow-http=false",
            "--allow-grpc=false",
            "--allow-metrics=false",
        ]
    argv.append(f"--backend-config=python,shm-region-prefix-name={shm_prefix(rank)}")
    return argv + list(extra)


def mpirun_command(
    world_size: int,
    argv_for_rank: Callable[[int], Sequence[str]],
    *,
    mpirun: str = "mpirun",
    allow_run_as_root: bool = True,
) -> list[str]:
    """`mpirun -n 1 <rank 0 argv> : -n 1 <rank 1 argv> : ...` (MPMD: one process per rank)."""
    if world_size < 2:
        raise ValueError(f"mpirun is for world size > 1, got {world_size}")
    command = [mpirun] + (["--allow-run-as-root"] if allow_run_as_root else [])
    for rank in range(world_size):
        if rank:
            command.append(":")
        command += ["-n", "1", *argv_for_rank(rank)]
    return command
