"""plan_engine_build: a memory plan and a recipe -> the exact commands and the serving settings, nothing run."""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from toolkit.engine.commands import (
    StepSettings,
    checkpoint_argv,
    needs_quantizer,
    trtllm_build_argv,
)
from toolkit.engine.recipe import BuildRecipe
from toolkit.engine.trtllm_flags import check_argv
from toolkit.plan.memory import MemoryPlan
from toolkit.settings import toolkit_home, trtllm_tools
from toolkit.trtllm import PINNED_TRTLLM_VERSION, TRITON_TRTLLM_CONTAINER


@dataclass(frozen=True)
class EngineRuntime:
    """What the tensorrtllm backend is told at serve time (its config.pbtxt parameters), decided at build time."""

    kv_cache_tokens: int  # max_tokens_in_paged_kv_cache
    kv_cache_free_gpu_mem_fraction: float
    enable_kv_cache_reuse: bool
    enable_chunked_context: bool
    batch_scheduler_policy: str

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class EngineBuildPlan:
    model: str
    model_source: str  # the model spec's normalised source (hf:..., local:..., embedded:...)
    checkpoint_dir: (
        str | None
    )  # None until a hub model's weights are downloaded (the build does that first)
    target: str
    gpu_sm: str
    recipe: BuildRecipe
    memory: MemoryPlan
    engine_dir: str
    work_dir: str
    commands: tuple[tuple[str, ...], ...]
    step_names: tuple[str, ...]
    runtime: EngineRuntime
    trtllm_version_pinned: str = PINNED_TRTLLM_VERSION
    container: str = TRITON_TRTLLM_CONTAINER

    @property
    def world_size(self) -> int:
        return self.memory.world_size

    def build_inputs(self) -> dict:
        """The recipe values and the plan numbers that shape the engine: part of the cache key."""
        return {
            "recipe": self.recipe.build_inputs(),
            "memory": self.memory.to_dict(),
            "commands_shape": self.step_names,
        }

    def with_checkpoint(self, checkpoint_dir: Path) -> EngineBuildPlan:
        """The same plan, its commands reading this (downloaded) checkpoint folder."""
        commands = _commands(self.memory, self.recipe, Path(checkpoint_dir), Path(self.work_dir))
        return replace(self, checkpoint_dir=str(checkpoint_dir), commands=commands)

    def to_dict(self) -> dict:
        data = asdict(self)
        data["commands"] = [list(argv) for argv in self.commands]
        data["step_names"] = list(self.step_names)
        return data


def plan_engine_build(
    model: str,
    model_source: str,
    checkpoint_dir: Path | None,
    memory: MemoryPlan,
    recipe: BuildRecipe,
    *,
    gpu_sm: str,
    output_dir: str | Path | None = None,
    display_dir: str = "",
) -> EngineBuildPlan:
    """The commands that turn `checkpoint_dir` into an engine for `memory`'s GPU and limits.

    `display_dir` stands in for a checkpoint that is not downloaded yet (dry runs of hub models).
    """
    engine_dir = (
        Path(output_dir).expanduser().resolve() if output_dir else default_engine_dir(model, memory)
    )
    work_dir = engine_dir.parent / f".{engine_dir.name}.work"
    model_dir = Path(checkpoint_dir if checkpoint_dir is not None else display_dir)
    runtime = EngineRuntime(
        kv_cache_tokens=memory.kv_cache_tokens,
        kv_cache_free_gpu_mem_fraction=recipe.kv_cache_free_gpu_mem_fraction
        or memory.kv_cache_free_gpu_mem_fraction,
        enable_kv_cache_reuse=recipe.enable_kv_cache_reuse,
        enable_chunked_context=recipe.enable_chunked_context,
        batch_scheduler_policy=recipe.batch_scheduler_policy,
    )
    return EngineBuildPlan(
        model=model,
        model_source=model_source,
        checkpoint_dir=None if checkpoint_dir is None else str(checkpoint_dir),
        target=memory.gpu,
        gpu_sm=gpu_sm,
        recipe=recipe,
        memory=memory,
        engine_dir=str(engine_dir),
        work_dir=str(work_dir),
        commands=_commands(memory, recipe, model_dir, work_dir),
        step_names=("quantize" if needs_quantizer(memory) else "convert", "trtllm-build"),
        runtime=runtime,
    )


def _commands(
    memory: MemoryPlan, recipe: BuildRecipe, model_dir: Path, work_dir: Path
) -> tuple[tuple[str, ...], ...]:
    settings = StepSettings(
        model_dir=model_dir,
        checkpoint_dir=work_dir / "checkpoint",
        engine_dir=work_dir / "engine",
        calib_size=recipe.calib_size,
        awq_block_size=recipe.awq_block_size,
    )
    tools = trtllm_tools()
    commands = (
        checkpoint_argv(memory, settings, tools),
        trtllm_build_argv(memory, settings, tools),
    )
    for argv in commands:
        check_argv(argv)  # never emit a flag the pinned release would reject
    return tuple(tuple(argv) for argv in commands)


def default_engine_dir(model: str, memory: MemoryPlan) -> Path:
    slug = re.sub(r"[^a-z0-9.]+", "-", model.lower()).strip("-")
    name = f"{slug}-{memory.gpu}-{memory.dtype}-kv{memory.kv_dtype}-tp{memory.tp_size}pp{memory.pp_size}"
    return toolkit_home() / "engines" / name
