"""The command-line flags of the pinned TensorRT-LLM release's tools that the toolkit knows, as data.

Pinned release: toolkit.trtllm.PINNED_TRTLLM_VERSION. Every argv the toolkit emits is checked
against these lists before anything runs (check_argv). The lists themselves are checked by
tests/test_engine_flags.py against an independent record of the upstream argparse definitions
(tests/data/upstream/trtllm_tools.json, with the source of each tool), and the fake tools in
tests/fakes parse with that record, not with these lists.
"""

from __future__ import annotations

from dataclasses import dataclass

from toolkit.errors import EngineBuildError
from toolkit.trtllm import PINNED_TRTLLM_VERSION

# Paths of the example scripts inside a TensorRT-LLM checkout of the pinned tag (moved under
# examples/models/core/ in 0.19; 0.17 and 0.18 had examples/llama/convert_checkpoint.py). The
# converters are named by the model families (toolkit.model.architectures).
QUANTIZE_SCRIPT = "quantization/quantize.py"
# TensorRT-LLM's own conversion of a Hugging Face PEFT adapter into the runtime's LoRA tensors (at the top
# of examples/, not under models/).
LORA_CONVERT_SCRIPT = "hf_lora_convert.py"


@dataclass(frozen=True)
class Flag:
    name: str  # without the leading "--"
    kind: str  # "str", "int", "float", "choice", "store_true", "nargs+"
    choices: tuple[str, ...] = ()


def _flags(kind: str, *names: str, choices: tuple[str, ...] = ()) -> list[Flag]:
    return [Flag(name, kind, choices) for name in names]


_ENABLE = ("enable", "disable")
_PLUGIN_DTYPES = ("auto", "float16", "float32", "bfloat16", "int32", "disable")
_GEMM_DTYPES = ("auto", "float16", "float32", "bfloat16", "int32", "fp8", "nvfp4", "disable")
_WEIGHT_DTYPES = ("auto", "float16", "bfloat16", "float32")
_LORA_MODULES = (
    "attn_qkv",
    "attn_q",
    "attn_k",
    "attn_v",
    "attn_dense",
    "mlp_h_to_4h",
    "mlp_4h_to_h",
    "mlp_gate",
    "cross_attn_qkv",
    "cross_attn_q",
    "cross_attn_k",
    "cross_attn_v",
    "cross_attn_dense",
    "moe_h_to_4h",
    "moe_4h_to_h",
    "moe_gate",
    "moe_router",
    "mlp_router",
    "mlp_gate_up",
)
_CLUSTER_KEYS = (
    "A100-SXM-80GB",
    "A100-SXM-40GB",
    "A100-PCIe-80GB",
    "A100-PCIe-40GB",
    "H100-SXM",
    "H100-PCIe",
    "H20",
    "H200-SXM",
    "H200-NVL",
    "A40",
    "A30",
    "A10",
    "A10G",
    "L40S",
    "L40",
    "L20",
    "L4",
    "L2",
)

