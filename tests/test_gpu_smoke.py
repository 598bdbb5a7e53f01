"""perf/gpu_smoke.sh runs only in NVIDIA's container on an H100; here we check that it parses and that
its prerequisite checks stop it early with a clear message (a fake nvidia-smi stands in for the GPU)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

SCRIPT = Path(__file__).resolve().parent.parent / "perf" / "gpu_smoke.sh"


def run(tmp_path: Path, path: str, **env) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", str(SCRIPT)],
        capture_output=True,
        text=True,
        timeout=60,
        env={
            "PATH": path,
            "HOME": str(tmp_path),
            "WORK": str(tmp_path / "work"),
            "OUT": str(tmp_path / "out"),
            **env,
        },
    )


def fake_tool(folder: Path, name: str, body: str) -> None:
    folder.mkdir(exist_ok=True)
    (folder / name).write_text(f"#!/bin/sh\n{body}\n")
    (folder / name).chmod(0o755)


def test_the_script_parses():
    assert subprocess.run(["bash", "-n", str(SCRIPT)], capture_output=True).returncode == 0


def test_without_a_gpu_it_stops_first_and_says_how_to_start_the_container(tmp_path):
    done = run(tmp_path, "/usr/bin:/bin")
    assert done.returncode == 1
    assert "nvidia-smi not found" in done.stderr and "--gpus all" in done.stderr
    assert not (tmp_path / "work").exists()  # nothing installed or written before the checks pass


def test_a_gpu_that_is_not_hopper_is_named(tmp_path):
    bin_dir = tmp_path / "bin"
    fake_tool(
        bin_dir,
        "nvidia-smi",
        'case "$*" in *compute_cap*) echo 8.0;; *) echo "GPU 0: NVIDIA A100";; esac',
    )
    done = run(tmp_path, f"{bin_dir}:/usr/bin:/bin")
    assert done.returncode == 1 and "compute capability 8.0" in done.stderr and "9.0" in done.stderr


def test_without_tensorrt_llm_it_names_the_container(tmp_path):
    bin_dir = tmp_path / "bin"
    fake_tool(
        bin_dir,
        "nvidia-smi",
        'case "$*" in *compute_cap*) echo 9.0;; *) echo "GPU 0: NVIDIA H100";; esac',
    )
    python = Path(os.environ.get("PYTHON", "/usr/bin/python3"))
    path = f"{bin_dir}:{python.parent}:/usr/bin:/bin"
    done = run(tmp_path, path)
    assert done.returncode == 1
    assert "cannot import tensorrt_llm" in done.stderr and "25.06-trtllm-python-py3" in done.stderr
