"""Fake examples/models/core/qwen/convert_checkpoint.py: the pinned release's flags, a checkpoint folder out."""

import sys

from fake_checkpoint import parse, write_checkpoint

args = parse("qwen/convert_checkpoint.py", sys.argv[1:])
write_checkpoint(args, None, "INT8" if args.int8_kv_cache else None)
