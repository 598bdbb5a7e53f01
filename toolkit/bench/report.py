"""Record a sweep: sweep.json, sweep.csv and PNG plots in the output folder (each written atomically)."""

from __future__ import annotations

import csv
import io
import json
import os
from dataclasses import replace
from pathlib import Path

from toolkit.bench.metrics import flat_row
from toolkit.bench.sweep import PointResult, SweepResult


def write_report(result: SweepResult) -> SweepResult:
    out = result.plan.out_dir
    files = {
        "json": out / "sweep.json",
        "csv": out / "sweep.csv",
        "throughput_latency_png": out / "throughput_vs_latency.png",
        "ttft_itl_png": out / "ttft_itl_vs_load.png",
    }
    if any(p.breakdown is not None for p in result.points):
        files["breakdown_png"] = out / "breakdown.png"
        plot_breakdown(result, files["breakdown_png"])
    _write_text(files["csv"], sweep_csv(result))
    plot_throughput_latency(result, files["throughput_latency_png"])
    plot_ttft_itl(result, files["ttft_itl_png"])
    recorded = replace(result, files={k: str(v) for k, v in files.items()})
    _write_text(files["json"], json.dumps(recorded.to_dict(), indent=2, default=str) + "\n")
    return recorded


def csv_row(p: PointResult) -> dict:
    expected = p.expected
    extra = {
        "expected_output_tokens_per_s": expected.output_tokens_per_s if expected else None,
        "expected_tpot_ms": expected.tpot_ms if expected else None,
        "expected_ttft_ms": expected.ttft_ms if expected else None,
        "tokens_per_s_of_expected": p.tokens_per_s_of_expected,
        "itl_of_expected": p.itl_of_expected,
        "ttft_of_expected": p.ttft_of_expected,
        "server_pending_max": max(p.server.pending_max.values(), default=None),
        "server_queue_us_per_request": json.dumps(p.server.queue_us_per_request, sort_keys=True),
        "server_kv_cache": json.dumps(p.server.kv_cache, sort_keys=True),
    }
    if p.breakdown is not None:
        extra["dominant_ttft_layer"] = p.breakdown.dominant_ttft
        extra["dominant_itl_layer"] = p.breakdown.dominant_itl
        for kind, rows in (("ttft", p.breakdown.ttft), ("itl", p.breakdown.itl)):
            for row in rows:
                for layer, ms in row.layers.items():
                    extra[f"{kind}_p{row.percentile}_{layer}_ms"] = ms
    return flat_row(p.metrics, extra)


def sweep_csv(result: SweepResult) -> str:
    """One row per point; with --lora-mix, the point's row (adapter `all`) then one per adapter."""
    if result.plan.lora_mix:
        rows = [
            row
            for p in result.points
            for row in (
                {"adapter": "all", **csv_row(p)},
                *({"adapter": name, **flat_row(m)} for name, m in p.adapters.items()),
            )
        ]
    else:
        rows = [csv_row(p) for p in result.points]
    buffer = io.StringIO()
    if rows:
        writer = csv.DictWriter(buffer, fieldnames=list(rows[0]), restval="")
        writer.writeheader()
        writer.writerows(rows)
    return buffer.getvalue()


def _figure():
    import matplotlib

    matplotlib.use("Agg")  # files only, never a display
    import matplotlib.pyplot as plt

    return plt


def plot_throughput_latency(result: SweepResult, path: Path) -> None:
    """The serving curve: output tokens/s against p50 request latency, one marker per point."""
    plt = _figure()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for mode in ("concurrency", "request_rate"):
        points = [p for p in result.points if p.point.mode == mode]
        if not points:
            continue
        xs = [p.metrics.latency_ms.p50 for p in points]
        ys = [p.metrics.output_tokens_per_s for p in points]
        ax.plot(xs, ys, marker="o", label=mode.replace("_", " "))
        for p, x, y in zip(points, xs, ys, strict=True):
            ax.annotate(
                f"{p.point.value:g}", (x, y), textcoords="offset points", xytext=(4, 4), fontsize=8
            )
    ax.set_xlabel("request latency p50 (ms)")
    ax.set_ylabel("output tokens/s")
    ax.set_title(_title(result))
    ax.grid(alpha=0.3)
    ax.legend()
    _save(fig, path, plt)


def plot_ttft_itl(result: SweepResult, path: Path) -> None:
    """TTFT and ITL (p50 with p90..p99 band edges) against load, one panel each."""
    plt = _figure()
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for ax, name, label in (
        (axes[0], "ttft_ms", "time to first token (ms)"),
        (axes[1], "itl_ms", "inter-token latency (ms)"),
    ):
        for mode in ("concurrency", "request_rate"):
            points = [p for p in result.points if p.point.mode == mode]
            if not points:
                continue
            xs = [p.point.value for p in points]
            for stat, style in (("p50", "-o"), ("p90", "--"), ("p99", ":")):
                ax.plot(
                    xs,
                    [getattr(getattr(p.metrics, name), stat) for p in points],
                    style,
                    label=f"{mode.replace('_', ' ')} {stat}",
                )
        ax.set_xlabel("load (concurrency, or requests/s)")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle(_title(result))
    _save(fig, path, plt)


def plot_breakdown(result: SweepResult, path: Path) -> None:
    """Stacked bars per load point and percentile: each layer's ms of TTFT (left) and ITL (right)."""
    from toolkit.bench.breakdown import ITL_LAYERS, TTFT_LAYERS

    plt = _figure()
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.5))
    # one colour per layer in both panels, whichever layers a panel has
    colours = {layer: f"C{i}" for i, layer in enumerate(dict.fromkeys(TTFT_LAYERS + ITL_LAYERS))}
    points = [p for p in result.points if p.breakdown is not None]
    for ax, kind, order in ((axes[0], "ttft", TTFT_LAYERS), (axes[1], "itl", ITL_LAYERS)):
        labels, rows = [], []
        for p in points:
            for row in getattr(p.breakdown, kind):
                labels.append(f"c{p.point.value:g}\np{row.percentile}")
                rows.append(row.layers)
        bottom = [0.0] * len(rows)
        for layer in order:
            heights = [max(0.0, layers.get(layer, 0.0)) for layers in rows]
            if any(heights):
                ax.bar(labels, heights, bottom=bottom, label=layer, color=colours[layer])
                bottom = [b + h for b, h in zip(bottom, heights, strict=True)]
        ax.set_ylabel("time to first token (ms)" if kind == "ttft" else "inter-token latency (ms)")
        ax.grid(alpha=0.3, axis="y")
        ax.legend(fontsize=7)
    fig.suptitle(f"{_title(result)}: where the time went")
    _save(fig, path, plt)


def _title(result: SweepResult) -> str:
    plan = result.plan
    return f"{plan.target}: {plan.input_tokens} in / {plan.output_tokens} out tokens"


def _save(fig, path: Path, plt) -> None:
    tmp = path.with_name(f".{path.stem}.{os.getpid()}{path.suffix}")
    fig.tight_layout()
    fig.savefig(tmp, dpi=110)
    plt.close(fig)
    os.replace(tmp, path)


def _write_text(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    tmp.write_text(text)
    os.replace(tmp, path)
