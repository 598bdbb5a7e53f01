"""Fake trtllm-build: parses the pinned release's flags, writes an engine folder shaped like the real one.

Real layout (tensorrt_llm/builder.py, Engine.save): config.json with "version", "pretrained_config"
(the checkpoint's config, mapping included) and "build_config" (limits, kv_cache_type,
plugin_config), and one rank{N}.engine per rank. Like the real builder it turns paged context FMHA
off where the upstream record's builder rule says so, and saves its timing cache to
--output_timing_cache (default model.cache, in the working directory).

FAKE_TRTLLM_SLEEP_S makes it write its pid to FAKE_TRTLLM_PID_FILE and sleep that long first (a
long build, for tests that stop one).
"""

import json
import os
import sys
import time
from pathlib import Path

import tensorrt_llm  # the fake package on PYTHONPATH in tests; the real one in NVIDIA's container
from upstream_argparse import RECORD, upstream_flags, upstream_parser

PLUGIN_KEYS = (
    "gpt_attention_plugin",
    "gemm_plugin",
    "context_fmha",
    "remove_input_padding",
    "use_paged_context_fmha",
    "use_fp8_context_fmha",
    "multiple_profiles",
    "use_fused_mlp",
    "tokens_per_block",
)


def main() -> None:
    # the upstream record, not our lists
    args = upstream_parser("trtllm-build").parse_args(sys.argv[1:])
    calls = os.environ.get("FAKE_TRTLLM_CALLS")
    if calls:
        with open(calls, "a") as log:
            log.write(json.dumps(sys.argv[1:]) + "\n")
    sleep_s = float(os.environ.get("FAKE_TRTLLM_SLEEP_S", "0"))
    if sleep_s:
        Path(os.environ["FAKE_TRTLLM_PID_FILE"]).write_text(str(os.getpid()))
        time.sleep(sleep_s)
    checkpoint = Path(args.checkpoint_dir)
    pretrained = json.loads((checkpoint / "config.json").read_text())
    if args.max_input_len and args.max_seq_len and args.max_input_len > args.max_seq_len:
        sys.exit("max_input_len must not exceed max_seq_len")
    plugins = {key: getattr(args, key) for key in PLUGIN_KEYS}
    for key in ("gpt_attention_plugin", "gemm_plugin"):
        if plugins[key] == "auto":
            # the real builder resolves "auto" to the model dtype
            plugins[key] = pretrained["dtype"]
    if _paged_context_fmha_turned_off(pretrained.get("quantization") or {}):
        plugins["use_paged_context_fmha"] = "disable"
    build_config = {
        "max_input_len": args.max_input_len,
        "max_seq_len": args.max_seq_len,
        "max_batch_size": args.max_batch_size,
        "max_beam_width": args.max_beam_width,
        "max_num_tokens": args.max_num_tokens,
        "opt_num_tokens": None,
        "kv_cache_type": (args.kv_cache_type or "paged").upper(),
        "plugin_config": plugins,
    }
    out = Path(args.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    config = {
        "version": tensorrt_llm.__version__,
        "pretrained_config": pretrained,
        "build_config": build_config,
    }
    (out / "config.json").write_text(json.dumps(config, indent=2))
    world_size = pretrained["mapping"]["world_size"]
    for rank in range(world_size):
        (out / f"rank{rank}.engine").write_bytes(b"fake engine")
    # The record's default (model.cache) when not given: relative, so in the working directory.
    timing_cache = (
        args.output_timing_cache or upstream_flags("trtllm-build")["output_timing_cache"]["default"]
    )
    Path(timing_cache).write_bytes(b"fake timing cache")


def _paged_context_fmha_turned_off(quantization: dict) -> bool:
    """The builder's rule, as the upstream record transcribes it (not the toolkit's own reasoning)."""
    rule = json.loads(RECORD.read_text())["trtllm-build"]["builder_rules"][
        "paged_context_fmha_with_fp8_kv_cache"
    ]
    fp8_kv = quantization.get("kv_cache_quant_algo") == "FP8"
    return fp8_kv and quantization.get("quant_algo") not in rule["quant_algos"]


main()
