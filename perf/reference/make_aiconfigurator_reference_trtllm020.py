#!/usr/bin/env python3
"""Supplementary AIConfigurator record on TensorRT-LLM 0.20.0 kernel data (H100 SXM).

AIConfigurator 0.12.0 (see make_aiconfigurator_reference.py) ships H100 SXM / TensorRT-LLM tables for
1.3.0rc20 only.  The newest release that still ships the TensorRT-LLM **0.20.0** tables
for H100 SXM is aiconfigurator 0.4.0 (0.5.0 onward: 1.0.0rc3 / 1.2.0rc5).  0.4.0 has no
``cli estimate``; this script drives its SDK directly (InferenceSession.run_agg and
run_static, which is what its ``cli default`` sweep calls per configuration) over the
same matrix as make_aiconfigurator_reference.py, and writes one JSON.

    python3 -m venv /tmp/aic04 && /tmp/aic04/bin/pip install aiconfigurator==0.4.0
    python3 perf/reference/make_aiconfigurator_reference_trtllm020.py            # re-executes itself in /tmp/aic04

Models are 0.4.0's built-in entries (LLAMA3.1_8B, QWEN2.5_7B, LLAMA3.1_70B), whose shapes
match the catalog configs (layers, heads, kv heads, hidden, intermediate, vocab).

Quirk handled here: 0.4.0's TRT-LLM backend caches run_agg results keyed only by
(isl, osl, batch, ctx_tokens) -- not by model or quantisation -- so a fresh backend
object is made for every point.
"""

from __future__ import annotations

import argparse
import importlib.metadata as md
import json
import os
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.dont_write_bytecode = True  # keep this folder free of __pycache__
sys.path.insert(0, str(HERE))
from make_aiconfigurator_reference import (  # noqa: E402  (same matrix, same record source)
    BATCHES,
    DTYPES,
    REPO,
    SEQ_LENS,
    _plain,
    aiconfigurator_source,
    matrix_point,
)

DEFAULT_VENV_PYTHON = "/tmp/aic04/bin/python"
SYSTEM, BACKEND, VERSION = "h100_sxm", "trtllm", "0.20.0"
MODELS = [
    ("Llama-3.1-8B-Instruct", "LLAMA3.1_8B", {"bf16": [1], "fp8": [1]}),
    ("Qwen2.5-7B-Instruct", "QWEN2.5_7B", {"bf16": [1], "fp8": [1]}),
    ("Llama-3.1-70B-Instruct", "LLAMA3.1_70B", {"bf16": [1, 2, 4, 8], "fp8": [1, 2, 4, 8]}),
]


