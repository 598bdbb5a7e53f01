#!/usr/bin/env python3
"""Build a reference record of NVIDIA AIConfigurator's estimates for H100 SXM / TensorRT-LLM.

AIConfigurator (PyPI ``aiconfigurator``) predicts TTFT, TPOT and throughput of an
LLM serving engine by summing per-operation latencies looked up in kernel tables
that NVIDIA measured on each GPU for a given backend version.  This script runs
its single-point estimator over a fixed matrix of models, dtypes, tensor-parallel
sizes, sequence lengths and batch sizes, and writes every number it returns to
one JSON file, so the toolkit's planner can be tested against an independent
model.  It computes nothing itself: every number in the output comes from
AIConfigurator (only unit/name normalisation and, where said, a division).

AIConfigurator needs numpy >= 2, so it lives in its own virtual environment::

    python3 -m venv /tmp/aic && /tmp/aic/bin/pip install 'aiconfigurator==0.12.0'
    python3 perf/reference/make_aiconfigurator_reference.py   # re-executes itself in /tmp/aic
    python3 perf/reference/make_aiconfigurator_reference.py --python /path/venv/bin/python --out x.json

It writes tests/data/reference/aiconfigurator_h100_sxm.json (about 6 minutes on 2 cores).
Never install aiconfigurator into the toolkit's own environment: it needs numpy >= 2, and the
Python backend's stub needs numpy < 2.

How each number is obtained (recorded again in the output's ``source``):

* ``agg`` block / top-level ttft_ms, tpot_ms, output_tokens_per_s: the Python
  API ``aiconfigurator.cli.api.cli_estimate(mode="agg", ...)``, which is what
  ``aiconfigurator cli estimate --estimate-mode agg`` calls and prints.  "agg" is
  aggregated in-flight batching: a steady state with ``batch`` concurrent
  requests, each engine step carrying one new request's prefill
  (``ctx_tokens`` = isl) plus the other requests' decode tokens.
* ``static`` block: the same API with ``mode="static"``: the whole batch is
  prefilled in one step (``context_latency_ms``), then decoded together
  (``generation_latency_ms``); no in-flight batching.  Cleaner for fitting
  prefill and decode separately.
* ``--cli-check N`` runs the real CLI for the first N points and stores its
  printed TTFT/TPOT/tokens/s next to the API's, as proof that they agree.

Models come from the toolkit's catalog (``toolkit/model/catalog/*.json``), whose
``config`` member is the Hugging Face ``config.json``; it is written unchanged to
a temporary folder that is handed to AIConfigurator as ``model_path``, so no hub
access is needed.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import itertools
import json
import math
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
DEFAULT_VENV_PYTHON = "/tmp/aic/bin/python"
REPO = HERE.parent.parent
DEFAULT_CATALOG = REPO / "toolkit" / "model" / "catalog"
DEFAULT_OUT = REPO / "tests" / "data" / "reference" / "aiconfigurator_h100_sxm.json"

SYSTEM = "h100_sxm"
BACKEND = "trtllm"

# (name in record, catalog file stem, tensor-parallel sizes per dtype)
MODELS = [
    ("Llama-3.1-8B-Instruct", "llama-3.1-8b-instruct", {"bf16": [1], "fp8": [1]}),
    ("Qwen2.5-7B-Instruct", "qwen2.5-7b-instruct", {"bf16": [1], "fp8": [1]}),
    # TP1 bf16 is included on purpose: AIConfigurator refuses it (weights > 80 GiB),
    # and the refusal is recorded.
    (
        "Llama-3.1-70B-Instruct",
        "llama-3.1-70b-instruct",
        {"bf16": [1, 2, 4, 8], "fp8": [1, 2, 4, 8]},
    ),
]
# dtype label -> quant-mode kwargs of cli_estimate (same names as the CLI flags)
DTYPES = {
    "bf16": {
        "gemm_quant_mode": "bfloat16",
        "kvcache_quant_mode": "bfloat16",
        "fmha_quant_mode": "bfloat16",
    },
    "fp8": {"gemm_quant_mode": "fp8", "kvcache_quant_mode": "fp8", "fmha_quant_mode": "fp8"},
}
SEQ_LENS = [(128, 128), (1024, 512), (2048, 2048)]
BATCHES = [1, 8, 64, 256]

CLI_TEMPLATE = (
    "aiconfigurator cli estimate --model-path {model_dir} --system h100_sxm --backend trtllm "
    "--estimate-mode {mode} --isl {isl} --osl {osl} --batch-size {batch} --tp-size {tp} "
    "--gemm-quant-mode {gemm} --kvcache-quant-mode {kv} --fmha-quant-mode {fmha}"
)
API_TEMPLATE = (
    "aiconfigurator.cli.api.cli_estimate(model_path, 'h100_sxm', mode={mode!r}, backend_name='trtllm', "
    "isl=isl, osl=osl, batch_size=batch, tp_size=tp, gemm_quant_mode=..., kvcache_quant_mode=..., "
    "fmha_quant_mode=...)  # all other arguments at their defaults"
)


# --------------------------------------------------------------------------- helpers


def _ensure_aiconfigurator(python: str) -> None:
    """Re-execute this script under ``python`` when aiconfigurator is not importable here."""
    try:
        import aiconfigurator  # noqa: F401
    except ImportError:
        if os.environ.get("_AIC_REEXEC") or not Path(python).exists():
            sys.exit(
                f"aiconfigurator is not importable and {python} cannot provide it; "
                "create the venv: python3 -m venv /tmp/aic && /tmp/aic/bin/pip install aiconfigurator"
            )
        env = dict(os.environ, _AIC_REEXEC="1")
        os.execve(python, [python, str(Path(__file__).resolve()), *sys.argv[1:]], env)


def matrix_point(dtype: str, tp: int, isl: int, osl: int, batch: int) -> dict:
    """Where a point stands in the matrix, as the reference records name it (one GPU per TP rank)."""
    return {
        "dtype": dtype,
        "tp": tp,
        "num_gpus": tp,
        "isl": isl,
        "osl": osl,
        "batch": batch,
    }


def aiconfigurator_source(fields: dict, started: float, generator: str) -> dict:
    """A reference record's `source`: the aiconfigurator package and version, `fields`, then when,
    with what and how long the run that made it took (`started`: its time.time()), and `generator`."""
    import importlib.metadata as md

    return {
        "package": "aiconfigurator",
        "version": md.version("aiconfigurator"),
        **fields,
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "python": platform.python_version(),
        "numpy": md.version("numpy"),
        "runtime_s": round(time.time() - started, 1),
        "generator": generator,
    }


def _plain(value):
    """JSON-safe copy: numpy scalars to Python numbers, NaN/inf to None, tuples to lists."""
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if hasattr(value, "item") and not isinstance(value, (str, bytes)):
        try:
            value = value.item()
        except (TypeError, ValueError):
            return repr(value)
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    return repr(value)


def _write_model_dirs(catalog: Path, root: Path) -> dict[str, Path]:
    """Write each catalog model's HF config.json into its own folder under ``root``."""
    dirs = {}
    for _, stem, _ in MODELS:
        entry = json.loads((catalog / f"{stem}.json").read_text())
        config = entry.get("config", entry)  # catalog files wrap the HF config
        folder = root / stem
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "config.json").write_text(json.dumps(config, indent=1))
        dirs[stem] = folder
    return dirs


