"""Find perf_analyzer and run it.

The binary ships in tritonclient's manylinux wheels up to 2.51 (later wheels need glibc 2.38).
It links libb64.so.0d (Debian/Ubuntu package libb64-0d) and libcudart.so.12, even when it never
touches a GPU: from the nvidia-cuda-runtime-cu12 wheel (our `cpu` extra), or the CUDA runtime the
machine already has (NVIDIA's containers: /usr/local/cuda, on the loader's path).
"""

from __future__ import annotations

import ctypes
import importlib.util
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from toolkit.errors import BenchError
from toolkit.subprocs import stop_process

PINNED_CLIENT = "tritonclient[all]==2.51.0"


@dataclass(frozen=True)
class PerfAnalyzer:
    executable: Path
    env: dict


@dataclass(frozen=True)
class PerfAnalyzerRun:
    argv: tuple[str, ...]
    log_file: Path
    returncode: int


def find_perf_analyzer() -> PerfAnalyzer:
    executable = _find_executable()
    cudart_dir = _cudart_dir()
    _check_libb64()
    env = dict(os.environ)
    if cudart_dir is not None:
        env["LD_LIBRARY_PATH"] = os.pathsep.join(
            p for p in (str(cudart_dir), env.get("LD_LIBRARY_PATH", "")) if p
        )
    return PerfAnalyzer(executable, env)


def _find_executable() -> Path:
    beside_python = Path(sys.executable).parent / "perf_analyzer"
    for candidate in (shutil.which("perf_analyzer"), beside_python):
        if candidate and Path(candidate).is_file():
            return Path(candidate)
    raise BenchError(
        "perf_analyzer is not installed (not on PATH, not beside this Python)",
        hint=f"pip install '{PINNED_CLIENT}' (its manylinux wheel carries the binary; newer wheels need glibc >= 2.38)",
    )


CUDART = "libcudart.so.12"
# Where CUDA installs put the runtime when it is not on the loader's path (NVIDIA's images, toolkits).
CUDA_LIBRARY_DIRS = (
    "/usr/local/cuda/lib64",
    "/usr/local/cuda/targets/x86_64-linux/lib",
    "/usr/local/cuda/targets/sbsa-linux/lib",
    "/usr/lib/x86_64-linux-gnu",
    "/usr/lib/aarch64-linux-gnu",
)


def _cudart_dir() -> Path | None:
    """The folder to put on LD_LIBRARY_PATH for libcudart.so.12, or None when the loader finds it already."""
    spec = importlib.util.find_spec("nvidia")
    if spec is not None:
        for root in spec.submodule_search_locations or ():
            lib = Path(root) / "cuda_runtime" / "lib"
            if (lib / CUDART).is_file():
                return lib
    try:
        ctypes.CDLL(CUDART)
        return None
    except OSError:
        pass
    for folder in CUDA_LIBRARY_DIRS:
        if (Path(folder) / CUDART).is_file():
            return Path(folder)
    raise BenchError(
        f"perf_analyzer needs {CUDART} (even on CPU); it is not in the nvidia-cuda-runtime-cu12 wheel (not "
        f"installed), not on the loader's path, and not in {', '.join(CUDA_LIBRARY_DIRS)}",
        hint="pip install nvidia-cuda-runtime-cu12, or put your CUDA 12 runtime's folder on LD_LIBRARY_PATH",
    )


def _check_libb64() -> None:
    try:
        ctypes.CDLL("libb64.so.0d")
    except OSError as exc:
        raise BenchError(
            "perf_analyzer needs libb64.so.0d, which is not installed",
            hint="apt-get install -y libb64-0d   (Debian/Ubuntu; run apt-get update first)",
        ) from exc


SERVER_GONE_S = (
    3  # perf_analyzer waits forever on the streams of a server that died: give up after this
)


def run_perf_analyzer(
    pa: PerfAnalyzer,
    args: list[str],
    log_file: Path,
    timeout_s: float,
    server_up: Callable[[], bool] = lambda: True,
) -> PerfAnalyzerRun:
    """Run to completion in its own session, logging to `log_file`; a non-zero exit is an error, and so
    is a server that stops answering (`server_up`, asked every second) for SERVER_GONE_S seconds."""
    argv = (str(pa.executable), *args)
    log_file.parent.mkdir(parents=True, exist_ok=True)
    with open(log_file, "wb") as log:
        log.write((" ".join(argv) + "\n").encode())
        log.flush()
        process = subprocess.Popen(
            argv, stdout=log, stderr=subprocess.STDOUT, env=pa.env, start_new_session=True
        )
        try:
            code = _wait(process, timeout_s, server_up, log_file)
        except subprocess.TimeoutExpired:
            stop_process(process, 5)
            raise BenchError(
                f"perf_analyzer ran past {timeout_s:.0f}s\n{log_tail(log_file)}",
                hint="lower --requests or the load, or raise --timeout",
            ) from None
        except BaseException:
            stop_process(process, 5)
            raise
    if code != 0:
        raise BenchError(
            f"perf_analyzer exited with code {code}\n{log_tail(log_file)}",
            hint=f"full log: {log_file}",
        )
    return PerfAnalyzerRun(argv, log_file, code)


def _wait(process: subprocess.Popen, timeout_s: float, server_up, log_file: Path) -> int:
    deadline, gone_since = time.monotonic() + timeout_s, None
    while True:
        try:
            return process.wait(min(1.0, max(deadline - time.monotonic(), 0.01)))
        except subprocess.TimeoutExpired:
            if time.monotonic() >= deadline:
                raise
        gone_since = None if server_up() else (gone_since or time.monotonic())
        if gone_since is not None and time.monotonic() - gone_since >= SERVER_GONE_S:
            stop_process(process, 5)
            raise BenchError(
                f"the server stopped answering during this point (nothing on its gRPC port for "
                f"{SERVER_GONE_S} s); perf_analyzer was stopped\n{log_tail(log_file)}",
                hint="see why the server died (toolkit serve's output, its log), then run the sweep again",
            )


def log_tail(path: Path, lines: int = 20) -> str:
    """The log's last lines, before the usage text perf_analyzer prints after an argument error (a
    hundred lines of options that pushed the one error line out of the tail)."""
    try:
        text = path.read_text(errors="replace").splitlines()
    except OSError:
        return "(no perf_analyzer log)"
    usage = next((i for i, line in enumerate(text) if line.startswith("Usage: ")), len(text))
    return "--- perf_analyzer log (last lines) ---\n" + "\n".join(text[:usage][-lines:])
