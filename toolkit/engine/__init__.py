"""TensorRT-LLM engine compile for GPU targets: plan -> quantize/convert -> trtllm-build -> cache.

Pinned: TensorRT-LLM 0.20.0 (toolkit.engine.trtllm_flags.PINNED_TRTLLM_VERSION), container
nvcr.io/nvidia/tritonserver:25.06-trtllm-python-py3; installed versions 0.17..1.2 are accepted.

Public functions (import from toolkit.engine):

    build_gpu_command_result(model=None, target=None, *, recipe=None, dtype=None, kv_dtype=None,
                             tp=None, pp=None, max_seq_len=None, max_input_len=None,
                             max_batch_size=None, max_num_tokens=None, output_dir=None,
                             dry_run=False, progress=None) -> dict
        What `toolkit build --target h100-sxm ...` does; dict keys: dry_run, model, target,
        trtllm_version_pinned, container, engine_dir, plan, recipe, steps, commands (argv lists),
        and `result` (EngineBuildResult.to_dict()) when not a dry run.

    plan_engine_build(model=None, target=None, *, recipe=None, output_dir=None,
                      dtype=..., kv_dtype=..., tp=..., pp=..., max_seq_len=..., max_input_len=...,
                      max_batch_size=..., max_num_tokens=...) -> EngineBuildPlan
    execute_engine_build(plan, *, progress: Callable[[str], None] | None = None) -> EngineBuildResult
    engine_model_config(engine_dir, plan=None, *, engine_path=None) -> model_config_pb2.ModelConfig
        The GPU `tensorrt_llm` model; without a plan it reads the engine's toolkit_build.json.
    check_engine_compatible(engine_dir, *, installed_version=None, gpu_sm=None) -> EngineInfo
        Raises EngineBuildError: TensorRT-LLM missing (names the container), other version, other SM.
    read_engine_info(engine_dir) -> EngineInfo   (world_size, tp_size, pp_size, max_batch_size, ...)
    load_recipe(name_or_path) -> BuildRecipe; list_recipes() -> list[str]

And in toolkit.serve.mpi: mpirun_command(world_size, argv_for_rank) -> list[str],
tritonserver_rank_argv(rank, model_repository, *, tritonserver, http_port, grpc_port, metrics_port, extra).
"""

from toolkit.engine.build import EngineBuildResult, execute_engine_build
from toolkit.engine.build_plan import EngineBuildPlan, plan_engine_build
from toolkit.engine.gpu_command import build_gpu_command_result
from toolkit.engine.recipe import BuildRecipe, list_recipes, load_recipe
from toolkit.engine.triton import EngineInfo, check_engine_compatible, engine_model_config, read_engine_info

__all__ = [
    "BuildRecipe",
    "EngineBuildPlan",
    "EngineBuildResult",
    "EngineInfo",
    "build_gpu_command_result",
    "check_engine_compatible",
    "engine_model_config",
    "execute_engine_build",
    "list_recipes",
    "load_recipe",
    "plan_engine_build",
    "read_engine_info",
]