def matrix():
    """Yield (model name, catalog stem, dtype, tp, isl, osl, batch) for every point to run."""
    for (model, stem, tps), dtype in itertools.product(MODELS, DTYPES):
        for tp, (isl, osl), batch in itertools.product(tps[dtype], SEQ_LENS, BATCHES):
            yield model, stem, dtype, tp, isl, osl, batch


def _source_counts(per_ops_source: dict | None) -> dict:
    """{step: {source_tag: n_ops}}: how many ops of each step came from measured tables."""
    out = {}
    for step, ops in (per_ops_source or {}).items():
        counts: dict[str, int] = {}
        for tag in ops.values():
            counts[tag] = counts.get(tag, 0) + 1
        out[step] = counts
    return out


def _agg_block(result) -> dict:
    raw = result.raw
    sched = dict((result.per_ops_data or {}).get("scheduling", {}))
    mix_ms = sched.get("mix_step_latency_ms")
    block = {
        "ttft_ms": raw["ttft"],
        "tpot_ms": raw["tpot"],
        "request_latency_ms": raw["request_latency"],
        "output_tokens_per_s": raw["tokens/s"],
        "output_tokens_per_s_per_gpu": raw["tokens/s/gpu"],
        "output_tokens_per_s_per_user": raw["tokens/s/user"],
        "seq_per_s": raw["seq/s"],
        "memory_gib_per_gpu": raw["memory"],
        "memory_breakdown_gib_per_gpu": result.summary.get_memory() if result.summary else None,
        "kv_cache_warning": result.kv_cache_warning,
        "scheduling": sched,
        # TTFT = prefill-only step time x a heuristic queuing factor (see notes).
        "ttft_queuing_factor": (raw["ttft"] / mix_ms) if mix_ms else None,
        "genonly_step_ops_ms": (result.per_ops_data or {}).get("genonly_step"),
        "mix_step_ops_ms": (result.per_ops_data or {}).get("mix_step"),
        "op_source_counts": _source_counts(result.per_ops_source),
    }
    return block


