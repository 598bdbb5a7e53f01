"""Fit the constants of toolkit.plan.estimate (KernelCosts) to AIConfigurator's per-kernel times.

AIConfigurator 0.12.0 times every kernel of a step from tables NVIDIA measured on H100 SXM for
TensorRT-LLM 1.3.0rc20; tests/data/reference/aiconfigurator_h100_sxm.json keeps those per-kernel times
for every point (make_aiconfigurator_reference.py). Each constant comes from one kernel family, by a
least-squares line through the points named below, never from the end-to-end numbers the estimate is
tested against (TTFT, TPOT, tokens/s):

  weight_bandwidth, gemm_fixed_us   decode GEMMs at batch 1 (qkv, proj, gate+up, down; per layer):
                                    time = bytes / (share x bandwidth) + 4 x fixed(kind)
  gemm_compute                      prefill GEMMs of one 2048-token prompt: FLOPs / time / peak (median)
  kv_bandwidth,                     decode attention of every decode-only step, per layer: time =
  decode_attention_fixed_us         fixed(KV element bytes) + KV bytes read / (share x bandwidth), each
                                    sequence holding input + output / 2 tokens
  prefill_attention_*               prompt attention of one prompt (128, 1024, 2048 tokens), per layer:
                                    time = fixed + FLOPs / (share x bf16 peak)
  one_shot_*                        decode all-reduces up to 1 MiB: time = fixed + per doubling x
                                    log2(ranks) + (ranks - 1) x bytes / (share x link)
  two_shot_*                        prefill all-reduces from 16 MiB: time = fixed + 2 (ranks - 1) /
                                    ranks x bytes / (share x link)

Run from the repository root with the project's Python: python perf/reference/fit_estimate_constants.py
It prints each fit and the constant toolkit.plan.estimate.HOPPER_TRTLLM holds. tests/test_estimate.py
runs fit() and checks the module's constants against it.
"""

from __future__ import annotations

import json
import math
import statistics
import sys
from dataclasses import asdict
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from toolkit.model.catalog import catalog_entry  # noqa: E402
from toolkit.model.facts import ModelFacts, facts_from_config  # noqa: E402
from toolkit.plan.estimate import HOPPER_TRTLLM  # noqa: E402
from toolkit.plan.gpus import get_gpu  # noqa: E402
from toolkit.plan.precisions import KV_PRECISIONS, WEIGHT_PRECISIONS  # noqa: E402

RECORD = Path(
    __import__("os").environ.get(
        "AIC_RECORD", REPO / "tests" / "data" / "reference" / "aiconfigurator_h100_sxm.json"
    )
)
GEMMS = ("qkv_gemm", "proj_gemm", "gate_ffn1_gemm", "ffn2_gemm")
GPU = get_gpu("h100-sxm")
MIB = 2**20


def load_points(path: Path = RECORD) -> list[dict]:
    return [p for p in json.loads(path.read_text())["points"] if p["status"] == "ok"]


def facts_of(point: dict) -> ModelFacts:
    return facts_from_config(catalog_entry(point["catalog"].removesuffix(".json")).config)


def _kind(point: dict) -> str:
    return WEIGHT_PRECISIONS[point["dtype"]].tensor_cores


def _layer_params(point: dict) -> float:
    facts = facts_of(point)
    return facts.family.split(facts).linear / facts.num_layers / point["tp"]


def _peak(kind: str) -> float:
    return (GPU.fp8_tflops if kind == "fp8" else GPU.bf16_tflops) * 1e12


def fit_decode_gemms(points: list[dict]) -> dict:
    """Shared bandwidth share and a fixed cost per GEMM call for each tensor-core kind."""
    rows, times, seen = [], [], set()
    for p in points:
        key = (p["model"], p["dtype"], p["tp"])
        if p["batch"] != 1 or key in seen:
            continue
        seen.add(key)
        ops, layers = p["agg"]["genonly_step_ops_ms"], facts_of(p).num_layers
        per_layer_s = sum(ops[f"generation_{g}"] for g in GEMMS) / layers / 1e3
        nbytes = _layer_params(p) * WEIGHT_PRECISIONS[p["dtype"]].linear_bytes
        rows.append([nbytes, 4.0 * (_kind(p) == "bf16"), 4.0 * (_kind(p) == "fp8")])
        times.append(per_layer_s)
    (seconds_per_byte, bf16_s, fp8_s), *_ = np.linalg.lstsq(
        np.array(rows), np.array(times), rcond=None
    )
    return {
        "weight_bandwidth": 1 / (seconds_per_byte * GPU.bandwidth_bytes_per_s),
        "gemm_fixed_us": {"bf16": bf16_s * 1e6, "fp8": fp8_s * 1e6},
        "points": len(rows),
    }


def fit_prefill_gemms(points: list[dict]) -> dict:
    shares: dict[str, list[float]] = {"bf16": [], "fp8": []}
    for p in points:
        if p["batch"] != 1 or p["isl"] != 2048:
            continue
        ops, layers = p["static"]["context_ops_ms"], facts_of(p).num_layers
        seconds = sum(ops[f"context_{g}"] for g in GEMMS) / 1e3
        flops = 2 * _layer_params(p) * layers * p["isl"]
        shares[_kind(p)].append(flops / seconds / _peak(_kind(p)))
    return {"gemm_compute": {k: statistics.median(v) for k, v in shares.items()}}


