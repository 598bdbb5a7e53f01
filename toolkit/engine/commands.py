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
from toolkit.engine.trtllm_flags import QUANTIZE_SCRIPT
from toolkit.model.architectures import family_named
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


def needs_quantizer(plan: MemoryPlan) -> bool:
    """ModelOpt's quantize path for quantized weights or KV cache; the family's converter otherwise."""
    return WEIGHT_PRECISIONS[plan.dtype].qformat is not None or plan.kv_dtype != "bf16"


def checkpoint_argv(plan: MemoryPlan, settings: StepSettings, tools: TrtllmTools) -> list[str]:
    if needs_quantizer(plan):
        return quantize_argv(plan, settings, tools)
    return convert_argv(plan, settings, tools)


def convert_script(plan: MemoryPlan) -> str:
    """The converter of the model's family (toolkit.model.architectures): Llama and Mistral go through the
    Llama one, Qwen2 through the Qwen one (the Llama converter would drop its q/k/v biases)."""
    return family_named(plan.architecture).converter


def convert_argv(plan: MemoryPlan, settings: StepSettings, tools: TrtllmTools) -> list[str]:
    return [
        tools.python,
        f"{tools.examples_dir}/{convert_script(plan)}",
        "--model_dir",
        str(settings.model_dir),
        "--output_dir",
        str(settings.checkpoint_dir),
        "--dtype",
        "bfloat16",
        "--tp_size",
        str(plan.tp_size),
        "--pp_size",
        str(plan.pp_size),
        "--workers",
        "1",
    ]


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
    return argv + fusion_argv(settings.fusions)
