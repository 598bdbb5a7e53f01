"""plan_engine_build: a memory plan and the build settings -> the exact commands and the serving settings,
nothing run."""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from toolkit.build_settings import BuildSettings
from toolkit.engine.calibration import OFFLINE_ENVIRONMENT, CalibrationPlan, plan_calibration
from toolkit.engine.commands import (
    StepSettings,
    checkpoint_argv,
    needs_quantizer,
    trtllm_build_argv,
)
from toolkit.engine.fusions import check_fusions, chosen_fusions
from toolkit.engine.trtllm_flags import check_argv
from toolkit.errors import EngineBuildError
from toolkit.plan.lora import LoraEngine
from toolkit.plan.memory import MemoryPlan
from toolkit.settings import toolkit_home, trtllm_tools
from toolkit.trtllm import PINNED_TRTLLM_VERSION, TRITON_TRTLLM_CONTAINER

# What a setting left unset becomes (toolkit.build_settings shows these in its help).
DEFAULT_CALIB_SIZE = 512
DEFAULT_AWQ_BLOCK_SIZE = 128
DEFAULT_BATCH_SCHEDULER_POLICY = "max_utilization"
# Settings that do not shape the engine's bytes: left out of its cache key.
# The adapters themselves neither: the engine is built for their modules and rank (its `lora` input), and
# they are converted into each repository, so adding one to a build that has room keeps the engine.
_NOT_ENGINE_INPUTS = ("engine_dir", "decoupled", "lora")


@dataclass(frozen=True)
class EngineRuntime:
    """What the tensorrtllm backend is told at serve time (its config.pbtxt parameters), decided at build time."""

    kv_cache_free_gpu_mem_fraction: float
    enable_kv_cache_reuse: bool
    enable_chunked_context: bool
    batch_scheduler_policy: str
    # None: no cap, the runtime takes kv_cache_free_gpu_mem_fraction of its free memory (the backend
    # otherwise takes the smaller of the two: a planned cap would bound the pool twice).
    max_tokens_in_paged_kv_cache: int | None = None
    # Per layer, the tokens it attends to (sliding windows); (): every layer attends to max_seq_len.
    max_attention_window_size: tuple[int, ...] = ()

    def to_dict(self) -> dict:
        data = asdict(self)
        data["max_attention_window_size"] = list(
            self.max_attention_window_size
        )  # as JSON gives it back
        return data


@dataclass(frozen=True)
class EngineBuildPlan:
    model: str
    model_source: str  # the model spec's normalised source (hf:..., local:..., embedded:...)
    # None until a hub model's weights are downloaded (the build does that first)
    checkpoint_dir: str | None
    target: str
    gpu_sm: str
    settings: BuildSettings  # as given (the recipe's and the flags')
    memory: MemoryPlan
    engine_dir: str
    work_dir: str
    commands: tuple[tuple[str, ...], ...]
    step_names: tuple[str, ...]
    runtime: EngineRuntime
    steps: StepSettings
    trtllm_version_pinned: str = PINNED_TRTLLM_VERSION
    container: str = TRITON_TRTLLM_CONTAINER
    calibration: CalibrationPlan | None = None  # fp8 / int4-awq builds
    # Per step, the environment variables it runs with besides ours (name, value).
    step_environment: tuple[tuple[tuple[str, str], ...], ...] = ()

    @property
    def gpus(self) -> int:
        """GPUs the build machine needs: the engine's ranks, or more for calibration."""
        return max(self.world_size, self.calibration.gpus if self.calibration else 1)

    @property
    def world_size(self) -> int:
        return self.memory.world_size

    def build_inputs(self) -> dict:
        """The settings and the plan numbers that shape the engine: part of the cache key."""
        return {
            "settings": engine_inputs(self.settings),
            "memory": self.memory.to_dict(),
            "commands_shape": self.step_names,
            # only with LoRA: the keys of engines built before it stay as they were
            **({"lora": self.steps.lora.to_dict()} if self.steps.lora is not None else {}),
        }

    def with_checkpoint(self, checkpoint_dir: Path) -> EngineBuildPlan:
        """The same plan, its commands reading this (downloaded) checkpoint folder."""
        steps = replace(self.steps, model_dir=Path(checkpoint_dir))
        return replace(
            self,
            checkpoint_dir=str(checkpoint_dir),
            steps=steps,
            commands=_commands(self.memory, steps),
        )


def engine_inputs(settings: BuildSettings) -> dict:
    return {k: v for k, v in settings.to_dict().items() if k not in _NOT_ENGINE_INPUTS}