# --- trtllm-build: tensorrt_llm/commands/build.py, parse_arguments() ---------------------------
# Docs: https://nvidia.github.io/TensorRT-LLM/commands/trtllm-build.html
_TRTLLM_BUILD_MAIN = [
    *_flags(
        "str",
        "checkpoint_dir",
        "model_config",
        "build_config",
        "model_cls_file",
        "model_cls_name",
        "output_dir",
        "input_timing_cache",
        "output_timing_cache",
        "visualize_network",
        "paged_kv_cache",
    ),
    *_flags(
        "int",
        "max_batch_size",
        "max_input_len",
        "max_seq_len",
        "max_decoder_seq_len",
        "max_beam_width",
        "max_num_tokens",
        "opt_num_tokens",
        "max_encoder_input_len",
        "max_prompt_embedding_table_size",
        "max_multimodal_len",
        "workers",
        "max_lora_rank",
        "max_draft_len",
    ),
    Flag("kv_cache_type", "choice", ("continuous", "paged", "disabled")),
    Flag("profiling_verbosity", "choice", ("layer_names_only", "detailed", "none")),
    # tensorrt_llm/logger.py severity_map keys; "trace" came after 0.20.
    Flag("log_level", "choice", ("internal_error", "error", "warning", "info", "verbose", "debug")),
    Flag("logits_dtype", "choice", ("float16", "float32")),
    Flag("lora_ckpt_source", "choice", ("hf", "nemo")),
    Flag(
        "speculative_decoding_mode",
        "choice",
        ("draft_tokens_external", "lookahead_decoding", "medusa", "explicit_draft_tokens", "eagle"),
    ),
    *_flags(
        "store_true",
        "strip_plan",
        "weight_sparsity",
        "weight_streaming",
        "fast_build",
        "enable_debug_output",
        "dry_run",
        "monitor_memory",
        "gather_context_logits",
        "gather_generation_logits",
        "gather_all_token_logits",
    ),
    Flag("lora_dir", "nargs+"),
    Flag("lora_target_modules", "nargs+", _LORA_MODULES),
    # Auto parallel (0.19 to 1.1): chooses TP/PP itself; the toolkit plans them and never sets these.
    *_flags("int", "auto_parallel", "gpus_per_node"),
    Flag("cluster_key", "choice", _CLUSTER_KEYS),
]
# --- trtllm-build plugin options: tensorrt_llm/plugin/plugin.py, cli_plugin_args + add_plugin_argument()
# (plugins take a dtype or "disable"; features take enable/disable; tokens_per_block an int).
_TRTLLM_BUILD_PLUGINS = [
    Flag("gemm_plugin", "choice", _GEMM_DTYPES),
    *_flags(
        "choice",
        "gpt_attention_plugin",
        "bert_attention_plugin",
        "nccl_plugin",
        "lora_plugin",
        "moe_plugin",
        "mamba_conv1d_plugin",
        "fp8_rowwise_gemm_plugin",
        choices=_PLUGIN_DTYPES,
    ),
    # Plugins with their own dtype lists (plugin.py PLUGIN_DTYPE_OPTIONS_MAP): fp8 only, or 16-bit only.
    *_flags(
        "choice",
        "gemm_swiglu_plugin",
        "low_latency_gemm_plugin",
        "low_latency_gemm_swiglu_plugin",
        choices=("fp8", "disable"),
    ),
    Flag("gemm_allreduce_plugin", "choice", ("float16", "bfloat16", "disable")),
    *_flags(
        "choice",
        "context_fmha",
        "bert_context_fmha_fp32_acc",
        "remove_input_padding",
        "use_paged_context_fmha",
        "use_fp8_context_fmha",
        "fuse_fp4_quant",
        "multiple_profiles",
        "paged_state",
        "streamingllm",
        "norm_quant_fusion",
        "reduce_fusion",
        "user_buffer",
        "use_fused_mlp",
        "pp_reduce_scatter",
        "dora_plugin",
        choices=_ENABLE,
    ),
    Flag("tokens_per_block", "int"),
]
TRTLLM_BUILD_FLAGS = {f.name: f for f in _TRTLLM_BUILD_MAIN + _TRTLLM_BUILD_PLUGINS}

# --- examples/models/core/llama/convert_checkpoint.py, parse_arguments() -----------------------
_CONVERT = [
    *_flags(
        "str",
        "model_dir",
        "meta_ckpt_dir",
        "calib_dataset",
        "quant_ckpt_path",
        "hidden_act",
        "output_dir",
        "log_level",
    ),
    *_flags(
        "int",
        "tp_size",
        "pp_size",
        "moe_tp_size",
        "cp_size",
        "moe_ep_size",
        "vocab_size",
        "n_positions",
        "n_layer",
        "n_head",
        "n_kv_head",
        "n_embd",
        "inter_size",
        "multiple_of",
        "calib_size",
        "calib_max_seq_length",
        "group_size",
        "workers",
        "moe_num_experts",
        "moe_top_k",
        "moe_renorm_mode",
    ),
    *_flags("float", "ffn_dim_multiplier", "rms_norm_eps", "smoothquant", "rotary_base"),
    Flag("dtype", "choice", _WEIGHT_DTYPES),
    Flag("weight_only_precision", "choice", ("int8", "int4", "int8_gptq", "int4_gptq", "int4_awq")),
    Flag("embedding_sharding_dim", "choice", ("0", "1")),
    *_flags(
        "store_true",
        "use_weight_only",
        "disable_weight_only_quant_plugin",
        "use_qserve",
        "per_channel",
        "per_token",
        "int8_kv_cache",
        "fp8_kv_cache",
        "use_fp8",
        "use_nvfp4",
        "use_fp8_rowwise",
        "use_meta_fp8_rowwise_recipe",
        "per_group",
        "load_by_shard",
        "load_model_on_cpu",
        "use_parallel_embedding",
        "save_config_only",
        "remove_duplicated_kv_heads",
    ),
]
CONVERT_CHECKPOINT_FLAGS = {f.name: f for f in _CONVERT}

