"""Locate tritonserver: on PATH (NVIDIA's containers), else the build bundled by nvidia-pytriton."""

from __future__ import annotations

import importlib.util
import os
import shutil
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path

from toolkit.errors import ServerError
from toolkit.settings import cache_dir


@dataclass(frozen=True)
class TritonBinary:
    executable: Path
    backend_dir: Path | None  # None: the server's own default (/opt/tritonserver/backends)
    env: dict

    @property
    def bundled(self) -> bool:
        return self.backend_dir is not None


def find_tritonserver() -> TritonBinary:
    on_path = shutil.which("tritonserver")
    if on_path:
        return TritonBinary(Path(on_path), None, dict(os.environ))
    spec = importlib.util.find_spec("pytriton")
    if spec is None or not spec.submodule_search_locations:
        raise ServerError(
            "tritonserver is not on PATH and nvidia-pytriton (which bundles it) is not installed",
            hint="pip install -e '.[cpu]' (or run inside NVIDIA's tritonserver container)",
        )
    dist = Path(list(spec.submodule_search_locations)[0]) / "tritonserver"
    executable = dist / "bin" / "tritonserver"
    if not executable.is_file():
        raise ServerError(
            f"{executable} is missing from nvidia-pytriton",
            hint="pip install --force-reinstall nvidia-pytriton==0.7.0",
        )
    return TritonBinary(executable, _python_backend_dir(dist), _bundled_env(dist))


def _python_backend_dir(dist: Path) -> Path:
    """A backends/ folder whose python backend carries the stub for this interpreter's version.

    pytriton ships one stub per Python version beside the backend; the backend looks for the stub
    next to libtriton_python.so, so we lay out a folder with links to both.
    """
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    stub = dist / "python_backend_stubs" / version / "triton_python_backend_stub"
    if not stub.is_file():
        raise ServerError(
            f"nvidia-pytriton has no Python-backend stub for Python {version}",
            hint="use Python 3.10 to 3.12",
        )
    backends = cache_dir("triton", f"backends-py{version}")
    python = backends / "python"
    python.mkdir(parents=True, exist_ok=True)
    for source in (
        dist / "backends" / "python" / "libtriton_python.so",
        dist / "backends" / "python" / "triton_python_backend_utils.py",
        stub,
    ):
        link = python / source.name
        if not link.exists() or link.resolve() != source.resolve():
            tmp = link.with_name(f".{link.name}.{os.getpid()}")
            tmp.unlink(missing_ok=True)
            tmp.symlink_to(source)
            os.replace(tmp, link)
    return backends


def _bundled_env(dist: Path) -> dict:
    """The stub must load the libpython of the interpreter that holds our packages, so its lib
    directory goes first on LD_LIBRARY_PATH; pytriton's vendored libs come next."""
    env = dict(os.environ)
    libs = [
        sysconfig.get_config_var("LIBDIR") or "",
        str(dist.parent.parent / "nvidia_pytriton.libs"),
    ]
    if env.get("LD_LIBRARY_PATH"):
        libs.append(env["LD_LIBRARY_PATH"])
    env["LD_LIBRARY_PATH"] = ":".join(p for p in libs if p)
    site = sysconfig.get_paths()["purelib"]
    env["PYTHONPATH"] = os.pathsep.join(p for p in (site, env.get("PYTHONPATH", "")) if p)
    env["PYTHONUTF8"] = "1"  # the stub runs under the C locale otherwise
    env["PATH"] = os.pathsep.join((str(Path(sys.executable).parent), env.get("PATH", "")))
    return env