def _ensure(python: str) -> None:
    try:
        import aiconfigurator  # noqa: F401

        if md.version("aiconfigurator") != "0.4.0":
            raise ImportError
    except ImportError:
        if os.environ.get("_AIC_REEXEC") or not Path(python).exists():
            sys.exit(
                "needs aiconfigurator==0.4.0; create it: python3 -m venv /tmp/aic04 && "
                "/tmp/aic04/bin/pip install aiconfigurator==0.4.0"
            )
        os.execve(
            python,
            [python, str(Path(__file__).resolve()), *sys.argv[1:]],
            dict(os.environ, _AIC_REEXEC="1"),
        )


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--python", default=DEFAULT_VENV_PYTHON)
    ap.add_argument(
        "--out",
        default=str(
            REPO / "tests" / "data" / "reference" / "aiconfigurator_h100_sxm_trtllm0.20.0.json"
        ),
    )
    args = ap.parse_args(argv)
    _ensure(args.python)

    import logging

    logging.disable(logging.WARNING)
    from aiconfigurator.sdk import common, config
    from aiconfigurator.sdk.backends.factory import get_backend
    from aiconfigurator.sdk.inference_session import InferenceSession
    from aiconfigurator.sdk.models import get_model
    from aiconfigurator.sdk.perf_database import get_database

    database = get_database(SYSTEM, BACKEND, VERSION)
    points, started = [], time.time()
    for model, name, tps in MODELS:
        for dtype, quant in DTYPES.items():
            for tp in tps[dtype]:
                for isl, osl in SEQ_LENS:
                    for batch in BATCHES:
                        mc = config.ModelConfig(
                            tp_size=tp,
                            gemm_quant_mode=common.GEMMQuantMode[
                                "float16"
                                if quant["gemm_quant_mode"] == "bfloat16"
                                else quant["gemm_quant_mode"]
                            ],
                            kvcache_quant_mode=common.KVCacheQuantMode[
                                "float16" if quant["kvcache_quant_mode"] == "bfloat16" else "fp8"
                            ],
                            fmha_quant_mode=common.FMHAQuantMode[
                                "float16" if quant["fmha_quant_mode"] == "bfloat16" else "fp8"
                            ],
                        )
                        point = {
                            "model": model,
                            "aic_model_name": name,
                            **matrix_point(dtype, tp, isl, osl, batch),
                            "quant": {
                                "gemm": mc.gemm_quant_mode.name,
                                "kvcache": mc.kvcache_quant_mode.name,
                                "fmha": mc.fmha_quant_mode.name,
                            },
                        }
                        rc = config.RuntimeConfig(batch_size=batch, isl=isl, osl=osl)
                        session = InferenceSession(
                            get_model(name, mc, BACKEND), database, get_backend(BACKEND)
                        )
                        try:
                            agg = session.run_agg(rc, ctx_tokens=isl)
                            static = session.run_static(rc, "static")
                        except Exception as exc:  # noqa: BLE001 - recorded as data
                            point.update(
                                status="error",
                                error={"type": type(exc).__name__, "message": str(exc)},
                            )
                            points.append(point)
                            continue
                        a = agg.get_summary_df().iloc[0].to_dict()
                        s = static.get_summary_df().iloc[0].to_dict()
                        point.update(
                            status="oom" if agg.check_oom() else "ok",
                            oom_note="AIC 0.4.0 flags memory > 80 GiB (weights + kv for batch*(isl+osl) + "
                            "activations + others) but still returns latencies"
                            if agg.check_oom()
                            else None,
                            ttft_ms=a["ttft"],
                            tpot_ms=a["tpot"],
                            output_tokens_per_s=a["tokens/s"],
                            output_tokens_per_s_per_gpu=a["tokens/s/gpu"],
                            memory_gib_per_gpu=a["memory"],
                            static={
                                "context_latency_ms": s["ttft"],
                                "tpot_ms": s["tpot"],
                                "output_tokens_per_s": s["tokens/s"],
                                "context_ops_ms": static.get_context_latency_dict(),
                                "generation_ops_total_ms": static.get_generation_latency_dict(),
                            },
                        )
                        points.append(point)
                        print(
                            f"{point['status']} {model} {dtype} tp{tp} {isl}/{osl} b{batch}: "
                            f"ttft {a['ttft']:.2f} tpot {a['tpot']:.3f} {a['tokens/s']:.1f} tok/s",
                            file=sys.stderr,
                        )
    record = {
        "source": aiconfigurator_source(
            {
                "backend": BACKEND,
                "backend_version": VERSION,
                "system": SYSTEM,
                "how": "aiconfigurator.sdk: InferenceSession(get_model(NAME, ModelConfig(tp_size, gemm/kvcache/fmha "
                "quant), 'trtllm'), get_database('h100_sxm','trtllm','0.20.0'), get_backend('trtllm'))"
                ".run_agg(RuntimeConfig(batch_size, isl, osl), ctx_tokens=isl) for the top-level numbers; "
                ".run_static(same, 'static') for the 'static' block",
                "bf16_note": "0.4.0 names the 16-bit modes 'float16'; its H100 0.20.0 tables for them are the "
                "16-bit (bf16/fp16) kernels",
            },
            started,
            "perf/reference/make_aiconfigurator_reference_trtllm020.py",
        ),
        "field_meaning": "as in aiconfigurator_h100_sxm.json: agg-mode ttft_ms/tpot_ms, output_tokens_per_s for "
        "the whole engine (all tp GPUs, prefill steps included); static.context_latency_ms = one "
        "prefill of the whole batch",
        "points": points,
    }
    Path(args.out).write_text(json.dumps(_plain(record), indent=1) + "\n")
    print(f"wrote {args.out}: {len(points)} points", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
