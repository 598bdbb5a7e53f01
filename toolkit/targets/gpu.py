"""GPU targets (h100-sxm, h200, ...): a TensorRT-LLM engine compiled for the profile, served by the
tensorrtllm backend."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from tritonclient.grpc import model_config_pb2 as mc

from toolkit.build_settings import CPU_PRECISION, SETTINGS, BuildSettings
from toolkit.capabilities import MAX_TOP_LOGPROBS, Capabilities
from toolkit.engine.commands import lora_convert_argv
from toolkit.engine.fusions import FUSIONS
from toolkit.engine.trtllm_flags import LORA_CONVERT_SCRIPT
from toolkit.errors import EngineBuildError, RecipeError, RepositoryError, ServerError
from toolkit.plan.gpus import GpuProfile
from toolkit.plan.lora import HF_TO_TRTLLM, LORA_TENSOR_TYPE, LoraEngine, trtllm_modules
from toolkit.plan.precisions import KV_PRECISIONS, WEIGHT_PRECISIONS
from toolkit.repository import configs
from toolkit.repository import contract as c
from toolkit.repository.engine import CANCELLATION_CHECK_PERIOD_MS, EngineSection
from toolkit.repository.guided import TOKENIZER_INFO, write_tokenizer_info
from toolkit.repository.limits import RepositoryLimits
from toolkit.settings import toolkit_home, trtllm_tools
from toolkit.targets.base import (
    GIB,
    LORA_HINT,
    Resources,
    Target,
    TargetPlan,
    adapter_setting,
    model_engine_capabilities,
    plan_adapters,
)

if TYPE_CHECKING:
    from toolkit.model.adapters import CheckedAdapter
    from toolkit.plan.memory import MemoryPlan
    from toolkit.plan.source import PlannedModel

# Plus CUDA, MPI and TensorRT-LLM's host buffers.
GPU_HOST_OVERHEAD_BYTES = 8 * GIB
# The performance estimate holds within +-20 % of NVIDIA's model (tests/test_estimate.py): a stream
# may run 1 / 0.8 = 1.25 x slower than it says.
ESTIMATE_MARGIN = 1.25
# Container start, MPI ranks, CUDA contexts, the Python models, the KV pool allocation and CUDA
# graph capture, besides loading the weights.
GPU_START_S = 180
# Checkpoints on the hub are bf16, 2 bytes per parameter (the memory plan counts the parameters).
CHECKPOINT_BYTES_PER_PARAMETER = 2
NOT_YET = "the OpenAI API does not pass it to the tensorrtllm backend yet"
FUSION_SETTINGS = tuple(f.setting for f in FUSIONS)
# The backend's guided decoding (xgrammar): the one backend its C++ accepts (tests/data/upstream).
GUIDED_DECODING_BACKEND = "xgrammar"
LOGITS_HINT = (
    "rebuild with --gather-generation-logits (engine.gather_generation_logits: true in a recipe): the "
    "engine then returns each step's logits, and its logits buffer takes GPU memory from the KV cache"
)


def guided_decoding_parameters(repository: Path, trtllm_version: str | None) -> dict[str, str]:
    """The tensorrt_llm parameters the backend reads for guided decoding. Its C++ reads all three with no
    default (a config without one fails to load), so they are always written where the release has them;
    `tokenizer_dir` is the Python backend's and stays empty. The info file's path is absolute: the backend
    checks that it exists, relative to tritonserver's working directory otherwise."""
    if not c.has_input("guided_decoding_guide", trtllm_version):
        return {}
    return {
        "tokenizer_dir": "",
        "guided_decoding_backend": GUIDED_DECODING_BACKEND,
        "xgrammar_tokenizer_info_path": str(Path(repository) / c.ENGINE / "1" / TOKENIZER_INFO),
    }