# --- examples/models/core/qwen/convert_checkpoint.py, parse_arguments() (Qwen, Qwen2, Qwen2.5) ---------
_QWEN_CONVERT = [
    *_flags("str", "model_dir", "calib_dataset", "output_dir"),
    *_flags(
        "int",
        "tp_size",
        "pp_size",
        "cp_size",
        "group_size",
        "workers",
        "moe_tp_size",
        "moe_ep_size",
    ),
    Flag("smoothquant", "float"),
    Flag("dtype", "choice", _WEIGHT_DTYPES),
    Flag("weight_only_precision", "choice", ("int8", "int4", "int4_gptq")),
    Flag("embedding_sharding_dim", "choice", ("0", "1")),
    *_flags(
        "store_true",
        "use_weight_only",
        "disable_weight_only_quant_plugin",
        "per_channel",
        "per_token",
        "int8_kv_cache",
        "per_group",
        "load_model_on_cpu",
        "use_parallel_embedding",
    ),
]
QWEN_CONVERT_CHECKPOINT_FLAGS = {f.name: f for f in _QWEN_CONVERT}

# --- examples/models/core/gemma/convert_checkpoint.py, parse_arguments() (Gemma, Gemma 2, Gemma 3 text) -----
# Its own CLI: dashed names (--model-dir, --output-model-dir, --world-size), tensor parallelism only.
_GEMMA_CONVERT = [
    Flag("ckpt-type", "choice", ("jax", "keras", "torch", "hf")),
    *_flags(
        "str", "model-dir", "output-model-dir", "quant_ckpt_path", "calib_dataset", "tokenizer_dir"
    ),
    Flag("world-size", "int"),
    Flag("smoothquant", "float"),
    Flag("dtype", "choice", _WEIGHT_DTYPES),
    Flag("weight_only_precision", "choice", ("int8", "int4", "w4a8_awq", "w4a16_awq")),
    *_flags(
        "store_true",
        "use_weight_only",
        "use-int8-weight-only-embedding",
        "enable_fp8",
        "fp8_kv_cache",
        "use_smooth_quant",
        "int8_kv_cache",
        "per_channel",
        "per_token",
        "load_model_on_cpu",
    ),
]
GEMMA_CONVERT_CHECKPOINT_FLAGS = {f.name: f for f in _GEMMA_CONVERT}

# --- examples/models/core/phi/convert_checkpoint.py, parse_arguments() (Phi-2, Phi-3, Phi-3.5, Phi-4) ------
_PHI_CONVERT = [
    *_flags("str", "model_dir", "output_dir"),
    *_flags("int", "tp_size", "pp_size", "moe_tp_size", "moe_ep_size", "workers"),
    Flag("dtype", "choice", _WEIGHT_DTYPES),
    Flag("weight_only_precision", "choice", ("int8", "int4")),
    Flag("use_weight_only", "store_true"),
]
PHI_CONVERT_CHECKPOINT_FLAGS = {f.name: f for f in _PHI_CONVERT}

