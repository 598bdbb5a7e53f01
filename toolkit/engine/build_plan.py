"""plan_engine_build: a memory plan and a recipe -> the exact commands and the serving settings, nothing run."""

from __future__ import annotations

import hashlib
import json
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
from toolkit.errors import EngineBuildError
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
    check_precisions(memory)
    check_context_fits(memory, recipe)
    step_names = ("quantize" if needs_quantizer(memory) else "convert", "trtllm-build")
    engine_dir = (
        Path(output_dir).expanduser().resolve()
        if output_dir
        else default_engine_dir(
            model, memory, _engine_key(model_source, recipe, memory, step_names, gpu_sm)
        )
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
        step_names=step_names,
        runtime=runtime,
    )


def check_precisions(memory: MemoryPlan) -> None:
    """Refuse an fp8 KV cache under weights that are not fp8.

    TensorRT-LLM 0.20's trtllm-build turns paged context FMHA off for an fp8 KV cache unless the
    checkpoint's quant_algo is FP8, W4A8_AWQ or NVFP4 (tensorrt_llm/builder.py, build(): "FP8 Paged Context
    FMHA is disabled because FP8 context FMHA is disabled"); bf16 weights have none, int4-awq is W4A16_AWQ.
    Without paged context FMHA the executor turns chunked context and KV-cache block reuse off
    (cpp/tensorrt_llm/batch_manager/trtGptModelInflightBatching.cpp, fixExecutorConfig), and a prompt longer
    than max_num_tokens can no longer be chunked. Sources with revisions: tests/data/upstream/trtllm_tools.json,
    trtllm-build.builder_rules.
    """
    if memory.kv_dtype == "fp8" and memory.dtype != "fp8":
        raise EngineBuildError(
            f"--kv-dtype fp8 with --dtype {memory.dtype}: TensorRT-LLM {PINNED_TRTLLM_VERSION} builds an fp8 "
            "KV cache without paged context FMHA unless the weights are fp8, and the engine then runs "
            "without chunked context and KV-cache reuse",
            hint=f"use --kv-dtype bf16 with --dtype {memory.dtype}, or --dtype fp8 --kv-dtype fp8 "
            "(in a recipe: quantization.dtype / quantization.kv_cache_dtype)",
        )


def check_context_fits(memory: MemoryPlan, recipe: BuildRecipe) -> None:
    """Without chunked context a prompt is one step: max_num_tokens must hold max_input_len tokens.

    The executor bounds a context by max_num_tokens when context FMHA is on and chunking is off
    (trtGptModelInflightBatching.cpp: maxContextLength); longer prompts would be refused at serve time.
    """
    if not recipe.enable_chunked_context and memory.max_num_tokens < memory.max_input_len:
        raise EngineBuildError(
            f"kv_cache.enable_chunked_context is false, and max_num_tokens {memory.max_num_tokens} is less than "
            f"max_input_len {memory.max_input_len}: prompts longer than {memory.max_num_tokens} tokens could "
            "not be served",
            hint=f"set kv_cache.enable_chunked_context: true in the recipe, or pass --max-num-tokens "
            f"{memory.max_input_len} (or --max-input-len {memory.max_num_tokens})",
        )


def _commands(
    memory: MemoryPlan, recipe: BuildRecipe, model_dir: Path, work_dir: Path
) -> tuple[tuple[str, ...], ...]:
    settings = StepSettings(
        model_dir=model_dir,
        checkpoint_dir=work_dir / "checkpoint",
        engine_dir=work_dir / "engine",
        timing_cache=work_dir / "timing.cache",
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


def _engine_key(
    model_source: str,
    recipe: BuildRecipe,
    memory: MemoryPlan,
    step_names: tuple[str, ...],
    gpu_sm: str,
) -> dict:
    """Everything of the build cache key that is known before the checkpoint is downloaded."""
    return {
        "model_source": model_source,
        "recipe": recipe.build_inputs(),
        "memory": memory.to_dict(),
        "commands_shape": list(step_names),
        "trtllm": PINNED_TRTLLM_VERSION,
        "sm": gpu_sm,
    }


def default_engine_dir(model: str, memory: MemoryPlan, key: dict) -> Path:
    """$TOOLKIT_HOME/engines/<model>-<gpu>-<precisions>-<parallelism>-<digest of `key`>.

    The digest covers the limits and every other planned input, so a build with other limits gets its own
    folder instead of replacing the engine another repository points to. (Only a changed checkpoint, same
    source and settings, rebuilds a folder in place: that is the build cache's rebuild.)
    """
    slug = re.sub(r"[^a-z0-9.]+", "-", model.lower()).strip("-")
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:12]
    name = (
        f"{slug}-{memory.gpu}-{memory.dtype}-kv{memory.kv_dtype}-tp{memory.tp_size}pp{memory.pp_size}"
        f"-{digest}"
    )
    return toolkit_home() / "engines" / name
