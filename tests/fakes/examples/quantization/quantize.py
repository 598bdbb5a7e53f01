"""Fake examples/quantization/quantize.py (ModelOpt path): the pinned release's flags, a quantized checkpoint out.

Like the real one (tensorrt_llm/quantization/quantize_by_modelopt.py, get_calib_dataloader), it reads the
calibration set named by --calib_dataset: the hub's cnn_dailymail by default, which cannot be fetched
with the hub offline; a local folder's `text` column otherwise."""

import json
import os
import sys
from pathlib import Path

from fake_checkpoint import parse, write_checkpoint

QUANT_ALGO = {"fp8": "FP8", "int4_awq": "W4A16_AWQ", "full_prec": None}
OFFLINE = ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE")


def check_calibration_set(name: str) -> None:
    if not Path(name).is_dir():
        if any(os.environ.get(v, "").upper() in ("1", "ON", "YES", "TRUE") for v in OFFLINE):
            sys.exit(f"fake quantize.py: cannot download the calibration set {name!r} offline")
        return
    rows = [
        json.loads(line) for f in Path(name).glob("*.jsonl") for line in f.read_text().splitlines()
    ]
    if not rows or any("text" not in row for row in rows):
        sys.exit(f"fake quantize.py: {name} has no `text` column in its train split")


args = parse("quantize.py", sys.argv[1:])
if args.qformat not in QUANT_ALGO:
    sys.exit(f"fake quantize.py does not model --qformat {args.qformat}")
check_calibration_set(args.calib_dataset or "cnn_dailymail")  # upstream default
write_checkpoint(args, QUANT_ALGO[args.qformat], "FP8" if args.kv_cache_dtype == "fp8" else None)
