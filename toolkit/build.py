"""`toolkit build` as a library call: one entry point for every target (cpu, synthetic, GPUs).

    plan_build(request) -> BuildPlan             what would be built; nothing is written (--dry-run)
    build_repository(request, progress) -> BuildResult

GPU targets: plan memory -> download the checkpoint -> compile the engine (toolkit.engine) ->
package it (toolkit.repository). cpu and synthetic: the Python engines, packaged the same way.
A recipe (build/*.yaml) names its model and target; flags given here beat the recipe's values.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields, replace
from pathlib import Path

from toolkit.engine.build import EngineBuildResult, execute_engine_build
from toolkit.engine.build_plan import EngineBuildPlan, plan_engine_build
from toolkit.engine.info import read_engine_info
from toolkit.engine.recipe import (
    PYTHON_TARGETS,
    TARGETS,
    BuildRecipe,
    command_line_recipe,
    load_recipe,
)
from toolkit.errors import RecipeError
from toolkit.model.sources import ResolvedModel, resolve_model
from toolkit.model.spec import EMBEDDED_DEFAULT, ModelSpec, parse_model_spec
from toolkit.plan.gpus import get_gpu
from toolkit.plan.memory import MemoryPlan, plan_memory
from toolkit.plan.source import load_model_for_plan
from toolkit.repository.engines import CpuEngine, EngineSpec, SyntheticEngine, TrtllmEngine
from toolkit.repository.limits import RepositoryLimits
from toolkit.repository.writer import (
    RepositoryResult,
    check_output_folder,
    plan_repository,
    write_repository,
)

Progress = Callable[[str], None]
_GPU_ONLY = ("dtype", "kv_dtype", "tp", "pp", "engine_dir", "target_input_len", "target_output_len")
_LIMIT_FIELDS = (
    "max_batch_size",
    "max_input_len",
    "max_output_len",
    "max_seq_len",
    "max_num_tokens",
    "max_queue_size",
    "kv_cache_tokens",
)


@dataclass(frozen=True)
class BuildRequest:
    """What `toolkit build` was asked; None means: from the recipe, else the planner's or the target's default."""

    output: Path = Path("model_repository")
    model: str | None = None
    target: str | None = None
    recipe: str | None = None
    dtype: str | None = None
    kv_dtype: str | None = None
    tp: int | None = None
    pp: int | None = None
    max_batch_size: int | None = None
    max_input_len: int | None = None
    max_output_len: int | None = None
    max_seq_len: int | None = None
    max_num_tokens: int | None = None
    max_queue_size: int | None = None
    target_input_len: int | None = None
    target_output_len: int | None = None
    kv_cache_tokens: int | None = None
    num_threads: int | None = None
    step_time_ms: float | None = None
    engine_dir: Path | None = None
    decoupled: bool = True
    allow_pickle: bool = False
    discard_changes: bool = (
        False  # rebuild over a repository whose files were changed since its build
    )


@dataclass(frozen=True)
class BuildPlan:
    request: BuildRequest
    recipe: BuildRecipe  # the recipe with the request's flags applied
    model: ModelSpec
    limits: RepositoryLimits
    engine: EngineSpec | None  # cpu / synthetic; a GPU engine is known once compiled
    memory: MemoryPlan | None = None  # GPU targets
    engine_build: EngineBuildPlan | None = None  # GPU targets

    @property
    def target(self) -> str:
        return self.recipe.target

    def to_dict(self) -> dict:
        data = {
            "output": str(Path(self.request.output).resolve()),
            "target": self.target,
            "model": self.model.source,
            "recipe": self.recipe.name,
            "limits": self.limits.to_dict(),
            "decoupled": self.request.decoupled,
        }
        if self.engine is not None:
            data["engine"] = self.engine.describe()
        if self.engine_build is not None:
            build = self.engine_build
            data.update(
                {
                    "plan": self.memory.to_dict(),
                    "engine_dir": build.engine_dir,
                    "steps": list(build.step_names),
                    "commands": [list(argv) for argv in build.commands],
                    "runtime": build.runtime.to_dict(),
                    "checkpoint_dir": build.checkpoint_dir,
                    "trtllm_version_pinned": build.trtllm_version_pinned,
                    "container": build.container,
                }
            )
        return data


@dataclass(frozen=True)
class BuildResult:
    plan: BuildPlan
    model: ResolvedModel
    repository: RepositoryResult
    engine_plan: EngineBuildPlan | None = (
        None  # as run: its commands read the downloaded checkpoint
    )
    engine: EngineBuildResult | None = None

    def to_dict(self) -> dict:
        data = self.plan.to_dict()
        data.update(
            {
                "model": self.model.source,
                "revision": self.model.revision,
                "path": str(self.repository.path),
                "skipped": self.repository.skipped,
                "build_key": self.repository.key,
            }
        )
        if self.engine_plan is not None:
            data.update(
                {
                    "commands": [list(argv) for argv in self.engine_plan.commands],
                    "checkpoint_dir": self.engine_plan.checkpoint_dir,
                    "engine_build": self.engine.to_dict(),
                }
            )
        return data


def plan_build(request: BuildRequest) -> BuildPlan:
    """Merge the recipe and the flags, check them, and plan what would be built (no download, no write)."""
    recipe = _merged_recipe(request)
    model = parse_model_spec(recipe.model or EMBEDDED_DEFAULT)
    if recipe.target in PYTHON_TARGETS:
        return _plan_python(request, recipe, model)
    return _plan_gpu(request, recipe, model)


def build_repository(
    request: BuildRequest, progress: Progress = lambda _: None, *, bars: bool = False
) -> BuildResult:
    """Build (or, when nothing changed, keep) the repository at request.output.

    `progress` gets one line per step; `bars` turns on download and conversion progress bars (terminals).
    """
    plan = plan_build(request)
    check_output_folder(request.output, discard_changes=request.discard_changes)
    progress(f"model {plan.model.source}")
    model = resolve_model(plan.model, allow_pickle=request.allow_pickle, progress=bars)
    engine, engine_plan, engine_result = plan.engine, None, None
    if plan.engine_build is not None:
        engine_plan = plan.engine_build.with_checkpoint(model.path)
        engine_result = execute_engine_build(engine_plan, progress=progress)
        engine = TrtllmEngine.from_engine(
            plan.target, read_engine_info(Path(engine_result.engine_dir))
        )
    memory = plan.memory.to_dict() if plan.memory is not None else None
    repo_plan = plan_repository(
        model, engine, request.output, plan.limits, memory_plan=memory, decoupled=request.decoupled
    )
    repository = write_repository(
        repo_plan,
        progress=lambda step: progress(f"writing {step}"),
        discard_changes=request.discard_changes,
    )
    return BuildResult(plan, model, repository, engine_plan, engine_result)


# --- planning ---------------------------------------------------------------------------------
def _merged_recipe(request: BuildRequest) -> BuildRecipe:
    if request.recipe is not None:
        recipe = load_recipe(request.recipe)
    else:
        recipe = command_line_recipe(request.model, request.target or "cpu")
    if request.target is not None and request.target not in TARGETS:
        raise RecipeError(
            f"unknown --target {request.target!r}", hint=f"use one of: {', '.join(TARGETS)}"
        )
    overrides = {
        f.name: getattr(request, f.name) for f in fields(BuildRecipe) if hasattr(request, f.name)
    }
    overrides = {k: v for k, v in overrides.items() if v is not None and k not in ("name", "path")}
    merged = replace(recipe, **overrides)
    if merged.target in PYTHON_TARGETS:
        given = [
            f"--{name.replace('_', '-')}"
            for name in _GPU_ONLY
            if getattr(request, name) is not None
        ]
        if given:
            raise RecipeError(
                f"{', '.join(given)} only {'applies' if len(given) == 1 else 'apply'} to GPU targets, not --target "
                f"{merged.target}",
                hint="drop it, or build for a GPU target (--target h100-sxm)",
            )
    return merged


def _plan_python(request: BuildRequest, recipe: BuildRecipe, model: ModelSpec) -> BuildPlan:
    limits = RepositoryLimits().overridden(
        **{name: getattr(recipe, name) for name in _LIMIT_FIELDS}
    )
    if recipe.target == "cpu":
        engine: EngineSpec = CpuEngine(num_threads=recipe.num_threads or 0)
    else:
        engine = SyntheticEngine(step_time_ms=recipe.step_time_ms or 0.0)
    return BuildPlan(request, recipe, model, limits, engine)


def _plan_gpu(request: BuildRequest, recipe: BuildRecipe, model: ModelSpec) -> BuildPlan:
    planned = load_model_for_plan(model)
    gpu = get_gpu(recipe.target)
    memory = plan_memory(
        planned.facts,
        gpu,
        model=planned.name,
        dtype=recipe.dtype or "bf16",
        kv_dtype=recipe.kv_dtype or "bf16",
        tp=recipe.tp,
        pp=recipe.pp,
        max_seq_len=recipe.max_seq_len,
        max_input_len=recipe.max_input_len,
        max_batch_size=recipe.max_batch_size,
        max_num_tokens=recipe.max_num_tokens,
        target_input_len=recipe.target_input_len,
        target_output_len=recipe.target_output_len,
    )
    engine_build = plan_engine_build(
        planned.name,
        model.source,
        planned.checkpoint_dir,
        memory,
        recipe,
        gpu_sm=gpu.sm,
        output_dir=request.engine_dir,
        display_dir=_display_checkpoint(model),
    )
    limits = RepositoryLimits.from_memory_plan(
        memory, max_output_len=recipe.max_output_len, max_queue_size=recipe.max_queue_size
    )
    return BuildPlan(request, recipe, model, limits, None, memory, engine_build)


def _display_checkpoint(model: ModelSpec) -> str:
    """Where a hub checkpoint will be once downloaded (dry runs show the commands with this folder)."""
    if model.kind == "local":
        return model.value
    from huggingface_hub import constants

    repo_id = model.value
    if model.kind == "catalog":
        from toolkit.model.catalog import catalog_entry

        repo_id = catalog_entry(model.value).hub_id
    folder = Path(constants.HF_HUB_CACHE) / f"models--{repo_id.replace('/', '--')}" / "snapshots"
    return str(folder / (model.revision or "<commit of main, resolved at build time>"))
