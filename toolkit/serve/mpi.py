"""mpirun for a multi-GPU engine: one tritonserver per rank, as NVIDIA's launch_triton_server.py does.

Rank 0 serves every model and the HTTP/gRPC/metrics endpoints; ranks above 0 load only the
engine model (they join its MPI world) and open no endpoints. Each rank gets its own Python
backend shared-memory prefix (unique per server too, see launcher.shm_prefix) so no stubs collide.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from toolkit.repository.contract import ENGINE as ENGINE_MODEL


def tritonserver_rank_argv(
    rank: int,
    model_repository: str,
    *,
    tritonserver: str = "tritonserver",
    endpoints: Sequence[str] = ("--http-port=8000", "--grpc-port=8001", "--metrics-port=8002"),
    shm_prefix: str,
    extra: Sequence[str] = (),
) -> list[str]:
    argv = [
        tritonserver,
        f"--model-repository={model_repository}",
        "--disable-auto-complete-config",
    ]
    if rank == 0:
        argv += list(endpoints)
    else:
        argv += [
            "--model-control-mode=explicit",
            f"--load-model={ENGINE_MODEL}",
            "--allow-http=false",
            "--allow-grpc=false",
            "--allow-metrics=false",
        ]
    argv.append(f"--backend-config=python,shm-region-prefix-name={shm_prefix}")
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
