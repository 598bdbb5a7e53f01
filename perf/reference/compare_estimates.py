"""The ratio table: the planner's numbers / AIConfigurator's, by model, dtype, TP and length.

    python perf/reference/compare_estimates.py [--record tests/data/reference/aiconfigurator_h100_sxm.json]
        [--markdown]

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


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--record", type=Path, default=RECORD)
    parser.add_argument("--markdown", action="store_true")
    args = parser.parse_args(argv)
    print(render(table(args.record), args.markdown))
    return 0


if __name__ == "__main__":
    sys.exit(main())
