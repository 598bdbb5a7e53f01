"""Shared by the fake converter and quantizer: write a TensorRT-LLM checkpoint folder like the real ones.

A real checkpoint: config.json (the PretrainedConfig: architecture, dtype, shapes, quantization,
mapping) and one rank{N}.safetensors per rank.
"""

import json
import sys
from pathlib import Path

from upstream_argparse import upstream_parser


def parse(tool: str, argv: list[str]):
    """argparse exits 2 on an unknown flag or value, like the real tool (the upstream record, not our lists)."""
    return upstream_parser(tool).parse_args(argv)


def write_checkpoint(args, quant_algo, kv_algo) -> None:
    model_dir = Path(args.model_dir)
    if not list(model_dir.glob("*.safetensors")):
        sys.exit(f"no safetensors weights in {model_dir}")
    hf = json.loads((model_dir / "config.json").read_text())
    tp, pp = args.tp_size or 1, args.pp_size or 1
    out = Path(args.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    config = {
        "architecture": hf["architectures"][0],
        "dtype": args.dtype if args.dtype not in (None, "auto") else "bfloat16",
        "vocab_size": hf["vocab_size"],
        "hidden_size": hf["hidden_size"],
        "num_hidden_layers": hf["num_hidden_layers"],
        "num_attention_heads": hf["num_attention_heads"],
        "num_key_value_heads": hf.get("num_key_value_heads", hf["num_attention_heads"]),
        "intermediate_size": hf["intermediate_size"],
        "max_position_embeddings": hf.get("max_position_embeddings", 4096),
        "quantization": {"quant_algo": quant_algo, "kv_cache_quant_algo": kv_algo},
        "mapping": {"world_size": tp * pp, "tp_size": tp, "pp_size": pp},
    }
    (out / "config.json").write_text(json.dumps(config, indent=2))
    for rank in range(tp * pp):
        (out / f"rank{rank}.safetensors").write_bytes(b"fake weights")
