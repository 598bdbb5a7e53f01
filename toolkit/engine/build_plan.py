"""plan_engine_build: a recipe and flags -> the memory plan and the exact commands, nothing run."""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass
from pathlib import Path

from toolkit.engine.commands import StepSettings, checkpoint_argv, needs_quantizer, trtllm_build_argv
from toolkit.engine.recipe import CPU_TARGET, BuildRecipe, load_recipe
from toolkit.engine.tools import tool_paths
from toolkit.engine.trtllm_flags import PINNED_TRTLLM_VERSION, TRITON_TRTLLM_CONTAINER, check_argv
from toolkit.errors import EngineBuildError
from toolkit.plan.gpus import get_gpu
from toolkit.plan.memory import MemoryPlan, plan_memory
from toolkit.plan.source import load_model_for_plan
from toolkit.settings import toolkit_home

_OVERRIDES = ("dtype", "kv_dtype", "tp", "pp", "max_seq_len", "max_input_len", "max_batch_size", "max_num_tokens")


@dataclass(frozen=True)
class EngineBuildPlan:
    model: str
    model_source: str  # the --model value, resolved again (with weights) when the build runs
    checkpoint_dir: str
    target: str
    gpu_sm: str
    recipe: BuildRecipe
    memory: MemoryPlan
    engine_dir: str
    work_dir: str
    commands: tuple[tuple[str, ...], ...]
    step_names: tuple[str, ...]
    kv_cache_free_gpu_mem_fraction: float
    trtllm_version_pinned: str = PINNED_TRTLLM_VERSION
    container: str = TRITON_TRTLLM_CONTAINER

    @property
    def world_size(self) -> int:
        return self.memory.world_size

    def build_inputs(self) -> dict:
        """The recipe values and the plan numbers that shape the engine: part of the cache key."""
        return {"recipe": self.recipe.build_inputs(), "memory": self.memory.to_dict(), "commands_shape": self.step_names}

    def to_dict(self) -> dict:
        data = asdict(self)
        data["commands"] = [list(argv) for argv in self.commands]
        data["step_names"] = list(self.step_names)
        return data


def plan_engine_build(
    model: str | None = None,
    target: str | None = None,
    *,
    recipe: str | Path | BuildRecipe | None = None,
    output_dir: str | Path | None = None,
    **overrides,
) -> EngineBuildPlan:
    """Plan a TensorRT-LLM engine build; explicit overrides (dtype, kv_dtype, tp, pp, max_*) beat the recipe."""
    unknown = set(overrides) - set(_OVERRIDES)
    if unknown:
        raise TypeError(f"unknown options: {sorted(unknown)}")
    base = _base_recipe(recipe, model, target)
    chosen = {k: v for k, v in overrides.items() if v is not None}
    rec = BuildRecipe(**{**base.to_dict(), **chosen, **({"model": model} if model else {}), **({"target": target} if target else {})})
    if rec.target == CPU_TARGET:
        raise EngineBuildError("the cpu target does not use TensorRT-LLM", hint="build it with `toolkit build --target cpu`")
    gpu = get_gpu(rec.target)
    source = load_model_for_plan(rec.model)
    memory = plan_memory(
        source.facts, gpu, model=source.name, dtype=rec.dtype, kv_dtype=rec.kv_dtype, tp=rec.tp, pp=rec.pp,
        max_seq_len=rec.max_seq_len, max_input_len=rec.max_input_len,
        max_batch_size=rec.max_batch_size, max_num_tokens=rec.max_num_tokens,
    )
    engine_dir = Path(output_dir).expanduser().resolve() if output_dir else _default_engine_dir(source.name, memory)
    work_dir = engine_dir.parent / f".{engine_dir.name}.work"
    settings = StepSettings(
        model_dir=source.checkpoint_dir, checkpoint_dir=work_dir / "checkpoint", engine_dir=work_dir / "engine",
        calib_size=rec.calib_size, awq_block_size=rec.awq_block_size,
    )
    tools = tool_paths()
    commands = (checkpoint_argv(memory, settings, tools), trtllm_build_argv(memory, settings, tools))
    for argv in commands:
        check_argv(argv)  # never emit a flag the pinned release would reject
    return EngineBuildPlan(
        model=source.name,
        model_source=rec.model,
        checkpoint_dir=str(source.checkpoint_dir),
        target=gpu.name,
        gpu_sm=gpu.sm,
        recipe=rec,
        memory=memory,
        engine_dir=str(engine_dir),
        work_dir=str(work_dir),
        commands=tuple(tuple(argv) for argv in commands),
        step_names=("quantize" if needs_quantizer(memory) else "convert", "trtllm-build"),
        kv_cache_free_gpu_mem_fraction=rec.kv_cache_free_gpu_mem_fraction or memory.kv_cache_free_gpu_mem_fraction,
    )


def _base_recipe(recipe: str | Path | BuildRecipe | None, model: str | None, target: str | None) -> BuildRecipe:
    if isinstance(recipe, BuildRecipe):
        return recipe
    if recipe is not None:
        return load_recipe(recipe)
    if not model or not target:
        raise EngineBuildError("a GPU build needs --model and --target, or --recipe", hint="e.g. --recipe llama-3.1-8b-instruct-h100-sxm-fp8")
    return BuildRecipe(name="command-line", path="", model=model, target=target)


def _default_engine_dir(model: str, memory: MemoryPlan) -> Path:
    slug = re.sub(r"[^a-z0-9.]+", "-", model.lower()).strip("-")
    name = f"{slug}-{memory.gpu}-{memory.dtype}-kv{memory.kv_dtype}-tp{memory.tp_size}pp{memory.pp_size}"
    return toolkit_home() / "engines" / name
