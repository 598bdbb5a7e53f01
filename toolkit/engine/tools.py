"""Where the TensorRT-LLM tools are, which TensorRT-LLM is installed, which GPU is here.

The tools' locations come from toolkit.settings (TOOLKIT_TRTLLM_BIN_DIR, TOOLKIT_TRTLLM_PYTHON,
TOOLKIT_TRTLLM_EXAMPLES_DIR). Detection runs the real things: `python3 -c "import tensorrt_llm"`
and `nvidia-smi`; tests put
fakes of both on PATH / PYTHONPATH, the same seam.
"""

from __future__ import annotations

import shutil
import subprocess

from toolkit.errors import EngineBuildError
from toolkit.settings import trtllm_tools
from toolkit.trtllm import PINNED_TRTLLM_VERSION, TRITON_TRTLLM_CONTAINER

_DETECT_TIMEOUT_S = 120  # importing tensorrt_llm loads CUDA libraries: seconds, not minutes


def container_hint() -> str:
    return (
        "run it inside NVIDIA's Triton TRT-LLM container, e.g. docker run --gpus all "
        f"{TRITON_TRTLLM_CONTAINER} (TensorRT-LLM {PINNED_TRTLLM_VERSION})"
    )


def detect_trtllm_version(python: str | None = None) -> str | None:
    """The installed tensorrt_llm's __version__, or None when the interpreter cannot import it."""
    python = python or trtllm_tools().python
    if shutil.which(python) is None:
        return None
    code = "import tensorrt_llm, sys; sys.stdout.write('\\n' + tensorrt_llm.__version__ + '\\n')"
    try:
        done = subprocess.run(
            [python, "-c", code], capture_output=True, text=True, timeout=_DETECT_TIMEOUT_S
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    lines = [line.strip() for line in done.stdout.splitlines() if line.strip()]
    # tensorrt_llm prints a banner on import; the version is the last line we wrote.
    return lines[-1] if done.returncode == 0 and lines else None


def _nvidia_smi_lines(query: str) -> list[str] | None:
    """The non-blank lines `nvidia-smi --query-gpu=QUERY` prints (one per GPU), or None without it."""
    if shutil.which("nvidia-smi") is None:
        return None
    try:
        done = subprocess.run(
            ["nvidia-smi", f"--query-gpu={query}", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=30,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    if done.returncode != 0:
        return None
    return [line.strip() for line in done.stdout.splitlines() if line.strip()]


def detect_gpu_sm() -> str | None:
    """Compute capability of GPU 0 as nvidia-smi prints it ("9.0"), or None without a GPU."""
    lines = _nvidia_smi_lines("compute_cap")
    return lines[0] if lines else None


def require_trtllm() -> str:
    """The installed TensorRT-LLM version if it is the pinned release; EngineBuildError otherwise.

    Building runs the pinned release only: the commands, flags and example-script paths the toolkit
    emits are that release's (serving accepts engines of other releases, toolkit.engine.info).
    """
    version = detect_trtllm_version()
    if version is None:
        raise EngineBuildError(
            "TensorRT-LLM is not installed here (python3 cannot import tensorrt_llm)",
            hint=container_hint(),
        )
    if version != PINNED_TRTLLM_VERSION:
        raise EngineBuildError(
            f"TensorRT-LLM {version} is installed; toolkit build emits the commands and example-script "
            f"paths of TensorRT-LLM {PINNED_TRTLLM_VERSION} only",
            hint=container_hint(),
        )
    return version


def detect_gpu_count() -> int | None:
    """GPUs this machine shows (one nvidia-smi line each), or None without nvidia-smi."""
    lines = _nvidia_smi_lines("name")
    return None if lines is None else len(lines)


def require_gpus(needed: int, why: str) -> None:
    """Refuse a build that needs more GPUs than this machine shows (CUDA_VISIBLE_DEVICES applies)."""
    found = detect_gpu_count()
    if found is not None and found < needed:
        raise EngineBuildError(
            f"this build needs {needed} GPUs ({why}); nvidia-smi shows {found} here",
            hint=f"build on a machine with {needed} GPUs, or plan for fewer (--tp, --calib-gpus)",
        )


def require_gpu_sm(expected: str, target: str) -> str:
    sm = detect_gpu_sm()
    if sm is None:
        raise EngineBuildError(
            f"no NVIDIA GPU found (nvidia-smi is missing or failed); --target {target} needs one",
            hint=container_hint(),
        )
    if sm != expected:
        raise EngineBuildError(
            f"--target {target} is SM {expected}, but this machine's GPU is SM {sm}; "
            "engines only run on the SM they were built on",
            hint=f"build on a {target}, or pick the --target that matches this GPU",
        )
    return sm
