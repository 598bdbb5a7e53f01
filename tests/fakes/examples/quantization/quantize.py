"""Fake examples/quantization/quantize.py (ModelOpt path): the pinned release's flags, a quantized checkpoint out."""

import sys

from fake_checkpoint import parse, write_checkpoint

QUANT_ALGO = {"fp8": "FP8", "int4_awq": "W4A16_AWQ", "full_prec": None}

args = parse("quantize.py", sys.argv[1:])
if args.qformat not in QUANT_ALGO:
    sys.exit(f"fake quantize.py does not model --qformat {args.qformat}")
write_checkpoint(args, QUANT_ALGO[args.qformat], "FP8" if args.kv_cache_dtype == "fp8" else None)
