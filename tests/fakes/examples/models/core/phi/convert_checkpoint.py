"""Fake examples/models/core/phi/convert_checkpoint.py: the pinned release's flags, a checkpoint folder out."""

import sys

from fake_checkpoint import parse, write_checkpoint

args = parse("phi/convert_checkpoint.py", sys.argv[1:])
if args.pp_size != 1:
    sys.exit("AssertionError: Pipeline parallelism is not supported.")  # as the real script asserts
write_checkpoint(args, None, None)
