"""Fake examples/models/core/llama/convert_checkpoint.py: the pinned release's flags, a checkpoint folder out."""

import sys

from fake_checkpoint import parse, write_checkpoint

args = parse("llama/convert_checkpoint.py", sys.argv[1:])
write_checkpoint(args, None, "FP8" if args.fp8_kv_cache else None)
