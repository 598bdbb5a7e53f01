"""The exact argv of each TensorRT-LLM step, from the memory plan and the recipe settings.

Choices follow TensorRT-LLM's performance docs (perf-best-practices, useful-build-time-flags):
paged KV cache, removed input padding, context FMHA with paged context FMHA (needed for chunked
context and KV-cache reuse), multiple optimization profiles, fused gate/up MLP. The GEMM plugin
helps bf16 and weight-only int4, and the docs advise leaving it off for fp8 (the FP8 GEMMs of
TensorRT itself are faster there).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from toolkit.engine.fusions import fusion_argv
from toolkit.engine.trtllm_flags import LORA_CONVERT_SCRIPT, QUANTIZE_SCRIPT
from toolkit.errors import EngineBuildError
from toolkit.model.architectures import ConverterCli, family_named
from toolkit.plan.lora import LORA_DTYPE, LoraEngine
from toolkit.plan.memory import MemoryPlan
from toolkit.plan.precisions import WEIGHT_PRECISIONS
from toolkit.settings import TrtllmTools

# quantize.py's --qformat when only the KV cache is quantized (bf16 weights, fp8 KV cache).
FULL_PRECISION_QFORMAT = "full_prec"


@dataclass(frozen=True)
class StepSettings:
    """What the argv needs besides the memory plan."""

    model_dir: Path
    checkpoint_dir: Path  # TensorRT-LLM checkpoint written by convert/quantize
    engine_dir: Path  # trtllm-build's --output_dir
    # trtllm-build's --output_timing_cache: its default, model.cache, would land in the caller's cwd.
    timing_cache: Path
    calib_size: int = 512
    awq_block_size: int = 128
    fusions: tuple[str, ...] = ()  # toolkit.engine.fusions settings that are on
    calib_dataset: Path | None = None  # a local calibration set (None: quantize.py's, from the hub)
    # MoE: ranks that hold whole experts (expert parallel); the rest of the TP ranks shard each expert.
    moe_ep_size: int = 1
    # --gather_generation_logits: the backend can return each step's logits (top_logprobs).
    gather_generation_logits: bool = False
    # LoRA adapters: the plugin, the modules and the largest rank the engine is built for (None: no LoRA).
    lora: LoraEngine | None = None


def needs_quantizer(plan: MemoryPlan) -> bool:
    """ModelOpt's quantize path for quantized weights or KV cache; the family's converter otherwise. A
    pre-quantized checkpoint is always converted, never quantized again (TensorRT-LLM's CLI-flow tests
    convert such checkpoints with convert_checkpoint.py: tests/data/upstream/trtllm_tools.json,
    prequantized_conversion)."""
    if plan.stored_quantization is not None:
        return False
    return WEIGHT_PRECISIONS[plan.dtype].qformat is not None or plan.kv_dtype != "bf16"


def checkpoint_argv(plan: MemoryPlan, settings: StepSettings, tools: TrtllmTools) -> list[str]:
    if needs_quantizer(plan):
        return quantize_argv(plan, settings, tools)
    return convert_argv(plan, settings, tools)


def converter_of(plan: MemoryPlan) -> ConverterCli:
    """The converter of the model's family (toolkit.model.architectures): Llama, Mistral and Mixtral go
    through the Llama one, Qwen2 through the Qwen one (the Llama converter would drop its q/k/v biases),
    Gemma 2/3 and Phi-3/4 through their own."""
    converter = family_named(plan.architecture).converter
    if converter is None:
        raise EngineBuildError(
            f"{plan.architecture} has no TensorRT-LLM converter in the pinned release",
            hint="this is a bug: the GPU target refuses such a model before planning",
        )
    return converter


def convert_script(plan: MemoryPlan) -> str:
    return converter_of(plan).script


def convert_argv(plan: MemoryPlan, settings: StepSettings, tools: TrtllmTools) -> list[str]:
    cli = converter_of(plan)
    argv = [
        tools.python,
        f"{tools.examples_dir}/{cli.script}",
        *cli.fixed,
        cli.model_dir,
        str(settings.model_dir),
        cli.output_dir,
        str(settings.checkpoint_dir),
        "--dtype",
        "bfloat16",
        cli.tp,
        str(plan.tp_size),
    ]
    if cli.pp is not None:
        argv += [cli.pp, str(plan.pp_size)]
    if cli.moe and plan.num_experts:
        ep = settings.moe_ep_size
        argv += ["--moe_tp_size", str(plan.tp_size // ep), "--moe_ep_size", str(ep)]
    if cli.workers:
        argv += ["--workers", "1"]
    return argv + prequantized_flags(plan, cli)


def prequantized_flags(plan: MemoryPlan, cli: ConverterCli) -> list[str]:
    """What tells the converter the checkpoint's own quantization (the GPU target has refused a format its
    converter does not take)."""
    if plan.stored_quantization is None:
        return []
    flags = list(cli.prequantized[plan.dtype])
    if plan.dtype == "int4-gptq" and plan.stored_group_size and cli.group_size:
        flags += [cli.group_size, str(plan.stored_group_size)]
    if plan.kv_dtype == "fp8" and cli.fp8_kv_cache:
        flags.append(cli.fp8_kv_cache)
    return flags


def quantize_argv(plan: MemoryPlan, settings: StepSettings, tools: TrtllmTools) -> list[str]:
    argv = [
        tools.python,
        f"{tools.examples_dir}/{QUANTIZE_SCRIPT}",
        "--model_dir",
        str(settings.model_dir),
        "--output_dir",
        str(settings.checkpoint_dir),
        "--dtype",
        "bfloat16",
        "--qformat",
        WEIGHT_PRECISIONS[plan.dtype].qformat or FULL_PRECISION_QFORMAT,
        "--calib_size",
        str(settings.calib_size),
        # the bf16 checkpoint over every GPU the build has (transformers' device_map; quantize.py's default)
        "--device_map",
        "auto",
        "--tp_size",
        str(plan.tp_size),
        "--pp_size",
        str(plan.pp_size),
    ]
    if settings.calib_dataset is not None:
        argv += ["--calib_dataset", str(settings.calib_dataset)]
    if plan.dtype == "int4-awq":
        argv += ["--awq_block_size", str(settings.awq_block_size)]
    if plan.kv_dtype == "fp8":
        argv += ["--kv_cache_dtype", "fp8"]
    return argv


def trtllm_build_argv(plan: MemoryPlan, settings: StepSettings, tools: TrtllmTools) -> list[str]:
    argv = [
        tools.trtllm_build,
        "--checkpoint_dir",
        str(settings.checkpoint_dir),
        "--output_dir",
        str(settings.engine_dir),
        "--max_batch_size",
        str(plan.max_batch_size),
        "--max_input_len",
        str(plan.max_input_len),
        "--max_seq_len",
        str(plan.max_seq_len),
        "--max_num_tokens",
        str(plan.max_num_tokens),
        "--max_beam_width",
        "1",
        "--kv_cache_type",
        "paged",
        "--tokens_per_block",
        str(plan.tokens_per_block),
        "--remove_input_padding",
        "enable",
        "--context_fmha",
        "enable",
        "--use_paged_context_fmha",
        "enable",
        "--gpt_attention_plugin",
        "auto",
        "--gemm_plugin",
        WEIGHT_PRECISIONS[plan.dtype].gemm_plugin,
        "--multiple_profiles",
        "enable",
        "--workers",
        str(plan.world_size),
        "--log_level",
        "info",
        "--output_timing_cache",
        str(settings.timing_cache),
    ]
    if WEIGHT_PRECISIONS[plan.dtype].fused_mlp:
        argv += ["--use_fused_mlp", "enable"]
    if plan.dtype == "fp8" and plan.kv_dtype == "fp8":
        argv += ["--use_fp8_context_fmha", "enable"]  # FP8 attention in the context phase on Hopper
    if settings.gather_generation_logits:
        argv.append("--gather_generation_logits")
    return argv + lora_build_flags(settings.lora) + fusion_argv(settings.fusions)


def lora_build_flags(lora: LoraEngine | None) -> list[str]:
    """The LoRA plugin in the engine's dtype (without it trtllm-build ignores the other two), the modules
    the adapters need and the largest rank (trtllm-build's default is 64)."""
    if lora is None:
        return []
    return [
        "--lora_plugin",
        LORA_DTYPE,
        "--lora_target_modules",
        *lora.target_modules,
        "--max_lora_rank",
        str(lora.max_rank),
    ]


def lora_convert_argv(adapter: Path, out_dir: Path, tools: TrtllmTools) -> list[str]:
    """TensorRT-LLM's hf_lora_convert.py: a PEFT adapter folder -> out_dir/model.lora_weights.npy and
    model.lora_config.npy (the backend's prefetch layout), the weights in the engine's dtype."""
    return [
        tools.python,
        f"{tools.examples_dir}/{LORA_CONVERT_SCRIPT}",
        "--in-file",
        str(adapter),
        "--out-dir",
        str(out_dir),
        "--storage-type",
        LORA_DTYPE,
    ]
