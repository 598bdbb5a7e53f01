#!/usr/bin/env python3
"""Write trtllm_bench_published.json: NVIDIA's published TensorRT-LLM throughput rows for H100.

The tables in published/*.md are the markdown table lines of ``docs/source/performance/perf-overview.md``
in NVIDIA/TensorRT-LLM, copied as they stand in the stored revisions named in SOURCES
(only the Llama 3.1 8B / 70B sections).  This script parses them and keeps the H100
columns, so each number in the JSON can be traced back to a line there and a column
header upstream.  Nothing is computed except ``output_tokens_per_s_per_gpu`` (= total / tp).

Run with any Python 3.9+:  python3 perf/reference/make_published_reference.py [--out FILE]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

HERE = Path(__file__).resolve().parent
TABLES = HERE / "published"  # the upstream markdown rows, one file per table


def _table(name: str) -> str:
    return (TABLES / name).read_text(encoding="utf-8")


# ----------------------------------------------------------------------------- sources

SOURCES = {
    "v0.17": {
        "repo": "NVIDIA/TensorRT-LLM",
        "path": "docs/source/performance/perf-overview.md",
        "revision": "release 0.17 text: 'All data in the table below was generated using version 0.17 and "
        "presents token throughput in tokens/second.'",
        "commit": None,
        "commit_note": "read from the stored-code index (file id 859048245), which does not name the commit; "
        "the same page (intro text, v0.17 GH200 note) is what the 0.18.2 docs site serves: "
        "https://nvidia.github.io/TensorRT-LLM/0.18.2/performance/perf-overview.html. Expected "
        "upstream location: https://github.com/NVIDIA/TensorRT-LLM/blob/v0.17.0/docs/source/"
        "performance/perf-overview.md (not verified against the tag)",
        "backend": "TensorRT (engine flow): `trtllm-bench --model $model_name build --tp_size $tp_size "
        "--pp_size $pp_size --quantization FP8 --dataset $dataset_file`, then `trtllm-bench --model "
        "$model_name throughput --dataset $dataset_file --engine_dir $engine_dir` (usually with "
        "--kv_cache_free_gpu_mem_fraction 0.95, 0.90 on OOM)",
        "throughput_meaning": "Token Throughput (tokens/sec) printed by trtllm-bench throughput: OUTPUT tokens "
        "per second of the WHOLE engine (all TP GPUs), offline max-throughput (all "
        "requests queued at once, infinite rate), prefill time included; the doc's own "
        "example (3000 req x 128 out / 16.406 s = 23,406 = 'Token Throughput') confirms "
        "output tokens",
        "dataset": "synthetic, fixed ISL/OSL (stdev 0); 30000 req for 128/128, 3000 for 2048/128, 1000/1000, "
        "128/2048, 500/2000; 1500 for 128/4096, 2048/2048, 5000/500; 1000 for 20000/2000",
        "precision": "FP8 weights + FP8 KV cache (trtllm-bench build --quantization FP8)",
        "hardware": "H100 80GB HBM3 (SXM)",
    },
    "v0.14.0": {
        "repo": "NVIDIA/TensorRT-LLM",
        "path": "docs/source/performance/perf-overview.md",
        "revision": "release 0.14.0 text: 'All data in the table below was generated using version 0.14.0'",
        "commit": None,
        "commit_note": "stored-code index file id 5710131192 (commit not named); the identical table is in the "
        "fork arthurrasmusson/TensorRT-LLM at e00d4e6564921307dd264b61fe1d46f116095e0e",
        "backend": "TensorRT (engine flow), same trtllm-bench build + throughput commands as v0.17 "
        "(FP16 engines: --quantization omitted)",
        "throughput_meaning": "output tokens/s of the whole engine (all TP GPUs), offline max throughput",
        "precision": "columns 'H100 80GB HBM3 FP8' and 'H100 80GB HBM3 FP16' (FP16, not BF16)",
        "hardware": "H100 80GB HBM3 (SXM)",
    },
    "v0.20": {
        "repo": "dominicshanshan/TensorRT-LLM (fork of NVIDIA/TensorRT-LLM)",
        "path": "docs/source/performance/perf-overview.md",
        "revision": "v0.20 text: 'The data collected for the v0.20 benchmarks was run with the following file'",
        "commit": "ab4143e1d3c82df550f0d5673090a8feee84c7bd",
        "commit_note": "fork commit; the docs site page https://nvidia.github.io/TensorRT-LLM/0.20.0/performance/"
        "perf-overview.html carries the same tables",
        "backend": "PyTorch (NOT the TensorRT engine flow): 'Starting with v0.19, testing was performed using "
        "the PyTorch backend'; `trtllm-bench --model $model_name throughput --dataset $dataset_file "
        "--backend pytorch --extra_llm_api_options llm_options.yml` (CUDA graphs, padding)",
        "throughput_meaning": "'Total Output Throughput (tokens/sec)': output tokens/s of the whole engine "
        "(all TP GPUs), offline max throughput",
        "precision": "FP8 checkpoints nvidia/Llama-3.1-8B-Instruct-FP8 and nvidia/Llama-3.3-70B-Instruct-FP8 "
        "(the 70B table is Llama 3.3 70B, same architecture as 3.1 70B)",
        "hardware": "H100 80GB HBM3 (SXM)",
    },
    "v0.14.0-serving": {
        "repo": "NVIDIA/TensorRT-LLM",
        "path": "docs/source/performance/perf-overview.md",
        "revision": "section 'Online Serving Measurements' of the release 0.17 revision above (file id "
        "859048245): 'All data in the table below was generated using version 0.14.0, with 500 "
        "requests and BF16 precision.'",
        "commit": None,
        "commit_note": "see v0.17",
        "backend": "TensorRT engine served by the Triton TensorRT-LLM backend (tensorrtllm_backend)",
        "throughput_meaning": "'Output Tput (tok/s)' = output tokens/s of the whole engine; 'Total Token Tput' "
        "= input + output tokens/s; TTFT/ITL are means in ms",
        "precision": "BF16",
        "hardware": "H100 80GB HBM3 (SXM)",
    },
}

# ----------------------------------------------------------------------------- tables (verbatim rows)

# v0.17: columns after the 3 label columns: H200 FP8 | H100 FP8 | GH200 FP8 | L40S FP8 | A100 FP16
V017_COLUMNS = ["H200 FP8", "H100 FP8", "GH200 FP8", "L40S FP8", "A100 FP16"]
V017 = _table("v0.17-perf-overview.md")

# v0.14.0: H200 FP8 | H100 FP8 | H100 FP16 | A100-SXM4 FP16 | A100-PCIE FP16 | L40S FP8
V014_COLUMNS = [
    "H200 FP8",
    "H100 FP8",
    "H100 FP16",
    "A100-SXM4-80GB FP16",
    "A100-PCIE-80GB FP16",
    "L40S FP8",
]
V014 = _table("v0.14.0-perf-overview.md")

# v0.20 (PyTorch backend).  8B: H200 TP1 | H100 TP1.  70B (Llama 3.3): H200 TP1,2,4,8 | H100 TP1,2,4,8
V020_8B_COLUMNS = [("H200", 1), ("H100", 1)]
V020_8B = _table("v0.20-llama-3.1-8b.md")
V020_70B_COLUMNS = [
    ("H200", 1),
    ("H200", 2),
    ("H200", 4),
    ("H200", 8),
    ("H100", 1),
    ("H100", 2),
    ("H100", 4),
    ("H100", 8),
]
V020_70B = _table("v0.20-llama-3.3-70b.md")

# v0.14.0 online serving (Triton), H100 rows only.  Columns:
# Model | GPU | TP | Input Length | Output Length | QPS | Tput(req/s) | Mean TTFT(ms) | Mean ITL(ms) |
# Total Token Tput (tok/s) | Output Tput (tok/s)
SERVING_H100 = _table("v0.14.0-serving-h100.md")

MODEL_NAMES = {
    "LLaMA v3.1 8B": "Llama-3.1-8B",
    "LLaMA v3.1 70B": "Llama-3.1-70B",
    "LLaMA 3.1 8B": "Llama-3.1-8B",
    "LLaMA 3.1 70B": "Llama-3.1-70B",
}


# ----------------------------------------------------------------------------- parsing


def _cells(line: str) -> list[str]:
    """Split one markdown table row into cells, keeping empty ones (a blank cell repeats the one above)."""
    line = line.strip()
    line = line[1:] if line.startswith("|") else line
    line = line[:-1] if line.endswith("|") else line
    return [c.strip() for c in line.split("|")]


def _num(text: str) -> float | None:
    text = text.replace(",", "").strip()
    return float(text) if text else None


def _seq(text: str) -> tuple[int, int]:
    isl, osl = (int(x) for x in text.replace("/", ",").split(","))
    return isl, osl


def _grouped(table: str, columns: list[str], source: str, keep: set[str]) -> list[dict]:
    """Parse a 'Model | TP | ISL,OSL | values...' table (v0.17 layout) or 'Model | ISL/OSL | TP | values' (v0.14)."""
    rows, model, tp, seq = [], None, None, None
    for line in table.strip().splitlines():
        cells = _cells(line)
        if source == "v0.17":
            m, t, s, values = cells[0], cells[1], cells[2], cells[3:]
        else:  # v0.14.0: model | isl/osl | tp
            m, s, t, values = cells[0], cells[1], cells[2], cells[3:]
        model = m or model
        tp = int(t) if t else tp
        seq = _seq(s) if s else seq
        for col, val in zip(columns, values, strict=False):
            if col not in keep:
                continue
            gpu, precision = col.split(" ", 1)
            tokens = _num(val)
            rows.append(
                {
                    "source": source,
                    "model": MODEL_NAMES[model],
                    "gpu": "H100 SXM 80GB",
                    "precision": precision,
                    "tp": tp,
                    "isl": seq[0],
                    "osl": seq[1],
                    "output_tokens_per_s": tokens,
                    "output_tokens_per_s_per_gpu": None
                    if tokens is None
                    else round(tokens / tp, 2),
                    "published_cell": val or "(empty)",
                    "column": col,
                }
            )
    return rows


def _v020(table: str, columns, model: str) -> list[dict]:
    rows = []
    for line in table.strip().splitlines():
        cells = _cells(line)
        isl, osl = _seq(cells[0])
        for (gpu, tp), val in zip(columns, cells[2:], strict=False):
            if gpu != "H100":
                continue
            tokens = _num(val)
            rows.append(
                {
                    "source": "v0.20",
                    "model": model,
                    "gpu": "H100 SXM 80GB",
                    "precision": "FP8",
                    "tp": tp,
                    "isl": isl,
                    "osl": osl,
                    "output_tokens_per_s": tokens,
                    "output_tokens_per_s_per_gpu": None
                    if tokens is None
                    else round(tokens / tp, 2),
                    "published_cell": val or "(empty)",
                    "column": f"{gpu} TP{tp}",
                }
            )
    return rows


def _serving(table: str) -> list[dict]:
    rows, model, tp, isl, osl = [], None, None, None, None
    for line in table.strip().splitlines():
        c = _cells(line)
        model = MODEL_NAMES.get(c[0], model) if c[0] else model
        tp = int(c[2]) if c[2] else tp
        isl = int(c[3]) if c[3] else isl
        osl = int(c[4]) if c[4] else osl
        rows.append(
            {
                "source": "v0.14.0-serving",
                "model": model,
                "gpu": "H100 SXM 80GB",
                "precision": "BF16",
                "tp": tp,
                "isl": isl,
                "osl": osl,
                "qps": c[5],
                "throughput_req_per_s": _num(c[6]),
                "mean_ttft_ms": _num(c[7]),
                "mean_itl_ms": _num(c[8]),
                "total_token_tokens_per_s": _num(c[9]),
                "output_tokens_per_s": _num(c[10]),
            }
        )
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--out",
        default=str(
            HERE.parent.parent / "tests" / "data" / "reference" / "trtllm_bench_published.json"
        ),
    )
    args = ap.parse_args(argv)
    rows = (
        _grouped(V017, V017_COLUMNS, "v0.17", {"H100 FP8"})
        + _grouped(V014, V014_COLUMNS, "v0.14.0", {"H100 FP8", "H100 FP16"})
        + _v020(V020_8B, V020_8B_COLUMNS, "Llama-3.1-8B")
        + _v020(V020_70B, V020_70B_COLUMNS, "Llama-3.3-70B")
    )
    record = {
        "description": "NVIDIA-published trtllm-bench (offline max-throughput) numbers for H100 SXM, Llama 3.1 "
        "8B / 70B. Primary reference for the TensorRT engine flow: source 'v0.17' (last release "
        "measured with engines; v0.19+ switched to the PyTorch backend). Empty published cells "
        "are kept with output_tokens_per_s null.",
        "sources": SOURCES,
        "field_meaning": {
            "output_tokens_per_s": "as published: output tokens/s of the whole engine (all tp GPUs), offline "
            "max-throughput run, prefill included (not per GPU)",
            "output_tokens_per_s_per_gpu": "output_tokens_per_s / tp (computed here)",
            "published_cell": "the table cell exactly as printed",
        },
        "rows": rows,
        "serving_rows": _serving(SERVING_H100),
        "generator": "perf/reference/make_published_reference.py",
    }
    Path(args.out).write_text(json.dumps(record, indent=1) + "\n")
    n = sum(r["output_tokens_per_s"] is not None for r in rows)
    print(
        f"wrote {args.out}: {len(rows)} throughput rows ({n} with a number), "
        f"{len(record['serving_rows'])} serving rows"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