@dataclass(frozen=True)
class TrtllmEngine:
    """A compiled TensorRT-LLM engine, served by the tensorrtllm backend from where it was built."""

    target: str  # the GPU profile it was built for
    engine_dir: str
    trtllm_version: str
    max_batch_size: int  # the engine's own build_config.max_batch_size
    world_size: int
    runtime: dict  # EngineRuntime of the build: KV pool, reuse, chunked context, scheduler policy
    # Every id that may end a request (the end id, the model's other end tokens): guided decoding's stop tokens.
    stop_token_ids: tuple[int, ...] = ()
    # With LoRA adapters: the LoRA cache's runtime parameters from the plan (lora_runtime); {} without.
    lora: dict = field(default_factory=dict)
    kind: ClassVar[str] = "tensorrtllm"
    copies_weights: ClassVar[bool] = False

    @property
    def lora_weights_type(self) -> str | None:
        """An engine with the LoRA plugin takes runtime adapters in its own dtype (TensorRT-LLM: "Expected
        lora weights to be the same data type as base model"): BF16, where the stock config says FP16."""
        return LORA_TENSOR_TYPE if self.lora else None

    def section(self) -> EngineSection:
        parameters = {
            k: v for k, v in asdict(self).items() if k not in ("world_size", "trtllm_version")
        }
        return EngineSection(self.kind, self.world_size, self.trtllm_version, parameters)

    def prepared(self, checkpoint: Path, tokens) -> TrtllmEngine:
        ends = tuple(dict.fromkeys((tokens.end_id, *tokens.stop_ids)))
        return replace(self, stop_token_ids=ends)

    def install(self, version: Path, checkpoint: Path) -> None:
        version.mkdir(parents=True)  # the engine stays in engine_dir; gpt_model_path names it
        if c.has_input("guided_decoding_guide", self.trtllm_version):
            write_tokenizer_info(version, checkpoint / "tokenizer.json", list(self.stop_token_ids))

    def install_adapters(self, version: Path, adapters: tuple[CheckedAdapter, ...]) -> None:
        """Each adapter converted by TensorRT-LLM's hf_lora_convert.py into lora/<task id>/ (the backend's
        prefetch folder), its weights in the engine's dtype."""
        from toolkit.engine.build import run_logged
        from toolkit.engine.trtllm_flags import check_argv

        tools = trtllm_tools()
        logs = toolkit_home() / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        for checked in adapters:
            out = version / LORA_DIR / str(checked.adapter.task_id)
            argv = lora_convert_argv(checked.folder, out, tools)
            check_argv(argv)
            log = logs / f"hf_lora_convert-{checked.name}.log"
            run_logged(argv, log, f"{LORA_CONVERT_SCRIPT} (--lora {checked.name})")
            missing = [name for name in LORA_FILES if not (out / name).is_file()]
            if missing:
                raise EngineBuildError(
                    f"{LORA_CONVERT_SCRIPT} wrote no {', '.join(missing)} for --lora {checked.name} "
                    f"(log: {log})",
                    hint="read the log; check that the adapter is a Hugging Face PEFT LoRA of this model",
                    value=checked.name,
                )

    def config(self, plan) -> mc.ModelConfig:
        limits = plan.limits
        config = mc.ModelConfig(
            name=c.ENGINE, backend="tensorrtllm", max_batch_size=self.max_batch_size
        )
        config.input.extend(configs.tensor_inputs(c.engine_inputs(self.trtllm_version)))
        config.output.extend(configs.tensor_outputs(c.ENGINE_OUTPUTS))
        config.model_transaction_policy.decoupled = plan.decoupled
        config.dynamic_batching.preferred_batch_size.append(self.max_batch_size)
        if limits.max_queue_size:
            config.dynamic_batching.default_queue_policy.max_queue_size = limits.max_queue_size
        config.instance_group.append(
            mc.ModelInstanceGroup(count=1, kind=mc.ModelInstanceGroup.KIND_CPU)
        )
        # The runtime sizes the KV pool from its free-memory share; a token cap, when one is planned,
        # would bound it too (it takes the smaller of the two).
        cap = self.runtime.get("max_tokens_in_paged_kv_cache")
        configs.set_parameters(
            config,
            {
                "gpt_model_type": "inflight_fused_batching",
                "gpt_model_path": self.engine_dir,
                "max_beam_width": 1,
                **({} if cap is None else {"max_tokens_in_paged_kv_cache": cap}),
                "kv_cache_free_gpu_mem_fraction": self.runtime["kv_cache_free_gpu_mem_fraction"],
                "enable_kv_cache_reuse": self.runtime["enable_kv_cache_reuse"],
                "enable_chunked_context": self.runtime["enable_chunked_context"],
                "batch_scheduler_policy": self.runtime["batch_scheduler_policy"],
                "exclude_input_in_output": True,
                "cancellation_check_period_ms": CANCELLATION_CHECK_PERIOD_MS,
                **_attention_window(self.runtime),
                **guided_decoding_parameters(plan.output, self.trtllm_version),
                **(lora_parameters(plan.output, self.lora) if plan.adapters else {}),
            },
        )
        return config

    @classmethod
    def from_engine(cls, target: str, info) -> TrtllmEngine:
        """From toolkit.engine.EngineInfo of a built engine folder (its config.json and build record)."""
        return cls(
            target=target,
            engine_dir=str(Path(info.engine_dir).resolve()),
            trtllm_version=info.trtllm_version,
            max_batch_size=info.max_batch_size,
            world_size=info.world_size,
            runtime=dict(info.runtime),
        )

    @classmethod
    def from_section(cls, section: EngineSection) -> TrtllmEngine:
        parameters = dict(section.parameters)
        parameters["stop_token_ids"] = tuple(parameters.get("stop_token_ids", ()))
        try:
            return cls(
                world_size=section.world_size,
                trtllm_version=str(section.trtllm_version),
                **parameters,
            )
        except TypeError as exc:
            raise RepositoryError(
                f"the manifest's engine section does not fit a TensorRT-LLM engine: {exc}",
                hint="rebuild the repository",
            ) from exc


