"""TensorRT-LLM engine compile for GPU targets: plan -> quantize/convert -> trtllm-build -> cache.

This layer compiles; it knows nothing of Triton repositories (toolkit.repository packages an engine,
toolkit.build drives both). Pinned release: toolkit.engine.trtllm_flags.PINNED_TRTLLM_VERSION.

    plan_engine_build(model, model_source, checkpoint_dir, memory, recipe, *, gpu_sm, output_dir=None)
        -> EngineBuildPlan   (commands, step names, serving runtime settings; nothing run)
    execute_engine_build(plan, *, progress=None) -> EngineBuildResult   (cached when inputs are unchanged)
    read_engine_info(engine_dir) -> EngineInfo   (world_size, limits, the build record)
    check_engine_compatible(engine_dir) -> EngineInfo   (EngineBuildError: no TensorRT-LLM, other version, other SM)
    load_recipe(name_or_path) -> BuildRecipe; list_recipes() -> list[str]
"""

from toolkit.engine.build import EngineBuildResult, execute_engine_build
from toolkit.engine.build_plan import EngineBuildPlan, EngineRuntime, plan_engine_build
from toolkit.engine.info import EngineInfo, check_engine_compatible, read_engine_info
from toolkit.engine.recipe import BuildRecipe, list_recipes, load_recipe

__all__ = [
    "BuildRecipe",
    "EngineBuildPlan",
    "EngineBuildResult",
    "EngineInfo",
    "EngineRuntime",
    "check_engine_compatible",
    "execute_engine_build",
    "list_recipes",
    "load_recipe",
    "plan_engine_build",
    "read_engine_info",
]
