"""mpirun for TP=2: one tritonserver per rank, rank 1 loads only the engine, separate shm prefixes."""

from __future__ import annotations

import pytest

from toolkit.serve.mpi import mpirun_command, tritonserver_rank_argv


def test_mpirun_for_tp2():
    command = mpirun_command(
        2, lambda rank: tritonserver_rank_argv(rank, "/repo", shm_prefix=f"prefix{rank}_")
    )
    assert command == [
        "mpirun",
        "--allow-run-as-root",
        "-n",
        "1",
        "tritonserver",
        "--model-repository=/repo",
        "--disable-auto-complete-config",
        "--http-port=8000",
        "--grpc-port=8001",
        "--metrics-port=8002",
        "--backend-config=python,shm-region-prefix-name=prefix0_",
        ":",
        "-n",
        "1",
        "tritonserver",
        "--model-repository=/repo",
        "--disable-auto-complete-config",
        "--model-control-mode=explicit",
        "--load-model=tensorrt_llm",
        "--allow-http=false",
        "--allow-grpc=false",
        "--allow-metrics=false",
        "--backend-config=python,shm-region-prefix-name=prefix1_",
    ]


def test_world_size_4_has_four_ranks_and_distinct_prefixes():
    command = mpirun_command(
        4, lambda rank: tritonserver_rank_argv(rank, "/repo", shm_prefix=f"prefix{rank}_")
    )
    assert command.count(":") == 3 and command.count("tritonserver") == 4
    assert len({a for a in command if "shm-region-prefix-name" in a}) == 4


def test_world_size_1_needs_no_mpirun():
    with pytest.raises(ValueError):
        mpirun_command(1, lambda rank: ["tritonserver"])


def test_stubs_under_mpirun_are_watched_and_stopped(tmp_path):
    """Under mpirun the Python-backend stubs are grandchildren of the session's leader (mpirun ->
    tritonserver rank -> stub), and OpenMPI puts each rank in a process group of its own (setpgid):
    serve must still find the stubs, or a dead one goes unnoticed, and stopping mpirun must end them."""
    import os
    import subprocess
    import sys
    import time

    from toolkit.serve.lifecycle import STUB, python_stubs
    from toolkit.subprocs import process_alive, stop_process

    model_py = tmp_path / "preprocessing" / "1" / "model.py"
    model_py.parent.mkdir(parents=True)
    model_py.write_text("sleep 60\n")
    stub = tmp_path / STUB
    os.symlink("/bin/sh", stub)  # a process named like the stub, whose first argument is model.py
    rank = (  # a rank in a process group of its own, as OpenMPI launches them
        "import os, subprocess, sys; os.setpgid(0, 0); subprocess.run(sys.argv[1:])"
    )
    leader = subprocess.Popen(  # "mpirun": the session leader, as start_process starts servers
        [sys.executable, "-c", "import subprocess, sys; subprocess.run(sys.argv[1:])"]
        + [sys.executable, "-c", rank, str(stub), str(model_py)],
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 10
        while not (found := python_stubs(leader.pid)) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert list(found.values()) == ["preprocessing"]
        (stub_pid,) = found
        # outside mpirun's group: only the session holds it
        assert os.getpgid(stub_pid) != leader.pid
    finally:
        stop_process(leader, 5)
    deadline = time.monotonic() + 10
    while process_alive(stub_pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not process_alive(stub_pid), "a rank's stub outlived mpirun's stop"