def _static_block(result) -> dict:
    raw = result.raw
    summary = result.summary
    return {
        "context_latency_ms": raw.get("context_latency"),
        "generation_latency_ms": raw.get("generation_latency"),
        "tpot_ms": raw.get("tpot"),
        "request_latency_ms": raw.get("request_latency"),
        "output_tokens_per_s": raw.get("tokens/s"),
        "output_tokens_per_s_per_gpu": raw.get("tokens/s/gpu"),
        "memory_gib_per_gpu": raw.get("memory"),
        "oom_warning": result.kv_cache_warning,
        # Per-op sums: context = the single batched prefill step; generation = all
        # decode steps of the request added together (sampled every `stride` steps).
        "context_ops_ms": summary.get_context_latency_dict() if summary else None,
        "generation_ops_total_ms": summary.get_generation_latency_dict() if summary else None,
    }


def _error(exc: BaseException) -> dict:
    return {"type": type(exc).__name__, "message": str(exc).strip()}


_CLI_LINE = {
    "ttft_ms": re.compile(r"^\s*TTFT:\s+([\d.,]+) ms", re.M),
    "tpot_ms": re.compile(r"^\s*TPOT:\s+([\d.,]+) ms", re.M),
    "output_tokens_per_s": re.compile(r"^\s*tokens/s:\s+([\d.,]+)", re.M),
    "output_tokens_per_s_per_gpu": re.compile(r"^\s*tokens/s/gpu:\s+([\d.,]+)", re.M),
    "backend_line": re.compile(r"^\s*Backend:\s+(.+)$", re.M),
}


