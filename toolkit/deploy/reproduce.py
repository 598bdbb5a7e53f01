"""The `toolkit build` arguments that make the same repository again, for the cluster's build Job.

Everything comes from the manifest (and, for a GPU engine, the recipe its build record holds);
the Job then checks the result's fingerprint, so an argument this misses fails the Job loudly
instead of serving something else.
"""

from __future__ import annotations

from toolkit.engine.recipe import BuildRecipe, list_recipes, load_recipe
from toolkit.errors import DeployError, RecipeError
from toolkit.repository.engines import CpuEngine, SyntheticEngine, TrtllmEngine
from toolkit.repository.limits import RepositoryLimits
from toolkit.repository.reader import Repository

NO_BUILD_HINT = (
    "pass --no-build and put the repository on the volume yourself (build it where the volume is "
    "mounted at --mount-path, e.g. in a pod), or build from hf:ORG/NAME@REV or a catalog name so the "
    "Job can download the checkpoint"
)
# Recipe settings that have no `toolkit build` flag: a build that changed them needs its recipe.
RECIPE_ONLY = (
    "batch_scheduler_policy",
    "kv_cache_free_gpu_mem_fraction",
    "enable_kv_cache_reuse",
    "enable_chunked_context",
    "calib_size",
    "awq_block_size",
)
_DEFAULT_RECIPE = BuildRecipe(name="", path="", model=None, target="")


def build_arguments(repository: Repository, engine_record: dict | None = None) -> list[str]:
    """`toolkit build` arguments (without --output / --engine-dir) that rebuild `repository`."""
    manifest = repository.manifest
    args = ["--model", model_argument(repository), "--target", manifest.target]
    engine = repository.engine
    if isinstance(engine, TrtllmEngine):
        args = _recipe_arguments(engine_record) + args + _gpu_arguments(repository)
    else:
        args += _python_arguments(repository)
    if not manifest.decoupled:
        args.append("--no-decoupled")
    return args


def model_argument(repository: Repository) -> str:
    """The --model value that downloads the same checkpoint: a pinned hub revision or the embedded model."""
    source = repository.model_source
    kind, _, value = source.partition(":")
    revision = repository.manifest.model.get("revision")
    if kind == "embedded":
        return value
    if kind == "hf":
        if not revision:
            raise DeployError(
                f"{repository.path} was built from {source} without a pinned revision; the build Job "
                "could download another one",
                hint=f"rebuild with --model hf:{value}@<commit>, or {NO_BUILD_HINT}",
            )
        return f"hf:{value}@{revision}"
    raise DeployError(
        f"{repository.path} was built from {source}, which the cluster's build Job cannot reach",
        hint=NO_BUILD_HINT,
    )


def _python_arguments(repository: Repository) -> list[str]:
    limits = repository.limits
    if limits.kv_block_size != RepositoryLimits.kv_block_size:
        raise DeployError(
            f"{repository.path} has kv_block_size {limits.kv_block_size}, which toolkit build has no flag for",
            hint=NO_BUILD_HINT,
        )
    args = _limit_arguments(
        limits, "max_batch_size", "max_input_len", "max_seq_len", "max_num_tokens"
    )
    args += _limit_arguments(limits, "max_output_len", "max_queue_size", "kv_cache_tokens")
    engine = repository.engine
    if isinstance(engine, CpuEngine):
        args += ["--num-threads", str(engine.num_threads)]
    elif isinstance(engine, SyntheticEngine):
        args += ["--step-time-ms", repr(float(engine.step_time_ms))]
    return args


def _gpu_arguments(repository: Repository) -> list[str]:
    plan = repository.memory_plan
    if plan is None:
        raise DeployError(
            f"{repository.path} is a GPU repository without a memory plan in its manifest",
            hint=f"rebuild it: {repository.rebuild_command}",
        )
    args = ["--dtype", plan.dtype, "--kv-dtype", plan.kv_dtype, "--tp", str(plan.tp_size)]
    args += ["--pp", str(plan.pp_size), "--max-seq-len", str(plan.max_seq_len)]
    args += [
        "--max-input-len",
        str(plan.max_input_len),
        "--max-batch-size",
        str(plan.max_batch_size),
    ]
    args += ["--max-num-tokens", str(plan.max_num_tokens)]
    args += ["--target-input-len", str(plan.target_input_len)]
    args += ["--target-output-len", str(plan.target_output_len)]
    return args + _limit_arguments(repository.limits, "max_output_len", "max_queue_size")


def _limit_arguments(limits: RepositoryLimits, *names: str) -> list[str]:
    args = []
    for name in names:
        args += [f"--{name.replace('_', '-')}", str(getattr(limits, name))]
    return args


def _recipe_arguments(record: dict | None) -> list[str]:
    """--recipe NAME when the engine was built from a shipped recipe whose flag-less settings it used;
    nothing when those settings are the defaults; DeployError otherwise."""
    recipe = (record or {}).get("recipe")
    if not isinstance(recipe, dict):
        raise DeployError(
            "the engine has no toolkit build record (toolkit_build.json) naming its recipe",
            hint=NO_BUILD_HINT,
        )
    used = {key: recipe.get(key) for key in RECIPE_ONLY}
    if used == {key: getattr(_DEFAULT_RECIPE, key) for key in RECIPE_ONLY}:
        return []
    name = recipe.get("name", "")
    if name in list_recipes():
        try:
            shipped = load_recipe(name)
        except RecipeError:
            shipped = None
        if shipped is not None and used == {key: getattr(shipped, key) for key in RECIPE_ONLY}:
            return ["--recipe", name]
    changed = ", ".join(f"{k}={v!r}" for k, v in used.items() if v != getattr(_DEFAULT_RECIPE, k))
    raise DeployError(
        f"the engine was built with recipe settings no toolkit build flag sets ({changed}) from "
        f"recipe {name or '?'!r}, which this toolkit does not ship",
        hint=f"add the recipe to build/, or {NO_BUILD_HINT}",
    )
