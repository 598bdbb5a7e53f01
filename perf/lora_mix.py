"""Issue 19's benchmark: the CPU engine at 16 streams with half the requests on a LoRA adapter and half on the base
model, against the base model alone, in the same run, through the OpenAI API.

    python perf/lora_mix.py [--streams 16] [--tokens 64] [--repeats 3] [--rank 16]
                            [--out perf/results/lora_mix]

It makes a LoRA adapter of the embedded default (SmolLM2-135M) with peft (rank --rank on every linear layer of
every block, random weights, B scaled small so the text stays text), builds the CPU repository with it
(--lora tuned=PATH), serves it on free ports with the API beside it, and runs rounds of --streams concurrent
chat completions of --tokens each (min_tokens = max_tokens: every answer is that long): base-only (every
stream on the base model) and mixed (every other stream on `tuned`), the two in turn (which goes first
alternates between rounds). Reported: tokens/s of each arm (median of rounds), the median per-round ratio
mixed / base-only (target >= 0.7), and each arm's median time to first token.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

ADAPTER = "tuned"
PROMPTS = [
    "Tell me about the history of bridges.",
    "Describe how a river shapes a valley.",
    "Explain why the sky changes colour at dusk.",
    "Write a short story about a lighthouse keeper.",
]
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


async def one(client, url: str, model: str, prompt: str, tokens: int) -> dict:
    body = {
        "model": model,
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": tokens,
        "min_tokens": tokens,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    start = time.perf_counter()
    first = None
    usage = {}
    async with client.stream("POST", f"{url}/v1/chat/completions", json=body) as response:
        response.raise_for_status()
        async for line in response.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if chunk.get("usage"):
                usage = chunk["usage"]
            elif first is None and chunk["choices"] and chunk["choices"][0]["delta"].get("content"):
                first = time.perf_counter() - start
    return {"tokens": usage.get("completion_tokens", 0), "ttft": first or 0.0}


async def arm(url: str, models: list[str], tokens: int) -> dict:
    """One request per entry of `models` (its model id), all at once."""
    import httpx

    async with httpx.AsyncClient(timeout=600) as client:
        start = time.perf_counter()
        results = await asyncio.gather(
            *(
                one(client, url, model, PROMPTS[i % len(PROMPTS)], tokens)
                for i, model in enumerate(models)
            )
        )
        wall = time.perf_counter() - start
    produced = sum(r["tokens"] for r in results)
    return {
        "tokens_per_s": produced / wall,
        "tokens": produced,
        "ttft_median_s": statistics.median(r["ttft"] for r in results),
    }


def make_adapter(checkpoint: Path, folder: Path, rank: int) -> Path:
    """A random LoRA adapter of the checkpoint on every linear layer (B scaled so the answers stay text)."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    base = AutoModelForCausalLM.from_pretrained(checkpoint, dtype=torch.float32)
    config = LoraConfig(
        r=rank, lora_alpha=2 * rank, target_modules=TARGETS, init_lora_weights=False
    )
    model = get_peft_model(base, config)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "lora_B" in name:
                parameter.mul_(0.05)
    model.save_pretrained(folder)
    return folder


def serve(workdir: Path, rank: int):
    from toolkit.api import ApiSettings, run_api_in_background
    from toolkit.build import plan_local_repository
    from toolkit.build_settings import BuildSettings
    from toolkit.model.sources import resolve_model
    from toolkit.repository.writer import write_repository
    from toolkit.serve.launcher import ServerConfig, launch_server
    from toolkit.serve.net import free_port

    model = resolve_model("smollm2-135m-instruct", progress=False)
    adapter = make_adapter(model.path, workdir / "adapter", rank)
    settings = BuildSettings(kv_cache_tokens=32768, lora=((ADAPTER, str(adapter)),))
    write_repository(plan_local_repository(model, workdir / "repo", "cpu", settings))
    server = launch_server(
        ServerConfig(
            repo=workdir / "repo",
            http_port=free_port(),
            grpc_port=free_port(),
            metrics_port=free_port(),
            log_file=workdir / "tritonserver.log",
        )
    )
    api = run_api_in_background(ApiSettings(server.grpc_url, workdir / "repo"), port=free_port())
    return server, api


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--streams", type=int, default=16)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--rank", type=int, default=16)
    parser.add_argument("--out", type=Path, default=Path("perf/results/lora_mix"))
    args = parser.parse_args()
    server, api = serve(Path(tempfile.mkdtemp(prefix="lora-mix-bench-")), args.rank)
    rounds = []
    try:
        import httpx

        base = httpx.get(f"{api.url}/v1/models").json()["data"][0]["id"]
        asyncio.run(arm(api.url, [base, ADAPTER], 8))  # warm-up, both paths
        arms = {
            "base_only": [base] * args.streams,
            "mixed": [ADAPTER if i % 2 else base for i in range(args.streams)],
        }
        for index in range(args.repeats):
            order = ("base_only", "mixed") if index % 2 == 0 else ("mixed", "base_only")
            measured = {name: asyncio.run(arm(api.url, arms[name], args.tokens)) for name in order}
            row = {
                **measured,
                "ratio": measured["mixed"]["tokens_per_s"] / measured["base_only"]["tokens_per_s"],
            }
            rounds.append(row)
            print(
                f"round {index + 1}: base-only {measured['base_only']['tokens_per_s']:.1f} tok/s, mixed "
                f"{measured['mixed']['tokens_per_s']:.1f} tok/s, ratio {row['ratio']:.2f}",
                flush=True,
            )
    finally:
        api.stop()
        server.stop()
    result = {
        "command": "python perf/lora_mix.py " + " ".join(sys.argv[1:]),
        "machine": {
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "python": platform.python_version(),
        },
        "streams": args.streams,
        "tokens_per_request": args.tokens,
        "adapter_rank": args.rank,
        "rounds": rounds,
        "median_tokens_per_s": {
            key: statistics.median(r[key]["tokens_per_s"] for r in rounds)
            for key in ("base_only", "mixed")
        },
        "median_ratio": statistics.median(r["ratio"] for r in rounds),
        "target": "mixed (half on a LoRA adapter) >= 70% of base-only tokens/s at 16 streams",
    }
    result["target_met"] = result["median_ratio"] >= 0.7
    write_results(args.out, result)
    return 0


def write_results(out: Path, result: dict) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(result, indent=2) + "\n")
    tps = result["median_tokens_per_s"]
    ttft = {
        key: statistics.median(r[key]["ttft_median_s"] for r in result["rounds"])
        for key in ("base_only", "mixed")
    }
    lines = [
        "# LoRA: half the streams on an adapter vs the base model alone (CPU engine, same run, OpenAI API)",
        "",
        f"Command: `{result['command']}`",
        "",
        f"Machine: {result['machine']['cpus']} CPUs, {result['machine']['platform']}; "
        f"{result['streams']} streams of {result['tokens_per_request']} tokens, adapter rank "
        f"{result['adapter_rank']} on every linear layer, median of {len(result['rounds'])} rounds.",
        "",
        "| arm | output tokens/s (median) | TTFT (median of rounds' medians) |",
        "|---|---|---|",
        f"| base only | {tps['base_only']:.1f} | {ttft['base_only'] * 1000:.0f} ms |",
        f"| half on the adapter | {tps['mixed']:.1f} | {ttft['mixed'] * 1000:.0f} ms |",
        "",
        f"Median per-round ratio mixed / base-only: {result['median_ratio']:.2f} "
        f"(target >= 0.70: {'met' if result['target_met'] else 'NOT met'}).",
    ]
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    sys.exit(main())
