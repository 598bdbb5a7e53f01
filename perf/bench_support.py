"""What the perf/ benchmarks share: the machine record of a result, the embedded default's CPU repository
built and served on free ports.

Imported by the perf/ scripts that run as `python perf/SCRIPT.py` (their folder is on sys.path).
"""

from __future__ import annotations

import json
import os
import platform
from pathlib import Path

BENCH_MODEL = "smollm2-135m-instruct"
KV_CACHE_TOKENS = 32768  # room for 16 concurrent streams of a few hundred tokens


def machine() -> dict:
    """What a result records of the machine it was measured on."""
    return {
        "cpus": os.cpu_count(),
        "platform": platform.platform(),
        "python": platform.python_version(),
    }


def write_results_json(out: Path | str, meta: dict, results) -> Path:
    """OUT.json with {"meta": meta, "results": results}, its folder made; returns OUT (a Path)."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(
        json.dumps({"meta": meta, "results": results}, indent=2) + "\n"
    )
    return out


def serve_cpu_repository(workdir: Path, log_file: Path | None = None):
    """(the resolved model, the running tritonserver) for BENCH_MODEL's CPU repository at workdir/repo."""
    from toolkit.build import plan_local_repository
    from toolkit.build_settings import BuildSettings
    from toolkit.model.sources import resolve_model
    from toolkit.repository.writer import write_repository
    from toolkit.serve.launcher import ServerConfig, launch_server
    from toolkit.serve.net import free_port

    model = resolve_model(BENCH_MODEL, progress=False)
    settings = BuildSettings(kv_cache_tokens=KV_CACHE_TOKENS)
    write_repository(plan_local_repository(model, workdir / "repo", "cpu", settings))
    server = launch_server(
        ServerConfig(
            repo=workdir / "repo",
            http_port=free_port(),
            grpc_port=free_port(),
            metrics_port=free_port(),
            log_file=log_file,
        )
    )
    return model, server