class GpuTarget(Target):
    """One GPU profile (toolkit.plan.gpus)."""

    kind = "gpu"
    start_seconds = GPU_START_S

    def __init__(self, profile: GpuProfile):
        self.profile = profile
        self.name = profile.name
        self.description = profile.description

    # --- build ---------------------------------------------------------------------------------
    def check_settings(self, settings: BuildSettings, named) -> None:
        super().check_settings(settings, named)
        for name, table in (("dtype", WEIGHT_PRECISIONS), ("kv_dtype", KV_PRECISIONS)):
            value = getattr(settings, name)
            if value == CPU_PRECISION:
                raise RecipeError(
                    f"{named(SETTINGS[name])} {value} is for the cpu target only",
                    hint=f"use one of {', '.join(table)} on a GPU target",
                    value=value,
                )
            precision = table.get(value) if value is not None else None
            if (
                precision is not None
                and precision.needs_fp8_hardware
                and not self.profile.supports_fp8
            ):
                raise RecipeError(
                    f"{named(SETTINGS[name])} {value}: {self.name} has no FP8 support",
                    hint="use bf16 or int4-awq for this target",
                    value=value,
                )

    def plan_memory(
        self, settings: BuildSettings, planned: PlannedModel, lora: LoraEngine | None = None
    ) -> MemoryPlan:
        """The memory plan of `planned` on this GPU with these settings (toolkit plan shows it), the LoRA
        cache of `lora` counted."""
        from toolkit.plan.memory import plan_memory
        from toolkit.targets.gpu_models import check_buildable, kv_dtype, weight_dtype

        check_buildable(planned.facts, settings)
        return plan_memory(
            planned.facts,
            self.profile,
            model=planned.name,
            dtype=weight_dtype(planned.facts, settings),
            kv_dtype=kv_dtype(planned.facts, settings),
            tp=settings.tp,
            pp=settings.pp or 1,
            max_seq_len=settings.max_seq_len,
            max_input_len=settings.max_input_len,
            max_batch_size=settings.max_batch_size,
            max_num_tokens=settings.max_num_tokens,
            target_input_len=settings.target_input_len,
            target_output_len=settings.target_output_len,
            kv_cache_free_gpu_mem_fraction=settings.kv_cache_free_gpu_mem_fraction,
            gather_generation_logits=bool(settings.gather_generation_logits),
            lora=lora,
        )

    def plan(self, settings: BuildSettings, model) -> TargetPlan:
        from toolkit.engine.build_plan import plan_engine_build
        from toolkit.plan.source import load_model_for_plan

        planned = load_model_for_plan(model)
        adapters = plan_adapters(settings, model)  # checked before anything is downloaded or built
        lora = lora_engine(adapters, settings)
        memory = self.plan_memory(settings, planned, lora)
        engine_build = plan_engine_build(
            planned.name,
            model.source,
            planned.checkpoint_dir,
            memory,
            settings,
            gpu_sm=self.profile.sm,
            output_dir=settings.engine_dir,
            display_dir=_display_checkpoint(model),
            lora=lora,
        )
        limits = RepositoryLimits.from_memory_plan(
            memory, max_output_len=settings.max_output_len, max_queue_size=settings.max_queue_size
        )
        resolved = replace(
            self._resolved(settings, memory, limits, engine_build),
            lora=adapter_setting(adapters),
            max_lora_rank=lora.max_rank if lora else None,
            lora_cache_adapters=lora.cache_adapters if lora else None,
        )
        capabilities = self.capabilities(resolved)
        return TargetPlan(
            resolved, limits, capabilities, None, memory, engine_build, adapters=adapters
        )

    def _resolved(self, settings: BuildSettings, memory, limits, engine_build) -> BuildSettings:
        """The settings as planned: every value the build will use, so a rebuild makes the same engine."""
        runtime = engine_build.runtime
        calibration = engine_build.calibration
        fusions: dict[str, Any] = {
            name: name in engine_build.steps.fusions for name in FUSION_SETTINGS
        }
        return BuildSettings(
            dtype=memory.dtype,
            kv_dtype=memory.kv_dtype,
            calib_size=engine_build.steps.calib_size,
            calib_dataset=engine_build.steps.calib_dataset,
            calib_gpus=calibration.gpus if calibration else None,
            awq_block_size=engine_build.steps.awq_block_size,
            tp=memory.tp_size,
            moe_ep_size=engine_build.steps.moe_ep_size if memory.num_experts else None,
            pp=memory.pp_size,
            max_seq_len=memory.max_seq_len,
            max_input_len=memory.max_input_len,
            max_output_len=limits.max_output_len,
            max_batch_size=memory.max_batch_size,
            max_num_tokens=memory.max_num_tokens,
            max_queue_size=limits.max_queue_size,
            target_input_len=memory.target_input_len,
            target_output_len=memory.target_output_len,
            batch_scheduler_policy=runtime.batch_scheduler_policy,
            kv_cache_free_gpu_mem_fraction=runtime.kv_cache_free_gpu_mem_fraction,
            enable_kv_cache_reuse=runtime.enable_kv_cache_reuse,
            enable_chunked_context=runtime.enable_chunked_context,
            **fusions,
            engine_dir=Path(engine_build.engine_dir),
            decoupled=True if settings.decoupled is None else settings.decoupled,
            gather_generation_logits=bool(settings.gather_generation_logits),
        )

    def preflight_build(self, plan: TargetPlan) -> None:
        """TensorRT-LLM of the pinned release, a GPU of this profile's SM and enough of them, and a
        calibration set the quantizer can read: checked before the checkpoint's download."""
        from toolkit.engine.calibration import check_calibration_source
        from toolkit.engine.tools import require_gpu_sm, require_gpus, require_trtllm

        build = plan.engine_build
        if build is None:
            raise TypeError(f"a {self.name} plan names its engine build")
        require_trtllm()
        require_gpu_sm(self.profile.sm, self.name)
        require_gpus(build.gpus, _gpus_why(build))
        check_calibration_source(build.calibration)
        if plan.adapters:
            _require_lora_converter()

    def build_engine(self, plan: TargetPlan, model, progress) -> tuple[TrtllmEngine, Any]:
        from toolkit.engine.build import execute_engine_build
        from toolkit.engine.info import read_engine_info

        if plan.engine_build is None:
            # a plan of another target
            raise TypeError(f"a {self.name} plan names its engine build")
        engine_plan = plan.engine_build.with_checkpoint(model.path)
        result = execute_engine_build(engine_plan, progress=progress)
        engine = TrtllmEngine.from_engine(self.name, read_engine_info(Path(result.engine_dir)))
        if plan.adapters and plan.memory is not None:
            engine = replace(engine, lora=lora_runtime(plan.memory))
        return engine, (engine_plan, result)

    def capabilities(self, settings: BuildSettings) -> Capabilities:
        """What the tensorrtllm backend of the pinned release honours for an engine built so: guided decoding
        (xgrammar), the sampled tokens' log probs (output_log_probs), top log probs only from gathered
        generation logits, n > 1 (num_return_sequences: one response per sequence, so decoupled only)."""
        logits = bool(settings.gather_generation_logits)
        return model_engine_capabilities(
            self.name,
            settings,
            top_logprobs=MAX_TOP_LOGPROBS if logits else 0,
            top_logprobs_source="generation_logits" if logits else "",
            bad_words=True,
            top_p_decay=True,
            generation_logits=logits,
            enable={
                "top_logprobs": LOGITS_HINT,
                "generation_logits": LOGITS_HINT,
                "prompt_logprobs": "the OpenAI API does not compute them from context logits yet",
                "n": "the backend answers each of n sequences on its own: rebuild without --no-decoupled",
                "beam_width": "the toolkit builds GPU engines with max_beam_width 1",
                "lora": LORA_HINT,
                "batched_prompts": "send one prompt per request",
                "context_logits": NOT_YET,
                "streaming": "rebuild without --no-decoupled",
            },
        )

    def dry_run_details(self, plan: TargetPlan, output: Path) -> dict[str, Any]:
        """What the repository will tell the backend besides the runtime settings, and the files it writes."""
        repository = Path(output).resolve()
        guided = guided_decoding_parameters(repository, None)
        files = [f"{c.ENGINE}/1/{TOKENIZER_INFO}"] if guided else []
        details: dict[str, Any] = {"engine_parameters": guided, "repository_files": files}
        if plan.adapters and plan.memory is not None:
            tools = trtllm_tools()
            details["engine_parameters"] = {
                **guided,
                **lora_parameters(repository, lora_runtime(plan.memory)),
            }
            details["lora_conversion"] = [
                lora_convert_argv(a.folder, repository / _prefetch_folder(a), tools)
                for a in plan.adapters
            ]
            files += [f"{_prefetch_folder(a)}/{name}" for a in plan.adapters for name in LORA_FILES]
        return details

    # --- the built repository ------------------------------------------------------------------
    def engine_from_section(self, section: EngineSection) -> TrtllmEngine:
        return TrtllmEngine.from_section(section)

    def preflight(self, repository) -> int:
        from toolkit.engine import check_engine_compatible

        engine = self.engine_from_section(repository.manifest.engine)
        return check_engine_compatible(Path(engine.engine_dir)).world_size

    def compiled_engine(self, repository):
        from toolkit.engine.info import read_engine_info

        return read_engine_info(
            Path(self.engine_from_section(repository.manifest.engine).engine_dir)
        )

    def check_server(self, repository, bundled_tritonserver: bool) -> None:
        if bundled_tritonserver:
            raise ServerError(
                f"{repository.path} holds a TensorRT-LLM engine ({self.name}), and the tritonserver found "
                "here (bundled by nvidia-pytriton) has no tensorrtllm backend",
                hint="serve it inside NVIDIA's Triton TRT-LLM container "
                "(nvcr.io/nvidia/tritonserver:<yy.mm>-trtllm-python-py3)",
            )

    # --- deploy --------------------------------------------------------------------------------
    def load_bytes(self, repository, engine_files: list[Path] | None) -> int:
        if engine_files is None:
            return super().load_bytes(repository, None)
        return sum(path.stat().st_size for path in engine_files)

    def slowest_stream_tokens_per_s(self, repository) -> float:
        plan = repository.memory_plan
        if plan is None:
            raise RepositoryError(
                f"{repository.path} is a GPU repository without a memory plan in its manifest",
                hint=f"rebuild it: {repository.rebuild_command}",
            )
        from toolkit.plan.estimate import estimate_for_plan

        # every batch slot of every pipeline stage busy, at the plan's target lengths
        full = estimate_for_plan(
            repository.manifest.model.facts, plan, plan.max_batch_size * plan.pp_size
        )
        return 1000 / (full.tpot_ms * ESTIMATE_MARGIN)

    def replica_tokens_per_s(self, repository, batch_slots: int) -> float | None:
        """The plan's estimate of the engine at full batch (toolkit.plan.estimate), at the top of its
        tolerance: the most the API in front must relay."""
        plan = repository.memory_plan
        if plan is None:
            return super().replica_tokens_per_s(repository, batch_slots)
        from toolkit.plan.estimate import estimate_for_plan

        full = estimate_for_plan(repository.manifest.model.facts, plan, batch_slots)
        return full.output_tokens_per_s * ESTIMATE_MARGIN

    def reuses_kv_cache(self, repository) -> bool:
        engine = self.engine_from_section(repository.manifest.engine)
        return bool(engine.runtime.get("enable_kv_cache_reuse"))

    def resources(self, repository, load_bytes: int, world_size: int) -> Resources:
        return Resources(GPU_HOST_OVERHEAD_BYTES + load_bytes, 2 + 2 * world_size)

    def build_resources(self, checkpoint_bytes: int, world_size: int) -> Resources:
        return Resources(GPU_HOST_OVERHEAD_BYTES + 2 * checkpoint_bytes, 4 + 2 * world_size)