def plan_engine_build(
    model: str,
    model_source: str,
    checkpoint_dir: Path | None,
    memory: MemoryPlan,
    settings: BuildSettings,
    *,
    gpu_sm: str,
    output_dir: str | Path | None = None,
    display_dir: str = "",
    lora: LoraEngine | None = None,
) -> EngineBuildPlan:
    """The commands that turn `checkpoint_dir` into an engine for `memory`'s GPU and limits.

    `display_dir` stands in for a checkpoint that is not downloaded yet (dry runs of hub models).
    """
    runtime = EngineRuntime(
        kv_cache_free_gpu_mem_fraction=memory.kv_cache_free_gpu_mem_fraction,
        enable_kv_cache_reuse=_on(settings.enable_kv_cache_reuse),
        enable_chunked_context=_on(settings.enable_chunked_context),
        batch_scheduler_policy=settings.batch_scheduler_policy or DEFAULT_BATCH_SCHEDULER_POLICY,
        max_attention_window_size=tuple(memory.max_attention_window_size),
    )
    check_precisions(memory)
    check_expert_parallel(memory, settings.moe_ep_size or 1)
    check_context_fits(memory, runtime)
    check_fusions(memory, settings, gpu_sm)
    calibration = plan_calibration(memory, settings)
    step_names = ("quantize" if needs_quantizer(memory) else "convert", "trtllm-build")
    engine_dir = (
        Path(output_dir).expanduser().resolve()
        if output_dir
        else default_engine_dir(
            model, memory, _engine_key(model_source, settings, memory, step_names, gpu_sm, lora)
        )
    )
    work_dir = engine_dir.parent / f".{engine_dir.name}.work"
    steps = StepSettings(
        model_dir=Path(checkpoint_dir if checkpoint_dir is not None else display_dir),
        checkpoint_dir=work_dir / "checkpoint",
        engine_dir=work_dir / "engine",
        timing_cache=work_dir / "timing.cache",
        calib_size=settings.calib_size or DEFAULT_CALIB_SIZE,
        awq_block_size=settings.awq_block_size or DEFAULT_AWQ_BLOCK_SIZE,
        moe_ep_size=settings.moe_ep_size or 1,
        fusions=chosen_fusions(settings),
        calib_dataset=Path(calibration.dataset) if calibration and calibration.offline else None,
        gather_generation_logits=bool(settings.gather_generation_logits),
        lora=lora,
    )
    offline = calibration is not None and calibration.offline
    environment = tuple(
        OFFLINE_ENVIRONMENT if offline and name == "quantize" else () for name in step_names
    )
    return EngineBuildPlan(
        model=model,
        model_source=model_source,
        checkpoint_dir=None if checkpoint_dir is None else str(checkpoint_dir),
        target=memory.gpu,
        gpu_sm=gpu_sm,
        settings=settings,
        memory=memory,
        engine_dir=str(engine_dir),
        work_dir=str(work_dir),
        commands=_commands(memory, steps),
        step_names=step_names,
        runtime=runtime,
        steps=steps,
        calibration=calibration,
        step_environment=environment,
    )


def _on(value: bool | None) -> bool:
    return True if value is None else value


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


def check_expert_parallel(memory: MemoryPlan, ep: int) -> None:
    """--moe-ep-size splits the TP ranks: moe_tp_size x moe_ep_size must equal tp_size (the converters
    assert it), and only a mixture-of-experts model has experts to split."""
    if ep == 1:
        return
    if not memory.num_experts:
        raise EngineBuildError(
            f"--moe-ep-size {ep}: {memory.model} is a dense model, it has no experts to place",
            hint="drop --moe-ep-size (parallelism.moe_ep in a recipe)",
        )
    if memory.tp_size % ep or memory.num_experts % ep:
        raise EngineBuildError(
            f"--moe-ep-size {ep} does not divide --tp {memory.tp_size} and the model's {memory.num_experts} "
            "experts (moe_tp_size x moe_ep_size must equal tp_size)",
            hint=f"pass a --moe-ep-size that divides {memory.tp_size}, or a larger --tp",
        )


def check_context_fits(memory: MemoryPlan, runtime: EngineRuntime) -> None:
    """Without chunked context a prompt is one step: max_num_tokens must hold max_input_len tokens.

    The executor bounds a context by max_num_tokens when context FMHA is on and chunking is off
    (trtGptModelInflightBatching.cpp: maxContextLength); longer prompts would be refused at serve time.
    """
    if not runtime.enable_chunked_context and memory.max_num_tokens < memory.max_input_len:
        raise EngineBuildError(
            f"chunked context is off (--no-chunked-context, kv_cache.enable_chunked_context: false), and "
            f"max_num_tokens {memory.max_num_tokens} is less than max_input_len {memory.max_input_len}: prompts "
            f"longer than {memory.max_num_tokens} tokens could not be served",
            hint=f"drop --no-chunked-context (kv_cache.enable_chunked_context: true in a recipe), or pass "
            f"--max-num-tokens {memory.max_input_len} (or --max-input-len {memory.max_num_tokens})",
        )


def _commands(memory: MemoryPlan, settings: StepSettings) -> tuple[tuple[str, ...], ...]:
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
    settings: BuildSettings,
    memory: MemoryPlan,
    step_names: tuple[str, ...],
    gpu_sm: str,
    lora: LoraEngine | None = None,
) -> dict:
    """Everything of the build cache key that is known before the checkpoint is downloaded."""
    return {
        **({"lora": lora.to_dict()} if lora is not None else {}),
        "model_source": model_source,
        "settings": engine_inputs(settings),
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
