"""TensorRT-LLM engine compile for GPU targets: plan -> quantize/convert -> trtllm-build -> cache.

This layer compiles; it knows nothing of Triton repositories (toolkit.repository packages an engine,
toolkit.targets.gpu drives both). Pinned release: toolkit.trtllm.PINNED_TRTLLM_VERSION.

    plan_engine_build(model, model_source, checkpoint_dir, memory, settings, *, gpu_sm, output_dir=None)
        -> EngineBuildPlan   (commands, step names, serving runtime settings; nothing run)
    execute_engine_build(plan, *, progress=None) -> EngineBuildResult   (cached when inputs are unchanged)
    read_engine_info(engine_dir) -> EngineInfo   (world_size, limits, the build record)
    check_engine_compatible(engine_dir) -> EngineInfo   (EngineBuildError: no TensorRT-LLM, other version, other SM)
"""

from toolkit.engine.build import EngineBuildResult, execute_engine_build
from toolkit.engine.build_plan import EngineBuildPlan, EngineRuntime, plan_engine_build
from toolkit.engine.info import EngineInfo, check_engine_compatible, read_engine_info

__all__ = [
    "EngineBuildPlan",
    "EngineBuildResult",
    "EngineInfo",
    "EngineRuntime",
    "check_engine_compatible",
    "execute_engine_build",
    "plan_engine_build",
    "read_engine_info",
]
