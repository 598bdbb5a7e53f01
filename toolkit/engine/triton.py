"""The GPU `tensorrt_llm` model (backend tensorrtllm) and the pre-flight checks before serving an engine."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from tritonclient.grpc import model_config_pb2 as mc

from toolkit.engine.build import check_engine_layout, engine_record
from toolkit.engine.build_plan import EngineBuildPlan
from toolkit.engine.tools import container_hint, detect_gpu_sm, detect_trtllm_version
from toolkit.errors import EngineBuildError
from toolkit.repository import contract as c
from toolkit.repository.configs import set_parameters, tensor_inputs, tensor_outputs


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


def read_engine_info(engine_dir: Path) -> EngineInfo:
    config = check_engine_layout(Path(engine_dir))
    mapping = config["pretrained_config"]["mapping"]
    build = config["build_config"]
    tp, pp = int(mapping.get("tp_size", 1)), int(mapping.get("pp_size", 1))
    record = engine_record(Path(engine_dir)) or {}
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
        gpu_sm=record.get("gpu_sm"),
    )


def check_engine_compatible(engine_dir: Path, *, installed_version: str | None = None, gpu_sm: str | None = None) -> EngineInfo:
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
            f"{engine_dir} was built by TensorRT-LLM {info.trtllm_version}; this machine has {version}, which cannot load it",
            hint="rebuild it here: toolkit build --target <gpu> (an engine only loads in the TensorRT-LLM version that built it)",
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


def engine_parameters(engine_dir: Path, plan: EngineBuildPlan | None = None, *, engine_path: str | None = None) -> dict:
    """The tensorrt_llm model's parameters, from the plan (or the engine's build record)."""
    record = engine_record(Path(engine_dir)) or {}
    if plan is not None:
        memory, recipe, fraction = plan.memory.to_dict(), plan.recipe.to_dict(), plan.kv_cache_free_gpu_mem_fraction
    elif record:
        memory, recipe, fraction = record["memory"], record["recipe"], record["kv_cache_free_gpu_mem_fraction"]
    else:
        raise EngineBuildError(f"{engine_dir} has no toolkit build record and no plan was given", hint="build the engine with toolkit build")
    return {
        "gpt_model_type": "inflight_fused_batching",
        "gpt_model_path": engine_path or str(Path(engine_dir).resolve()),
        "max_beam_width": 1,
        # Both bounds: the runtime uses the smaller of the token count and the free-memory share.
        "max_tokens_in_paged_kv_cache": memory["kv_cache_tokens"],
        "kv_cache_free_gpu_mem_fraction": fraction,
        "enable_kv_cache_reuse": recipe["enable_kv_cache_reuse"],
        "enable_chunked_context": recipe["enable_chunked_context"],
        "batch_scheduler_policy": recipe["batch_scheduler_policy"],
        "exclude_input_in_output": True,
    }


def engine_model_config(engine_dir: Path, plan: EngineBuildPlan | None = None, *, engine_path: str | None = None) -> mc.ModelConfig:
    """config.pbtxt of `tensorrt_llm` for a compiled engine; max_batch_size comes from the engine's own config.json."""
    info = read_engine_info(Path(engine_dir))
    config = mc.ModelConfig(name=c.ENGINE, backend="tensorrtllm", max_batch_size=info.max_batch_size)
    config.input.extend(tensor_inputs(c.ENGINE_INPUTS))
    config.output.extend(tensor_outputs(c.ENGINE_OUTPUTS))
    config.model_transaction_policy.decoupled = True
    config.dynamic_batching.preferred_batch_size.append(info.max_batch_size)
    config.instance_group.append(mc.ModelInstanceGroup(count=1, kind=mc.ModelInstanceGroup.KIND_CPU))
    set_parameters(config, engine_parameters(Path(engine_dir), plan, engine_path=engine_path))
    return config
