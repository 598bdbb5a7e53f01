"""Fake examples/models/core/gemma/convert_checkpoint.py: the pinned release's flags (its own dashed CLI, tensor
parallelism only), a checkpoint folder out."""

import sys
from types import SimpleNamespace

from fake_checkpoint import parse, write_checkpoint

args = parse("gemma/convert_checkpoint.py", sys.argv[1:])
if args.ckpt_type is None:
    sys.exit("--ckpt-type is required (CKPT_PARSER[None] fails in the real script)")
# The real script maps --world-size to tensor parallelism (pp_size=1).
ranks = SimpleNamespace(
    model_dir=args.model_dir,
    output_dir=args.output_model_dir,
    tp_size=args.world_size,
    pp_size=1,
    dtype=args.dtype,
)
write_checkpoint(ranks, "FP8" if args.enable_fp8 else None, "FP8" if args.fp8_kv_cache else None)