def _attention_window(runtime: dict) -> dict:
    """max_attention_window_size when some layer attends through a sliding window: the backend reads it as
    a comma-separated list of int32, one per layer (model_instance_state.cc: GetParameter<std::vector<
    int32_t>>, utils::csvStrToVecInt), as the Gemma 3 README's --max_attention_window_size 512 ... 3100."""
    windows = runtime.get("max_attention_window_size") or ()
    return {"max_attention_window_size": ",".join(str(w) for w in windows)} if windows else {}


def _gpus_why(build) -> str:
    why = f"TP x PP = {build.world_size}"
    if build.calibration is not None and build.calibration.gpus > build.world_size:
        why += f", calibration over {build.calibration.gpus}"
    return why


def _display_checkpoint(model) -> str:
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


# The backend's prefetch folder inside the engine's version folder: <task id>/ with these two files each
# (hf_lora_convert.py's output; tests/data/upstream/triton_backend.json, lora).
LORA_DIR = "lora"
LORA_FILES = ("model.lora_weights.npy", "model.lora_config.npy")


def _prefetch_folder(checked: CheckedAdapter) -> str:
    return f"{c.ENGINE}/1/{LORA_DIR}/{checked.adapter.task_id}"


def lora_engine(adapters: tuple[CheckedAdapter, ...], settings: BuildSettings) -> LoraEngine | None:
    """The modules, rank and cache the engine is built for; RecipeError for a rank above --max-lora-rank,
    more adapters than --lora-cache-adapters, or either without --lora."""
    if not adapters:
        given = [
            name for name in ("max_lora_rank", "lora_cache_adapters") if getattr(settings, name)
        ]
        if given:
            flags = " and ".join(SETTINGS[name].flag for name in given)
            raise RecipeError(
                f"{flags} without --lora: the engine would be built without the LoRA plugin",
                hint=f"add --lora NAME=PATH, or drop {flags}",
                value=given,
            )
        return None
    ranks = {a.name: a.adapter.rank for a in adapters}
    top = max(ranks.values())
    max_rank = settings.max_lora_rank or top
    over = {name: rank for name, rank in ranks.items() if rank > max_rank}
    if over:
        listed = ", ".join(f"{name} (rank {rank})" for name, rank in over.items())
        raise RecipeError(
            f"--lora {listed}: above --max-lora-rank {max_rank}, the largest rank the engine takes",
            hint=f"pass --max-lora-rank {top} (engine.max_lora_rank in a recipe), or drop those adapters",
            value=over,
        )
    holds = settings.lora_cache_adapters or len(adapters)
    if len(adapters) > holds:
        raise RecipeError(
            f"{len(adapters)} --lora adapters, and the LoRA cache holds {holds} "
            f"(--lora-cache-adapters {holds}): the backend loads every built adapter into it at start",
            hint=f"pass --lora-cache-adapters {len(adapters)} (engine.lora_cache_adapters in a recipe), or "
            "serve fewer adapters",
            value=len(adapters),
        )
    hf_modules = {m for a in adapters for m in a.adapter.target_modules}
    fused = sorted(hf_modules - set(HF_TO_TRTLLM))
    if fused:
        raise RecipeError(
            f"--lora adapters target {', '.join(fused)}: GPU engines are built here for LoRA of "
            f"{', '.join(HF_TO_TRTLLM)} only (not fused layers)",
            hint="build these adapters for --target cpu, or adapters of the unfused modules",
            value=fused,
        )
    modules = trtllm_modules(hf_modules)
    return LoraEngine(target_modules=modules, max_rank=max_rank, cache_adapters=holds)


