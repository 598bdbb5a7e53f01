"""`toolkit build` as a library call: one entry point for every target (cpu, synthetic, GPUs).

    plan_build(request) -> BuildPlan             what would be built; nothing is written (--dry-run)
    build_repository(request, progress) -> BuildResult

The target (toolkit.targets) plans and builds its engine: GPU targets plan memory, download the
checkpoint and compile the engine (toolkit.engine); cpu and synthetic use the Python engines. Then
the repository is packaged the same way for all (toolkit.repository). A recipe (build/*.yaml) names
its model and target; settings given here beat the recipe's values.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from toolkit.build_settings import SETTINGS, BuildSettings, Setting
from toolkit.model.sources import ResolvedModel, resolve_model
from toolkit.model.spec import EMBEDDED_DEFAULT, ModelSpec, parse_model_spec
from toolkit.recipes import BuildRecipe, command_line_recipe, load_recipe
from toolkit.repository.writer import (
    RepositoryPlan,
    RepositoryResult,
    check_output_folder,
    plan_repository,
    write_repository,
)
from toolkit.targets import DEFAULT_TARGET, Target, TargetPlan, get_target

Progress = Callable[[str], None]


@dataclass(frozen=True)
class BuildRequest:
    """What `toolkit build` was asked; a setting left None comes from the recipe, else the planner's or
    the target's default."""

    output: Path = Path("model_repository")
    model: str | None = None
    target: str | None = None
    recipe: str | None = None
    settings: BuildSettings = field(default_factory=BuildSettings)
    allow_pickle: bool = False
    # Rebuild over a repository whose files were changed since its build.
    discard_changes: bool = False

    @classmethod
    def make(cls, **values: Any) -> BuildRequest:
        """A request from keyword arguments, the build settings among them (`tp=2`, `decoupled=False`)."""
        settings = {k: values.pop(k) for k in list(values) if k in SETTINGS}
        return cls(settings=BuildSettings(**settings), **values)


@dataclass(frozen=True)
class BuildPlan:
    request: BuildRequest
    recipe: BuildRecipe  # the recipe with the request's settings applied
    model: ModelSpec
    target: Target
    planned: TargetPlan

    def to_dict(self) -> dict[str, Any]:
        return {
            "output": str(Path(self.request.output).resolve()),
            "target": self.target.name,
            "model": self.model.source,
            "recipe": self.recipe.name,
            **self.planned.to_dict(),
            **self.target.dry_run_details(self.planned, Path(self.request.output)),
        }


@dataclass(frozen=True)
class BuildResult:
    plan: BuildPlan
    model: ResolvedModel
    repository: RepositoryResult
    built: Any = None  # what the target's engine build ran (GPU: its plan as run and its result)

    def to_dict(self) -> dict[str, Any]:
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
        if self.built is not None:
            engine_plan, result = self.built
            data.update(
                {
                    "commands": [list(argv) for argv in engine_plan.commands],
                    "checkpoint_dir": engine_plan.checkpoint_dir,
                    "engine_build": result.to_dict(),
                }
            )
        return data


def plan_build(request: BuildRequest) -> BuildPlan:
    """Merge the recipe and the settings, check them, and plan what would be built (no download, no write)."""
    recipe = _merged_recipe(request)
    target = get_target(recipe.target)
    model = parse_model_spec(recipe.model or EMBEDDED_DEFAULT)
    return BuildPlan(request, recipe, model, target, target.plan(recipe.settings, model))


def build_repository(
    request: BuildRequest, progress: Progress = lambda _: None, *, bars: bool = False
) -> BuildResult:
    """Build (or, when nothing changed, keep) the repository at request.output.

    `progress` gets one line per step; `bars` turns on download and conversion progress bars (terminals).
    """
    plan = plan_build(request)
    check_output_folder(request.output, discard_changes=request.discard_changes)
    plan.target.preflight_build(plan.planned)  # before any download: a GPU build needs its tools
    progress(f"model {plan.model.source}")
    model = resolve_model(plan.model, allow_pickle=request.allow_pickle, progress=bars)
    repo_plan, built = _package(plan.target, plan.planned, model, request.output, progress)
    repository = write_repository(
        repo_plan,
        progress=lambda step: progress(f"writing {step}"),
        discard_changes=request.discard_changes,
    )
    return BuildResult(plan, model, repository, built)


def plan_local_repository(
    model: ResolvedModel,
    output: Path,
    target: str = DEFAULT_TARGET,
    settings: BuildSettings | None = None,
    progress: Progress = lambda _: None,
) -> RepositoryPlan:
    """What `build_repository` would write for a checkpoint already on disk (`model`), with these
    settings and no recipe: for benchmarks and tests that make their own checkpoints."""
    chosen = get_target(target)
    settings = settings or BuildSettings()
    chosen.check_settings(settings, lambda row: row.flag)
    planned = chosen.plan(settings, parse_model_spec(str(model.path)))
    return _package(chosen, planned, model, output, progress)[0]


def _package(
    target: Target, planned: TargetPlan, model: ResolvedModel, output: Path, progress: Progress
) -> tuple[RepositoryPlan, Any]:
    """Build the target's engine for `model` and plan the repository around it."""
    engine, built = target.build_engine(planned, model, progress)
    repo_plan = plan_repository(
        model,
        engine,
        output,
        planned.limits,
        target=target.name,
        settings=planned.settings,
        capabilities=planned.capabilities,
        memory_plan=planned.memory,
        adapters=planned.adapters,
    )
    return repo_plan, built


def _merged_recipe(request: BuildRequest) -> BuildRecipe:
    """The recipe (or the command line's), the request's settings over it, checked for its target."""
    if request.recipe is not None:
        recipe = load_recipe(request.recipe)
    else:
        recipe = command_line_recipe(request.model, request.target or DEFAULT_TARGET)
    target = get_target(request.target or recipe.target)
    merged = recipe.overridden(request.model, target.name, request.settings)
    target.check_settings(merged.settings, lambda row: _named(row, recipe, request.settings))
    return merged


def _named(row: Setting, recipe: BuildRecipe, given: BuildSettings) -> str:
    """How the user gave a setting: its flag, or the recipe key in the recipe's file."""
    if getattr(given, row.name) is None and recipe.path and row.recipe_key:
        return f"{row.recipe_key} in {recipe.path}"
    return row.flag
