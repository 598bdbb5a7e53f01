"""execute_engine_build: run the planned TensorRT-LLM steps, with the build cache and an atomic swap-in."""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from toolkit.engine.build_plan import EngineBuildPlan
from toolkit.engine.cache import RECORD, cache_key, checkpoint_hash, is_cached, read_record
from toolkit.engine.layout import rank_engine_files
from toolkit.engine.tools import require_gpu_sm, require_trtllm
from toolkit.errors import EngineBuildError
from toolkit.fsutil import file_lock, write_text_atomic
from toolkit.subprocs import start_process, stop_process

Progress = Callable[[str], None]
_LOG_TAIL_LINES = 25


@dataclass(frozen=True)
class EngineBuildResult:
    engine_dir: str
    cached: bool
    cache_key: str
    trtllm_version: str
    gpu_sm: str
    world_size: int
    seconds: float

    def to_dict(self) -> dict:
        return asdict(self)


def execute_engine_build(
    plan: EngineBuildPlan, *, progress: Progress | None = None
) -> EngineBuildResult:
    """Run quantize/convert and trtllm-build unless an engine with the same cache key is already there.

    The plan's checkpoint must be on local disk with its weights (toolkit.build downloads hub models first).
    """
    say = progress or (lambda _message: None)
    started = time.monotonic()
    version = require_trtllm()  # the pinned release, or refused
    sm = require_gpu_sm(plan.gpu_sm, plan.target)
    model_dir = _checkpoint_with_weights(plan)
    key = cache_key(checkpoint_hash(model_dir), plan.build_inputs(), version, sm)
    engine_dir = Path(plan.engine_dir)
    with file_lock(engine_dir.parent / f".{engine_dir.name}.lock"):
        if is_cached(engine_dir, key, plan.world_size):
            say(f"engine unchanged (cache key {key[:12]}): {engine_dir}")
            return EngineBuildResult(
                str(engine_dir), True, key, version, sm, plan.world_size, time.monotonic() - started
            )
        check_replaceable(engine_dir)  # before hours of work, and again just before the swap
        _run_steps(plan, say)
        _install(plan, key, version, sm)
    say(f"engine ready: {engine_dir}")
    return EngineBuildResult(
        str(engine_dir), False, key, version, sm, plan.world_size, time.monotonic() - started
    )


def _checkpoint_with_weights(plan: EngineBuildPlan) -> Path:
    from toolkit.model.sources import check_weights

    if plan.checkpoint_dir is None:
        raise EngineBuildError(
            f"the checkpoint of {plan.model_source} is not on local disk",
            hint="build with toolkit build (it downloads the weights first)",
        )
    path = Path(plan.checkpoint_dir)
    check_weights(path, allow_pickle=False)
    return path


def _run_steps(plan: EngineBuildPlan, say: Progress) -> None:
    work = Path(plan.work_dir)
    shutil.rmtree(work, ignore_errors=True)
    (work / "logs").mkdir(parents=True)
    environments = plan.step_environment or tuple(() for _ in plan.step_names)
    for name, argv, extra in zip(plan.step_names, plan.commands, environments, strict=True):
        say(
            f"{name}: {' '.join(f'{k}={v}' for k, v in extra)}{' ' if extra else ''}{' '.join(argv)}"
        )
        env = {**os.environ, **dict(extra)} if extra else None
        run_logged(list(argv), work / "logs" / f"{name}.log", name, env)


def run_logged(argv: list[str], log_path: Path, name: str, env: dict | None = None) -> None:
    """Run one tool in its own session, output to a log file; EngineBuildError with the log tail on failure.

    The tool gets the parent-death signal (toolkit.subprocs.start_process): a `toolkit build` that is
    killed outright (SIGKILL, OOM killer) takes its trtllm-build with it; any other exit stops its group.
    """
    try:
        process = start_process(argv, log_path, env)
    except FileNotFoundError as exc:
        from toolkit.engine.tools import container_hint

        raise EngineBuildError(f"{name}: {argv[0]} not found", hint=container_hint()) from exc
    try:
        code = process.wait()
    except BaseException:
        stop_process(process, 10)
        raise
    if code != 0:
        tail = "\n".join(log_path.read_text(errors="replace").splitlines()[-_LOG_TAIL_LINES:])
        raise EngineBuildError(
            f"{name} failed with exit code {code} (log: {log_path}):\n{tail}",
            hint="read the log above; fix the input, then rebuild",
        )


def _install(plan: EngineBuildPlan, key: str, version: str, sm: str) -> None:
    """Check the new engine folder, record what built it, and swap it in for the old one."""
    work = Path(plan.work_dir)
    built = work / "engine"
    check_engine_layout(built, plan.world_size)
    shutil.move(str(work / "logs"), str(built / "logs"))
    record = {
        "cache_key": key,
        "trtllm_version": version,
        "gpu_sm": sm,
        "target": plan.target,
        "model": plan.model,
        "model_source": plan.model_source,
        "settings": plan.settings.to_dict(),
        "memory": plan.memory.to_dict(),
        "runtime": plan.runtime.to_dict(),
        "commands": [list(argv) for argv in plan.commands],
    }
    write_text_atomic(built / RECORD, json.dumps(record, indent=2) + "\n")
    engine_dir = Path(plan.engine_dir)
    check_replaceable(engine_dir)
    if engine_dir.exists():
        old = engine_dir.with_name(f".{engine_dir.name}.old")
        shutil.rmtree(old, ignore_errors=True)
        os.replace(engine_dir, old)
        shutil.rmtree(old, ignore_errors=True)
    os.replace(built, engine_dir)
    shutil.rmtree(work, ignore_errors=True)


def check_replaceable(engine_dir: Path) -> None:
    """Refuse to replace a folder this toolkit did not write: only an absent or empty folder, or an engine
    folder with our build record, may be swapped out (--engine-dir may name any folder of the user's)."""
    if not engine_dir.exists() or read_record(engine_dir) is not None:
        return
    if not engine_dir.is_dir() or any(engine_dir.iterdir()):
        raise EngineBuildError(
            f"--engine-dir {engine_dir} holds files this toolkit did not write (it has no {RECORD}); "
            "building would replace them",
            hint="pass an --engine-dir that is empty or does not exist yet (or one an earlier toolkit build "
            "wrote), or leave --engine-dir out",
        )


def check_engine_layout(engine_dir: Path, world_size: int | None = None) -> dict:
    """config.json with version / pretrained_config.mapping / build_config, and one rankN.engine per rank."""
    try:
        config = json.loads((engine_dir / "config.json").read_text())
        mapping = config["pretrained_config"]["mapping"]
        config["build_config"]["max_batch_size"]
        config["version"]
    except (FileNotFoundError, json.JSONDecodeError, KeyError, TypeError) as exc:
        raise EngineBuildError(
            f"{engine_dir} is not a TensorRT-LLM engine folder ({exc!r})", hint="rebuild the engine"
        ) from exc
    expected = world_size or mapping.get("world_size", 1)
    missing = [path.name for path in rank_engine_files(engine_dir, expected) if not path.is_file()]
    if missing:
        raise EngineBuildError(
            f"{engine_dir} lacks {', '.join(missing)}",
            hint="rebuild the engine; trtllm-build writes one file per rank",
        )
    return config
