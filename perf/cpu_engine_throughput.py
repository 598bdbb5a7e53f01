"""Issue 2's benchmark: output tokens/s of the served CPU engine at 1, 4 and 16 concurrent streams,
against transformers `generate` one request at a time, measured in the same run on the same machine.

    python perf/cpu_engine_throughput.py [--tokens 64] [--repeats 3] [--out perf/results/cpu_engine_throughput]

It builds the embedded default's CPU repository, serves it on free ports, and drives the ensemble
over gRPC streaming with min_tokens = max_tokens, so every request produces exactly --tokens tokens.
Results: medians over --repeats rounds, and the ratio to the baseline measured in the same round.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

from bench_support import machine, serve_cpu_repository

PROMPTS = [
    "Explain how a bicycle works.",
    "Write a short story about a lighthouse.",
    "Describe the water cycle.",
    "What makes a good cup of tea?",
    "Summarize the plot of a heist movie.",
    "How do airplanes fly?",
    "Give advice to a new programmer.",
    "Describe a walk through a forest.",
]


def baseline_tokens_per_s(checkpoint: Path, prompts: list[str], tokens: int) -> float:
    """transformers generate, greedy, one request at a time, every request forced to `tokens` tokens."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(checkpoint)
    model = AutoModelForCausalLM.from_pretrained(checkpoint, dtype=torch.float32).eval()
    encoded = [
        tokenizer(p, return_tensors="pt", add_special_tokens=False)["input_ids"] for p in prompts
    ]
    model.generate(encoded[0], max_new_tokens=4, min_new_tokens=4, do_sample=False)  # warm-up
    produced, start = 0, time.perf_counter()
    with torch.no_grad():
        for ids in encoded:
            out = model.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                max_new_tokens=tokens,
                min_new_tokens=tokens,
                do_sample=False,
            )
            produced += out.shape[1] - ids.shape[1]
    return produced / (time.perf_counter() - start)


def served_tokens_per_s(grpc_url: str, prompts: list[str], tokens: int, concurrency: int) -> float:
    from toolkit.client.generate import GenerateRequest, generate_grpc

    work = list(prompts)
    lock = threading.Lock()
    counted: list[int] = []

    def worker() -> None:
        while True:
            with lock:
                if not work:
                    return
                prompt = work.pop()
            result = generate_grpc(
                grpc_url, GenerateRequest(prompt=prompt, max_tokens=tokens, min_tokens=tokens)
            )
            with lock:
                counted.append(len(result.text) and tokens)

    start = time.perf_counter()
    threads = [threading.Thread(target=worker) for _ in range(concurrency)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return sum(counted) / (time.perf_counter() - start)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--concurrency", default="1,4,16")
    parser.add_argument("--out", type=Path, default=Path("perf/results/cpu_engine_throughput"))
    args = parser.parse_args()
    levels = [int(c) for c in args.concurrency.split(",")]

    workdir = Path(tempfile.mkdtemp(prefix="cpu-engine-bench-"))
    model, server = serve_cpu_repository(workdir)
    rounds = []
    try:
        served_tokens_per_s(server.grpc_url, PROMPTS[:2], 8, 2)  # warm-up
        for round_index in range(args.repeats):
            row = {"baseline_generate": baseline_tokens_per_s(model.path, PROMPTS[:4], args.tokens)}
            for level in levels:
                prompts = (PROMPTS * 8)[: max(2 * level, 4)]
                row[f"served_c{level}"] = served_tokens_per_s(
                    server.grpc_url, prompts, args.tokens, level
                )
            rounds.append(row)
            print(
                f"round {round_index + 1}: "
                + ", ".join(f"{k} {v:.1f} tok/s" for k, v in row.items()),
                flush=True,
            )
    finally:
        server.stop()
    medians = {key: statistics.median(r[key] for r in rounds) for key in rounds[0]}
    ratios = {
        key: statistics.median(r[key] / r["baseline_generate"] for r in rounds)
        for key in rounds[0]
        if key != "baseline_generate"
    }
    result = {
        "command": "python perf/cpu_engine_throughput.py " + " ".join(sys.argv[1:]),
        "machine": machine(),
        "tokens_per_request": args.tokens,
        "repeats": args.repeats,
        "rounds": rounds,
        "median_tokens_per_s": medians,
        "median_ratio_to_baseline": ratios,
        "target": "served at 16 streams >= 3x baseline",
        "target_met": ratios.get("served_c16", 0) >= 3.0,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".json").write_text(json.dumps(result, indent=2) + "\n")
    lines = [
        "# CPU engine throughput vs transformers generate (same run)",
        "",
        f"Command: `{result['command']}`",
        "",
        f"Machine: {os.cpu_count()} CPUs, {platform.platform()}; {args.tokens} output tokens per request, median "
        f"of {args.repeats} rounds.",
        "",
        "| load | output tokens/s (median) | ratio to baseline (median of per-round ratios) |",
        "|---|---|---|",
        f"| transformers generate, 1 request at a time | {medians['baseline_generate']:.1f} | 1.00 |",
    ]
    lines += [
        f"| served ensemble, {k.removeprefix('served_c')} streams | {medians[k]:.1f} | {ratios[k]:.2f} |"
        for k in ratios
    ]
    lines += ["", f"Target (>= 3x at 16 streams): {'met' if result['target_met'] else 'NOT met'}."]
    args.out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
