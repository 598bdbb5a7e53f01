"""Small real repositories for tests: written by the toolkit's own writer, from checkpoints made in the test."""

from __future__ import annotations

import json
from pathlib import Path

from toolkit.build import plan_local_repository
from toolkit.build_settings import BuildSettings
from toolkit.model.sources import ResolvedModel
from toolkit.repository.writer import write_repository
from toolkit.serve.launcher import RunningServer, ServerConfig, launch_server
from toolkit.serve.net import free_port

from tiny import TINY_LLAMA_CONFIG


def config_only_checkpoint(
    folder: Path, tokenizer_files: dict[str, str], vocab_size: int, **config
) -> Path:
    """A checkpoint without weights (enough for a synthetic repository): config.json plus the given tokenizer files."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(
        json.dumps({**TINY_LLAMA_CONFIG, "vocab_size": vocab_size, **config})
    )
    for name, text in tokenizer_files.items():
        (folder / name).write_text(text)
    return folder


def python_repository(model: ResolvedModel, output: Path, target: str = "cpu", **settings) -> Path:
    """A repository of a checkpoint on disk for a Python target, written by the toolkit's own writer."""
    return write_repository(
        plan_local_repository(model, output, target, BuildSettings(**settings))
    ).path


def write_test_repository(
    checkpoint: Path,
    output: Path,
    *,
    source: str | None = None,
    revision: str | None = None,
    synthetic: bool = False,
    **settings,
) -> Path:
    """A repository of `checkpoint` (cpu engine, or the synthetic one) with small limits; `source` and
    `revision`: where the checkpoint is said to come from (default: the local folder)."""
    defaults = {
        "max_input_len": 128,
        "max_output_len": 64,
        "max_seq_len": 256,
        "kv_cache_tokens": 1024,
        "max_batch_size": 8,
    }
    model = ResolvedModel(checkpoint, source or f"local:{checkpoint}", revision)
    target = "synthetic" if synthetic else "cpu"
    return python_repository(model, output, target, **{**defaults, **settings})


def gpu_engine_plan(model: str, target: str | None = "h100-sxm", **options):
    """The engine build that `toolkit build` plans for these flags (through the library's one build entry)."""
    from toolkit.build import BuildRequest, plan_build

    return plan_build(
        BuildRequest.make(model=str(model), target=target, **options)
    ).planned.engine_build


def launch_on_free_ports(
    repo: Path, log_file: Path, ready_timeout_s: float, **config
) -> RunningServer:
    """tritonserver over `repo` on three free ports, ready (or raising) within `ready_timeout_s`."""
    return launch_server(
        ServerConfig(
            repo=repo,
            http_port=free_port(),
            grpc_port=free_port(),
            metrics_port=free_port(),
            ready_timeout_s=ready_timeout_s,
            log_file=log_file,
            **config,
        )
    )