def lora_runtime(memory: MemoryPlan) -> dict[str, Any]:
    """The LoRA cache's runtime values from the plan, as TrtllmEngine records them."""
    return {
        "max_rank": memory.lora_max_rank,
        "gpu_memory_fraction": memory.lora_cache_gpu_memory_fraction,
        "host_memory_bytes": memory.lora_host_cache_bytes,
    }


def lora_parameters(repository: Path, runtime: dict[str, Any]) -> dict[str, Any]:
    """The tensorrt_llm parameters of the LoRA cache (the backend's getPeftCacheConfigFromParams): both
    adapter sizes the engine's maximum rank (one cache page is one adapter of that rank:
    toolkit.plan.lora), the planned GPU share and host bytes, and the prefetch folder, absolute (the
    backend passes it as it is)."""
    rank = runtime["max_rank"]
    return {
        "lora_cache_optimal_adapter_size": rank,
        "lora_cache_max_adapter_size": rank,
        "lora_cache_gpu_memory_fraction": runtime["gpu_memory_fraction"],
        "lora_cache_host_memory_bytes": runtime["host_memory_bytes"],
        "lora_prefetch_dir": str(Path(repository) / c.ENGINE / "1" / LORA_DIR),
    }


def _require_lora_converter() -> None:
    """TensorRT-LLM's examples/hf_lora_convert.py, before hours of engine build that would end without it."""
    from toolkit.engine.tools import container_hint

    script = Path(trtllm_tools().examples_dir) / LORA_CONVERT_SCRIPT
    if not script.is_file():
        raise EngineBuildError(
            f"--lora needs TensorRT-LLM's {LORA_CONVERT_SCRIPT}, which is not at {script}",
            hint="set TOOLKIT_TRTLLM_EXAMPLES_DIR to the examples/ folder of a TensorRT-LLM checkout of the "
            "pinned tag, or " + container_hint(),
            value=str(script),
        )
