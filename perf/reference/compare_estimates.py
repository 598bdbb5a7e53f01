"""The ratio table: the planner's numbers / AIConfigurator's, by model, dtype, TP and length.

    python perf/reference/compare_estimates.py [--record tests/data/reference/aiconfigurator_h100_sxm.json]
        [--markdown]
    python perf/reference/compare_estimates.py --serving [--markdown]

--serving: time to first token against NVIDIA's measured Triton serving table instead (TensorRT-LLM
0.14, bf16, the rows with up to 64 requests in flight), in ms and in decode steps (TTFT / TPOT against
the row's TTFT / ITL), before (the prompt at the dense tensor peak) and after.

"before" is what the planner had before it estimated anything: its speed-of-light bounds at the same
batch (weights and every sequence's KV read at the datasheet bandwidth per decode step, tokens/s from
that step, the prompt at the dense tensor peak), as issue 21 compared them. "after" is
toolkit.plan.estimate at the same point. Each cell: the median ratio over the batches of the group
(1, 8, 64, 256 where estimated) and how many of them are within +-20 %.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from toolkit.model.catalog import catalog_entry  # noqa: E402
from toolkit.model.facts import facts_from_config  # noqa: E402
from toolkit.plan.estimate import Workload, estimate_performance  # noqa: E402
from toolkit.plan.gpus import get_gpu  # noqa: E402
from toolkit.plan.memory import compute_plan  # noqa: E402

RECORD = REPO / "tests" / "data" / "reference" / "aiconfigurator_h100_sxm.json"
CATALOG = {
    "Llama-3.1-8B-Instruct": "llama-3.1-8b-instruct",
    "Qwen2.5-7B-Instruct": "qwen2.5-7b-instruct",
    "Llama-3.1-70B-Instruct": "llama-3.1-70b-instruct",
}
METRICS = ("tpot_ms", "output_tokens_per_s", "ttft_ms")
GPU = get_gpu("h100-sxm")


def ratios(point: dict) -> dict:
    """{"before": {metric: ratio}, "after": {metric: ratio}} for one estimated point."""
    facts = facts_from_config(catalog_entry(CATALOG[point["model"]]).config)
    plan = compute_plan(
        facts,
        GPU,
        dtype=point["dtype"],
        kv_dtype=point["dtype"],
        tp=point["tp"],
        target_input_len=point["isl"],
        target_output_len=point["osl"],
        max_num_tokens=8192,  # what AIConfigurator sizes the step for
    )
    b, isl, osl = point["batch"], point["isl"], point["osl"]
    step_bytes = plan.weights_bytes_per_gpu + b * (isl + osl / 2) * plan.kv_bytes_per_token_per_gpu
    bound_step_ms = step_bytes / GPU.bandwidth_bytes_per_s * 1e3
    before = {
        "tpot_ms": bound_step_ms,
        "output_tokens_per_s": b * 1e3 / bound_step_ms,
        "ttft_ms": isl / plan.prefill_tokens_per_s_upper_bound * 1e3,
    }
    ours = estimate_performance(facts, GPU, plan, Workload(b, isl, osl)).to_dict()
    return {
        "before": {m: before[m] / point[m] for m in METRICS},
        "after": {m: ours[m] / point[m] for m in METRICS},
    }


def table(record: Path = RECORD) -> list[dict]:
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for point in json.loads(record.read_text())["points"]:
        if point.get("status") == "ok":
            key = (point["model"], point["dtype"], point["tp"], f"{point['isl']}/{point['osl']}")
            groups[key].append(ratios(point))
    rows = []
    for key, found in groups.items():
        row = {"group": key, "points": len(found)}
        for when in ("before", "after"):
            for metric in METRICS:
                values = [r[when][metric] for r in found]
                row[f"{when}.{metric}"] = (
                    statistics.median(values),
                    sum(0.8 <= v <= 1.2 for v in values),
                )
        rows.append(row)
    return rows


def totals(rows: list[dict]) -> dict:
    out = {}
    for column in [k for k in rows[0] if "." in k]:
        out[column] = sum(r[column][1] for r in rows)
    out["points"] = sum(r["points"] for r in rows)
    return out


def render(rows: list[dict], markdown: bool) -> str:
    header = ["model", "dtype", "TP", "in/out", "n"] + [
        f"{when} {short}" for when in ("before", "after") for short in ("TPOT", "tok/s", "TTFT")
    ]
    lines = []
    if markdown:
        lines += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    else:
        lines.append("  ".join(header))
    for row in rows:
        model, dtype, tp, lengths = row["group"]
        cells = [model.replace("-Instruct", ""), dtype, str(tp), lengths, str(row["points"])]
        for column in [k for k in row if "." in k]:
            median, inside = row[column]
            cells.append(f"{median:.2f} ({inside})")
        lines.append(("| " + " | ".join(cells) + " |") if markdown else "  ".join(cells))
    total = totals(rows)
    summary = [f"{c}: {total[c]}/{total['points']}" for c in total if c != "points"]
    lines.append("")
    lines.append("within +-20 %: " + ", ".join(summary))
    return "\n".join(lines)


SERVING = REPO / "tests" / "data" / "reference" / "trtllm_bench_published.json"
SERVING_MODELS = {
    "Llama-3.1-8B": "llama-3.1-8b-instruct",
    "Llama-3.1-70B": "llama-3.1-70b-instruct",
}


def serving_rows() -> list[dict]:
    """Ours / measured at each steady serving row (<= 64 in flight; Little's law gives the count)."""
    rows = []
    for row in json.loads(SERVING.read_text())["serving_rows"]:
        if row["qps"] == "INF":
            continue
        latency_s = (row["mean_ttft_ms"] + (row["osl"] - 1) * row["mean_itl_ms"]) / 1e3
        in_flight = max(1, round(row["throughput_req_per_s"] * latency_s))
        if in_flight > 64:
            continue
        facts = facts_from_config(catalog_entry(SERVING_MODELS[row["model"]]).config)
        plan = compute_plan(
            facts, GPU, dtype="bf16", kv_dtype="bf16", tp=row["tp"],
            target_input_len=row["isl"], target_output_len=row["osl"],
        )  # fmt: skip
        ours = estimate_performance(facts, GPU, plan, Workload(in_flight, row["isl"], row["osl"]))
        bound_ms = row["isl"] / plan.prefill_tokens_per_s_upper_bound * 1e3
        rows.append(
            {
                "row": row,
                "in_flight": in_flight,
                "ours": ours,
                "before": bound_ms / row["mean_ttft_ms"],
                "after": ours.ttft_ms / row["mean_ttft_ms"],
                "steps": (ours.ttft_ms / ours.tpot_ms) / (row["mean_ttft_ms"] / row["mean_itl_ms"]),
            }
        )
    return rows


def render_serving(rows: list[dict], markdown: bool) -> str:
    header = ["model", "TP", "in/out", "qps", "in flight", "measured TTFT / ITL ms",
              "ours TTFT / TPOT ms", "before", "after", "after, in steps"]  # fmt: skip
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)] if markdown else []
    if not markdown:
        lines.append("  ".join(header))
    for r in rows:
        row, ours = r["row"], r["ours"]
        cells = [
            row["model"], str(row["tp"]), f"{row['isl']}/{row['osl']}", str(row["qps"]),
            str(r["in_flight"]), f"{row['mean_ttft_ms']:g} / {row['mean_itl_ms']:g}",
            f"{ours.ttft_ms:.1f} / {ours.tpot_ms:.1f}", f"{r['before']:.2f}", f"{r['after']:.2f}",
            f"{r['steps']:.2f}",
        ]  # fmt: skip
        lines.append(("| " + " | ".join(cells) + " |") if markdown else "  ".join(cells))
    lines.append("")
    for name in ("before", "after", "steps"):
        values = [r[name] for r in rows]
        inside = sum(0.8 <= v <= 1.2 for v in values)
        label = "after, in steps" if name == "steps" else name
        lines.append(
            f"{label}: {inside}/{len(values)} within +-20 %, median {statistics.median(values):.2f}"
        )
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--record", type=Path, default=RECORD)
    parser.add_argument("--markdown", action="store_true")
    parser.add_argument(
        "--serving", action="store_true", help="TTFT against NVIDIA's measured Triton serving table"
    )
    args = parser.parse_args(argv)
    if args.serving:
        print(render_serving(serving_rows(), args.markdown))
    else:
        print(render(table(args.record), args.markdown))
    return 0


if __name__ == "__main__":
    sys.exit(main())
