"""Fake examples/hf_lora_convert.py: the pinned release's flags (the upstream record), and the outputs the
record describes: <out-dir>/model.lora_weights.npy [1, N, max_row] in --storage-type (a row: lora_A
[r, in] flattened, then lora_B x alpha / r [out, r] flattened, zero-padded) and model.lora_config.npy
int32 [1, N, 3] (module id, layer, r), module ids from the record's map."""

import json
import re
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np
from safetensors.numpy import load_file
from upstream_argparse import RECORD, upstream_parser

TOOL = "hf_lora_convert.py"
KEY = re.compile(r".*\.layers\.([0-9]+)\.(self_attn|mlp)\.([a-z_]+)\.lora_(A|B)\.weight")
STORAGE = {
    "float32": np.float32,
    "float16": np.float16,
    "bfloat16": np.float32,
}  # bf16: see _stored


def _module_ids() -> dict[str, int]:
    record = json.loads(RECORD.read_text())[TOOL]
    trtllm = record["hf_modules_to_trtllm_modules"]
    ids = dict(item.split(" ") for item in record["module_ids"].split(": ", 1)[1].split(", ")[:8])
    return {hf: int(ids[name]) for hf, name in trtllm.items() if name in ids}


def _stored(rows: np.ndarray, storage: str) -> np.ndarray:
    """bfloat16 as TensorRT-LLM's torch_to_numpy writes it: the upper 16 bits, as 2-byte void."""
    if storage != "bfloat16":
        return rows.astype(STORAGE[storage])
    bits = rows.astype(np.float32).view(np.uint32) >> 16
    return bits.astype(np.uint16).view(np.dtype("V2"))


def main() -> None:
    args = upstream_parser(TOOL).parse_args(sys.argv[1:])
    adapter = Path(args.in_file)
    config = json.loads((adapter / "adapter_config.json").read_text())
    scale = config["lora_alpha"] / config["r"]
    tensors = load_file(adapter / "adapter_model.safetensors")
    layers: dict[int, dict[str, dict[str, np.ndarray]]] = defaultdict(lambda: defaultdict(dict))
    for key, value in tensors.items():
        match = KEY.match(key)
        if match:
            layers[int(match[1])][match[3]][match[4]] = value.astype(np.float32)
    ids = _module_ids()
    rows, rows_config = [], []
    for layer, modules in layers.items():
        for module, pair in modules.items():
            rank = pair["A"].shape[0]
            rows.append(np.concatenate([pair["A"].ravel(), (pair["B"] * scale).ravel()]))
            rows_config.append([ids[module], layer, rank])
    width = max(len(r) for r in rows)
    weights = np.stack([np.pad(r, (0, width - len(r))) for r in rows])[None]
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    np.save(out / "model.lora_weights.npy", _stored(weights, args.storage_type))
    np.save(out / "model.lora_config.npy", np.array(rows_config, dtype=np.int32)[None])


main()