def _run_cli(cli: str, model_dir: Path, point: dict, quant: dict) -> dict:
    """Run the real CLI for one point and parse the summary box it prints."""
    cmd = [
        cli,
        "cli",
        "estimate",
        "--model-path",
        str(model_dir),
        "--system",
        SYSTEM,
        "--backend",
        BACKEND,
        "--estimate-mode",
        "agg",
        "--isl",
        str(point["isl"]),
        "--osl",
        str(point["osl"]),
        "--batch-size",
        str(point["batch"]),
        "--tp-size",
        str(point["tp"]),
        "--gemm-quant-mode",
        quant["gemm_quant_mode"],
        "--kvcache-quant-mode",
        quant["kvcache_quant_mode"],
        "--fmha-quant-mode",
        quant["fmha_quant_mode"],
        "--no-color",
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    parsed = {"command": " ".join(cmd), "returncode": proc.returncode}
    for key, rx in _CLI_LINE.items():
        m = rx.search(proc.stdout)
        if m:
            parsed[key] = (
                m.group(1).strip() if key == "backend_line" else float(m.group(1).replace(",", ""))
            )
    if proc.returncode:
        parsed["stderr_tail"] = proc.stderr[-2000:]
    return parsed


# --------------------------------------------------------------------------- main


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--python", default=DEFAULT_VENV_PYTHON, help="venv python that has aiconfigurator"
    )
    ap.add_argument("--catalog", default=DEFAULT_CATALOG, help="toolkit model catalog folder")
    ap.add_argument("--out", default=str(DEFAULT_OUT))
    ap.add_argument(
        "--cli-check",
        type=int,
        default=3,
        metavar="N",
        help="also run the real CLI for the first N successful points (0 = never)",
    )
    ap.add_argument("--limit", type=int, default=0, help="stop after N points (debugging)")
    args = ap.parse_args(argv)

    _ensure_aiconfigurator(args.python)

    import importlib.metadata as md
    import logging

    import yaml
    from aiconfigurator.cli.api import cli_estimate
    from aiconfigurator.sdk.perf_database import get_latest_database_version

    logging.getLogger().setLevel(logging.ERROR)
    for name in ("aiconfigurator", "aiconfigurator_core"):
        logging.getLogger(name).setLevel(logging.ERROR)

    import aiconfigurator_core

    systems_dir = Path(aiconfigurator_core.__file__).parent / "systems"
    system_spec = yaml.safe_load((systems_dir / f"{SYSTEM}.yaml").read_text())
    query_versions = yaml.safe_load((systems_dir / "query_versions.yaml").read_text())
    backend_version = get_latest_database_version(system=SYSTEM, backend=BACKEND)
    data_dir = systems_dir / "data" / SYSTEM
    shipped_versions = {
        op_dir.name: sorted(p.name for p in (op_dir / BACKEND).iterdir() if p.is_dir())
        for op_dir in sorted(data_dir.iterdir())
        if (op_dir / BACKEND).is_dir()
    }
    cli_exe = str(Path(sys.executable).parent / "aiconfigurator")

    points = []
    started = time.time()
    with tempfile.TemporaryDirectory(prefix="aic_models_") as tmp:
        model_dirs = _write_model_dirs(Path(args.catalog), Path(tmp))
        cli_checked = 0
        todo = list(matrix())
        if args.limit:
            todo = todo[: args.limit]
        for model, stem, dtype, tp, isl, osl, batch in todo:
            quant = DTYPES[dtype]
            point = {
                "model": model,
                "catalog": f"{stem}.json",
                **matrix_point(dtype, tp, isl, osl, batch),
                "quant_requested": quant,
            }
            common = dict(
                model_path=str(model_dirs[stem]),
                system_name=SYSTEM,
                backend_name=BACKEND,
                isl=isl,
                osl=osl,
                batch_size=batch,
                tp_size=tp,
                **quant,
            )
            try:
                agg = cli_estimate(mode="agg", **common)
            except Exception as exc:  # noqa: BLE001 - refusals are data
                point.update(
                    status="refused",
                    refusal=_error(exc),
                    ttft_ms=None,
                    tpot_ms=None,
                    output_tokens_per_s=None,
                )
                # The agg refusal message always blames the weights; static mode does not refuse and
                # reports the memory it estimated, which shows whether the KV cache of the batch is the cause.
                try:
                    st = cli_estimate(mode="static", **common)
                    point["refusal"]["static_memory_breakdown_gib_per_gpu"] = (
                        st.summary.get_memory()
                    )
                    point["refusal"]["capacity_gib"] = system_spec["gpu"]["mem_capacity"] / 2**30
                except Exception as exc2:  # noqa: BLE001
                    point["refusal"]["static_error"] = _error(exc2)
                points.append(point)
                print(
                    f"refused {model} {dtype} tp{tp} {isl}/{osl} b{batch}: {exc}", file=sys.stderr
                )
                continue
            a = _agg_block(agg)
            point.update(
                status="ok",
                backend_version=agg.backend_version,
                quant_resolved={k: agg.raw.get(k) for k in ("gemm", "kvcache", "fmha", "comm")},
                ttft_ms=a["ttft_ms"],
                tpot_ms=a["tpot_ms"],
                output_tokens_per_s=a["output_tokens_per_s"],
                output_tokens_per_s_per_gpu=a["output_tokens_per_s_per_gpu"],
                request_latency_ms=a["request_latency_ms"],
                memory_gib_per_gpu=a["memory_gib_per_gpu"],
                kv_cache_warning=a["kv_cache_warning"],
                # None when the schedule has no decode-only step (batch*isl/ctx_tokens >= osl)
                decode_step_ms=a["scheduling"].get("genonly_step_latency_ms")
                if a["scheduling"].get("num_genonly_steps")
                else None,
                mix_step_ms=a["scheduling"].get("mix_step_latency_ms"),
                agg=a,
            )
            try:
                point["static"] = _static_block(cli_estimate(mode="static", **common))
            except Exception as exc:  # noqa: BLE001
                point["static"] = {"refusal": _error(exc)}
            if cli_checked < args.cli_check:
                point["cli_check"] = _run_cli(cli_exe, model_dirs[stem], point, quant)
                cli_checked += 1
            points.append(point)
            print(
                f"ok {model} {dtype} tp{tp} {isl}/{osl} b{batch}: ttft {a['ttft_ms']:.2f} ms "
                f"tpot {a['tpot_ms']:.3f} ms {a['output_tokens_per_s']:.1f} tok/s",
                file=sys.stderr,
            )

    record = {
        "source": aiconfigurator_source(
            {
                "aiconfigurator_core_version": md.version("aiconfigurator_core"),
                "backend": BACKEND,
                "backend_version": backend_version,
                "backend_versions_shipped_for_system": shipped_versions,
                "query_versions_yaml_defaults": query_versions.get("defaults"),
                "system": SYSTEM,
                "system_spec": system_spec,
                "database_mode": "SILICON (default): measured kernel tables; ops without tables use the "
                "package's empirical formula (see op_source_counts)",
                "command_template": CLI_TEMPLATE.format(
                    model_dir="DIR",
                    mode="agg",
                    isl="I",
                    osl="O",
                    batch="B",
                    tp="T",
                    gemm="Q",
                    kv="Q",
                    fmha="Q",
                ),
                "python_api_agg": API_TEMPLATE.format(mode="agg"),
                "python_api_static": API_TEMPLATE.format(mode="static"),
                "model_path": "temporary folder holding the catalog entry's `config` member as config.json",
                "dtypes": DTYPES,
            },
            started,
            "perf/reference/make_aiconfigurator_reference.py",
        ),
        "field_meaning": {
            "ttft_ms": "agg mode TTFT (ms): prefill-only step time for one request (isl tokens) x the "
            "package's queuing heuristic min(2 + (ceil(batch*isl/ctx_tokens) - 3)/20, 4); "
            "1.9x at batch 1, not a pure prefill time",
            "tpot_ms": "agg mode TPOT (ms/token): step-count-weighted mean of mixed steps (prefill + decode) "
            "and decode-only steps",
            "output_tokens_per_s": "whole engine (all tp GPUs of one replica): batch*(osl-1) output tokens "
            "divided by the total time of all steps, prefill (mixed) steps included",
            "output_tokens_per_s_per_gpu": "output_tokens_per_s / tp",
            "decode_step_ms": "agg: latency of one decode-only engine step with `batch` sequences (the KV "
            "length it assumes is set inside the package's compiled step engine); null when "
            "every step is a mixed step",
            "mix_step_ms": "agg: latency of one step with isl prefill tokens + (batch-1) decode tokens",
            "memory_gib_per_gpu": "GiB (2^30 bytes) per GPU: weights + kv cache for batch*(isl+osl) + "
            "activations + nccl + 3.5 GiB 'others'",
            "static.context_latency_ms": "static mode: one prefill step of the whole batch (batch*isl tokens)",
            "static.tpot_ms": "static mode: generation_latency / (osl-1), all batch sequences decoding",
            "*_ops_ms": "per-op latency in ms summed over all layers of one step",
            "generation_ops_total_ms": "static mode per-op latency summed over all layers and all decode steps",
            "refusal": "cli_estimate(mode='agg') raised; message kept verbatim (it always blames the "
            "weights/parallelism). AIC refuses when weights + kv(batch*(isl+osl)) + activations + "
            "nccl + others >= 80 GiB. refusal.static_memory_breakdown_gib_per_gpu is static mode's "
            "estimate for the same point: its kvcache and weights equal agg's, but its activations "
            "are sized for the whole batch's prefill (agg sizes them for max_num_tokens=8192)",
        },
        "points": points,
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(_plain(record), indent=1) + "\n")
    ok = sum(p["status"] == "ok" for p in points)
    print(
        f"wrote {out}: {len(points)} points, {ok} ok, {len(points) - ok} refused", file=sys.stderr
    )
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        sys.exit(130)
