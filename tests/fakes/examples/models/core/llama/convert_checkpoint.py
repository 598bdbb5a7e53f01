"""Fake examples/models/core/llama/convert_checkpoint.py: the pinned release's flags, a checkpoint folder out."""

import sys

from fake_checkpoint import parse, write_checkpoint

args = parse("llama/convert_checkpoint.py", sys.argv[1:])
# A pre-quantized checkpoint keeps its quantization (the flags say which: tests/data/upstream/trtllm_tools.json).
QUANT = "FP8" if args.use_fp8 else ("NVFP4" if args.use_nvfp4 else None)
if args.use_weight_only and args.weight_only_precision == "int4_gptq":
    QUANT = "W4A16_GPTQ"
write_checkpoint(args, QUANT, "FP8" if args.fp8_kv_cache else None)