# --- examples/quantization/quantize.py (ModelOpt's quantize-and-export path) -------------------
_QUANTIZE = [
    *_flags(
        "str",
        "model_dir",
        "nemo_ckpt_path",
        "calib_dataset",
        "output_dir",
        "medusa_hidden_act",
        "medusa_model_dir",
        "autoq_format",
    ),
    *_flags(
        "int",
        "calib_tp_size",
        "calib_pp_size",
        "seed",
        "tokenizer_max_seq_length",
        "batch_size",
        "calib_size",
        "calib_max_seq_length",
        "tp_size",
        "pp_size",
        "cp_size",
        "awq_block_size",
        "num_medusa_heads",
        "num_medusa_layers",
        "max_draft_len",
    ),
    Flag("auto_quantize_bits", "float"),
    Flag("decoder_type", "choice", ("gptnext", "llama")),
    Flag("device", "choice", ("cuda", "cpu")),
    Flag("device_map", "choice", ("auto", "sequential", "cpu", "gpu")),
    Flag("dtype", "choice", _WEIGHT_DTYPES),
    Flag(
        "qformat",
        "choice",
        ("nvfp4", "fp8", "int8_sq", "int4_awq", "w4a8_awq", "int8_wo", "int4_wo", "full_prec"),
    ),
    Flag("kv_cache_dtype", "choice", ("int8", "fp8")),
    *_flags("store_true", "quantize_lm_head", "quant_medusa_head"),
]
QUANTIZE_FLAGS = {f.name: f for f in _QUANTIZE}

# Tool names as the argv ends them (`.../llama/convert_checkpoint.py`): the converters share a file name.
HF_LORA_CONVERT_FLAGS = {
    f.name: f
    for f in (
        Flag("out-dir", "str"),
        Flag("in-file", "str"),
        Flag("verbose", "store_true"),
        Flag("storage-type", "choice", ("float32", "float16", "bfloat16")),
    )
}

TOOL_FLAGS = {
    "trtllm-build": TRTLLM_BUILD_FLAGS,
    "llama/convert_checkpoint.py": CONVERT_CHECKPOINT_FLAGS,
    "qwen/convert_checkpoint.py": QWEN_CONVERT_CHECKPOINT_FLAGS,
    "gemma/convert_checkpoint.py": GEMMA_CONVERT_CHECKPOINT_FLAGS,
    "phi/convert_checkpoint.py": PHI_CONVERT_CHECKPOINT_FLAGS,
    "quantize.py": QUANTIZE_FLAGS,
    LORA_CONVERT_SCRIPT: HF_LORA_CONVERT_FLAGS,
}


def tool_of(argv: list[str]) -> tuple[str, list[str]]:
    """Which tool an argv runs and its arguments: `trtllm-build ...` or `python3 SCRIPT ...`."""
    for index, token in enumerate(argv[:2]):
        for tool in TOOL_FLAGS:
            if token == tool or token.endswith("/" + tool):
                return tool, argv[index + 1 :]
    raise EngineBuildError(
        f"not a TensorRT-LLM tool command: {argv[:2]}",
        hint="this is a bug in the toolkit's command builder",
    )


def check_argv(argv: list[str]) -> None:
    """Refuse an argv with a flag or value that the pinned release's tool would reject."""
    tool, args = tool_of(argv)
    flags = TOOL_FLAGS[tool]
    i = 0
    while i < len(args):
        token = args[i]
        flag = flags.get(token[2:]) if token.startswith("--") else None
        if flag is None:
            raise EngineBuildError(
                f"{tool} of TensorRT-LLM {PINNED_TRTLLM_VERSION} has no flag {token!r}",
                hint="this is a bug in the toolkit's command builder",
            )
        i += 1 if flag.kind == "store_true" else _check_value(tool, flag, args[i + 1 : i + 2]) + 1
        if flag.kind == "nargs+":
            while i < len(args) and not args[i].startswith("--"):
                _check_value(tool, flag, args[i : i + 1])
                i += 1


def _check_value(tool: str, flag: Flag, value: list[str]) -> int:
    if not value or value[0].startswith("--"):
        raise EngineBuildError(
            f"{tool} --{flag.name} needs a value",
            hint="this is a bug in the toolkit's command builder",
        )
    text = value[0]
    ok = {
        "int": lambda: text.lstrip("-").isdigit(),
        "float": lambda: _is_float(text),
        "choice": lambda: text in flag.choices,
        "nargs+": lambda: not flag.choices or text in flag.choices,
    }.get(flag.kind, lambda: True)()
    if not ok:
        raise EngineBuildError(
            f"{tool} --{flag.name} {text!r} is not accepted by TensorRT-LLM {PINNED_TRTLLM_VERSION}",
            hint=f"allowed: {', '.join(flag.choices) or flag.kind}",
        )
    return 1


def _is_float(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True