def _kv_bytes_per_layer(point: dict) -> float:
    facts = facts_of(point)
    heads = max(1, facts.num_kv_heads // point["tp"])
    element = KV_PRECISIONS[point["dtype"]].bytes
    return facts.family.kv_bytes_per_token(facts, element, layers=1, kv_heads=heads)


def fit_decode_attention(points: list[dict]) -> dict:
    """Per layer: a fixed cost by KV element bytes + the KV the batch reads / (share x bandwidth)."""
    rows, times = [], []
    for p in points:
        if not p["decode_step_ms"]:
            continue  # every step of this point carries a prompt
        layers = facts_of(p).num_layers
        element = KV_PRECISIONS[p["dtype"]].bytes
        nbytes = p["batch"] * (p["isl"] + p["osl"] / 2) * _kv_bytes_per_layer(p)
        rows.append([float(element == 2), float(element == 1), nbytes])
        times.append(p["agg"]["genonly_step_ops_ms"]["generation_attention"] / layers / 1e3)
    (bf16_s, fp8_s, seconds_per_byte), *_ = np.linalg.lstsq(
        np.array(rows), np.array(times), rcond=None
    )
    return {
        "kv_bandwidth": 1 / (seconds_per_byte * GPU.bandwidth_bytes_per_s),
        "decode_attention_fixed_us": {2: bf16_s * 1e6, 1: fp8_s * 1e6},
    }


def fit_prefill_attention(points: list[dict]) -> dict:
    rows, times = [], []
    for p in points:
        if p["batch"] != 1:
            continue
        facts = facts_of(p)
        seconds = p["static"]["context_ops_ms"]["context_attention"] / facts.num_layers / 1e3
        flops = 2 * (facts.num_attention_heads // p["tp"]) * facts.head_dim * p["isl"] ** 2
        rows.append([1.0, flops])
        times.append(seconds)
    (fixed_s, seconds_per_flop), *_ = np.linalg.lstsq(np.array(rows), np.array(times), rcond=None)
    return {
        "prefill_attention_fixed_us": fixed_s * 1e6,
        "prefill_attention_compute": 1 / (seconds_per_flop * GPU.bf16_tflops * 1e12),
    }


def all_reduce_samples(points: list[dict]) -> list[tuple[int, float, float]]:
    """(ranks, message bytes, seconds per call) of every distinct all-reduce in the record."""
    found = {}
    for p in points:
        if p["tp"] == 1:
            continue
        facts = facts_of(p)
        decode = p["agg"]["genonly_step_ops_ms"]
        if p["decode_step_ms"]:
            nbytes = p["batch"] * facts.hidden_size * 2
            found[(p["tp"], nbytes)] = decode["generation_ar_1"] / facts.num_layers / 1e3
        if p["batch"] == 1:
            nbytes = p["isl"] * facts.hidden_size * 2
            found[(p["tp"], nbytes)] = (
                p["static"]["context_ops_ms"]["context_ar_1"] / facts.num_layers / 1e3
            )
    return [(tp, nbytes, seconds) for (tp, nbytes), seconds in sorted(found.items())]


def fit_all_reduce(points: list[dict]) -> dict:
    link = GPU.interconnect_bytes_per_s
    samples = all_reduce_samples(points)
    small = [(n, b, t) for n, b, t in samples if b <= MIB]
    one, *_ = np.linalg.lstsq(
        np.array([[1.0, math.log2(n), (n - 1) * b] for n, b, _ in small]),
        np.array([t for *_, t in small]),
        rcond=None,
    )
    large = [(n, b, t) for n, b, t in samples if b >= 16 * MIB]
    two, *_ = np.linalg.lstsq(
        np.array([[1.0, 2 * (n - 1) / n * b] for n, b, _ in large]),
        np.array([t for *_, t in large]),
        rcond=None,
    )
    return {
        "one_shot_fixed_us": one[0] * 1e6,
        "one_shot_fixed_us_per_doubling": one[1] * 1e6,
        "one_shot_link": 1 / (one[2] * link),
        "two_shot_fixed_us": two[0] * 1e6,
        "two_shot_link": 1 / (two[1] * link),
        "samples": {"one_shot": len(small), "two_shot": len(large)},
    }


def fit(path: Path = RECORD) -> dict:
    """Every fitted constant, by KernelCosts field name."""
    points = load_points(path)
    fitted: dict = {}
    for part in (
        fit_decode_gemms,
        fit_prefill_gemms,
        fit_decode_attention,
        fit_prefill_attention,
        fit_all_reduce,
    ):
        fitted.update(part(points))
    return fitted


def main() -> int:
    fitted = fit()
    module = asdict(HOPPER_TRTLLM)
    for name, value in fitted.items():
        if name in ("points", "samples"):
            continue
        print(f"{name:34s} fit {_show(value):34s} module {_show(module.get(name))}")
    return 0


def _show(value) -> str:
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {v:.3g}" for k, v in value.items()) + "}"
    return f"{value:.3g}" if isinstance(value, float) else str(value)


if __name__ == "__main__":
    sys.exit(main())
