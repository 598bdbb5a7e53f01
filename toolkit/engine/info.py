"""What a compiled engine folder is (ranks, limits, the build record), and whether this machine can serve it."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from toolkit.engine.build import check_engine_layout
from toolkit.engine.cache import read_record
from toolkit.engine.tools import container_hint, detect_gpu_sm, detect_trtllm_version
from toolkit.errors import EngineBuildError


@dataclass(frozen=True)
class EngineInfo:
    engine_dir: str
    trtllm_version: str
    tp_size: int
    pp_size: int
    world_size: int
    max_batch_size: int
    max_input_len: int | None
    max_seq_len: int | None
    max_num_tokens: int | None
    gpu_sm: str | None  # from the toolkit's build record; None for an engine built elsewhere
    record: dict | None = (
        None  # the toolkit's build record (toolkit_build.json), when it built the engine
    )

    @property
    def runtime(self) -> dict:
        """The serving settings the build planned (KV pool, reuse, chunked context, scheduler policy)."""
        if not self.record:
            raise EngineBuildError(
                f"{self.engine_dir} has no toolkit build record",
                hint="build the engine with toolkit build",
            )
        return self.record["runtime"]


def read_engine_info(engine_dir: Path) -> EngineInfo:
    config = check_engine_layout(Path(engine_dir))
    mapping = config["pretrained_config"]["mapping"]
    build = config["build_config"]
    tp, pp = int(mapping.get("tp_size", 1)), int(mapping.get("pp_size", 1))
    record = read_record(Path(engine_dir))
    return EngineInfo(
        engine_dir=str(engine_dir),
        trtllm_version=str(config["version"]),
        tp_size=tp,
        pp_size=pp,
        world_size=int(mapping.get("world_size", tp * pp)),
        max_batch_size=int(build["max_batch_size"]),
        max_input_len=build.get("max_input_len"),
        max_seq_len=build.get("max_seq_len"),
        max_num_tokens=build.get("max_num_tokens"),
        gpu_sm=(record or {}).get("gpu_sm"),
        record=record,
    )


def check_engine_compatible(
    engine_dir: Path, *, installed_version: str | None = None, gpu_sm: str | None = None
) -> EngineInfo:
    """Refuse to serve an engine this machine cannot load: no TensorRT-LLM, another version, another SM."""
    info = read_engine_info(Path(engine_dir))
    version = installed_version or detect_trtllm_version()
    if version is None:
        raise EngineBuildError(
            f"{engine_dir} is a TensorRT-LLM engine, and TensorRT-LLM is not installed here",
            hint=container_hint(),
        )
    if version != info.trtllm_version:
        raise EngineBuildError(
            f"{engine_dir} was built by TensorRT-LLM {info.trtllm_version}; this machine has {version}, which "
            "cannot load it",
            hint="rebuild it here: toolkit build --target <gpu> (an engine only loads in the TensorRT-LLM version "
            "that built it)",
        )
    sm = gpu_sm or detect_gpu_sm()
    if sm is None:
        raise EngineBuildError(f"no NVIDIA GPU found to serve {engine_dir}", hint=container_hint())
    if info.gpu_sm is not None and info.gpu_sm != sm:
        raise EngineBuildError(
            f"{engine_dir} was built for GPU SM {info.gpu_sm}; this GPU is SM {sm}",
            hint="rebuild it on this GPU: toolkit build --target <this gpu>",
        )
    return info
