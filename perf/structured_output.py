"""Issue 18's benchmark: structured output on the CPU engine at 16 streams against unconstrained output, in the
same run, through the OpenAI API; guide compile time per schema, and the cache hit rate on repeated schemas.

    python perf/structured_output.py [--streams 16] [--tokens 64] [--repeats 3] [--schemas 8]
                                     [--out perf/results/structured_output]

It builds the embedded default's (SmolLM2-135M) CPU repository, serves it on free ports with the API beside it,
and runs rounds of `--streams` concurrent chat completions, each --tokens long: unconstrained (min_tokens =
max_tokens) and guided by a JSON schema whose instances are longer than --tokens (every answer runs to
max_tokens), the two in turn (which goes first alternates between rounds). A guided round uses --schemas
distinct schemas, each sent --streams / --schemas times, so each schema is compiled once and then reused.
Reported: tokens/s of each arm (median of rounds), the median per-round ratio guided / unconstrained (target
>= 0.8), the engine's compile time per schema and cache hit rate (its toolkit_engine_guide* counters), and
the API's time to first token.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import statistics
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from bench_support import machine, serve_cpu_repository

PROMPTS = [
    "List some fruits with a score for each.",
    "Give me names of cities and a number for each.",
    "Make up a list of products and their ratings.",
    "Write an inventory of tools with counts.",
]


def schema(variant: int) -> dict:
    """A schema whose instances run past any --tokens: a long list of records (distinct per variant)."""
    return {
        "type": "object",
        "properties": {
            "items": {
                "type": "array",
                "minItems": 200,
                "items": {
                    "type": "object",
                    "properties": {
                        "name": {"type": "string", "maxLength": 12},
                        f"score_{variant}": {"type": "integer", "minimum": 0, "maximum": 100},
                    },
                    "required": ["name", f"score_{variant}"],
                    "additionalProperties": False,
                },
            }
        },
        "required": ["items"],
        "additionalProperties": False,
    }


async def one(client, url: str, model: str, prompt: str, tokens: int, guide: dict | None) -> dict:
    body = {
        "model": model,
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": tokens,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if guide is None:
        body["min_tokens"] = tokens
    else:
        body["response_format"] = {
            "type": "json_schema",
            "json_schema": {"name": "r", "schema": guide},
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


async def arm(url: str, model: str, streams: int, tokens: int, guides: list | None) -> dict:
    import httpx

    async with httpx.AsyncClient(timeout=600) as client:
        start = time.perf_counter()
        results = await asyncio.gather(
            *(
                one(
                    client,
                    url,
                    model,
                    PROMPTS[i % len(PROMPTS)],
                    tokens,
                    None if guides is None else guides[i % len(guides)],
                )
                for i in range(streams)
            )
        )
        wall = time.perf_counter() - start
    produced = sum(r["tokens"] for r in results)
    return {
        "tokens_per_s": produced / wall,
        "tokens": produced,
        "ttft_median_s": statistics.median(r["ttft"] for r in results),
    }


def engine_counters(metrics_url: str) -> dict[str, float]:
    text = urllib.request.urlopen(metrics_url, timeout=10).read().decode()
    found = {}
    for name in ("compiled", "reused", "compile_seconds"):
        family = f"toolkit_engine_guide{'s' if name != 'compile_seconds' else ''}_{name}_total"
        values = re.findall(rf"^{family}(?:{{[^}}]*}})? (\S+)$", text, re.M)
        found[name] = sum(float(v) for v in values)
    return found


def serve(workdir: Path):
    from toolkit.api import ApiSettings, run_api_in_background
    from toolkit.serve.net import free_port

    _model, server = serve_cpu_repository(workdir, workdir / "tritonserver.log")
    api = run_api_in_background(ApiSettings(server.grpc_url, workdir / "repo"), port=free_port())
    return server, api


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--streams", type=int, default=16)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--schemas", type=int, default=8)
    parser.add_argument("--out", type=Path, default=Path("perf/results/structured_output"))
    args = parser.parse_args()
    server, api = serve(Path(tempfile.mkdtemp(prefix="structured-bench-")))
    rounds = []
    try:
        import httpx

        model = httpx.get(f"{api.url}/v1/models").json()["data"][0]["id"]
        asyncio.run(arm(api.url, model, 2, 8, None))  # warm-up
        before = engine_counters(server.metrics_url)
        for index in range(args.repeats):
            # New schemas each round (compiled once, then reused within it).
            guides = [schema(index * args.schemas + v) for v in range(args.schemas)]
            arms = {"plain": None, "guided": guides}
            order = ("plain", "guided") if index % 2 == 0 else ("guided", "plain")  # no order bias
            measured = {
                name: asyncio.run(arm(api.url, model, args.streams, args.tokens, arms[name]))
                for name in order
            }
            plain, guided = measured["plain"], measured["guided"]
            row = {"unconstrained": plain, "guided": guided}
            row["ratio"] = guided["tokens_per_s"] / plain["tokens_per_s"]
            rounds.append(row)
            print(
                f"round {index + 1}: unconstrained {plain['tokens_per_s']:.1f} tok/s, guided "
                f"{guided['tokens_per_s']:.1f} tok/s, ratio {row['ratio']:.2f}",
                flush=True,
            )
        after = engine_counters(server.metrics_url)
    finally:
        api.stop()
        server.stop()
    compiled = after["compiled"] - before["compiled"]
    reused = after["reused"] - before["reused"]
    result = {
        "command": "python perf/structured_output.py " + " ".join(sys.argv[1:]),
        "machine": machine(),
        "streams": args.streams,
        "tokens_per_request": args.tokens,
        "schemas_per_round": args.schemas,
        "rounds": rounds,
        "median_tokens_per_s": {
            key: statistics.median(r[key]["tokens_per_s"] for r in rounds)
            for key in ("unconstrained", "guided")
        },
        "median_ratio": statistics.median(r["ratio"] for r in rounds),
        "compile_ms_per_schema": 1000
        * (after["compile_seconds"] - before["compile_seconds"])
        / max(compiled, 1),
        "schemas_compiled": compiled,
        "cache_hit_rate": reused / max(compiled + reused, 1),
        "target": "guided >= 80% of unconstrained tokens/s at 16 streams",
    }
    result["target_met"] = result["median_ratio"] >= 0.8
    write_results(args.out, result)
    return 0


def write_results(out: Path, result: dict) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(result, indent=2) + "\n")
    tps = result["median_tokens_per_s"]
    ttft = {
        key: statistics.median(r[key]["ttft_median_s"] for r in result["rounds"])
        for key in ("unconstrained", "guided")
    }
    lines = [
        "# Structured output vs unconstrained on the CPU engine (same run, through the OpenAI API)",
        "",
        f"Command: `{result['command']}`",
        "",
        f"Machine: {result['machine']['cpus']} CPUs, {result['machine']['platform']}; "
        f"{result['streams']} streams of {result['tokens_per_request']} tokens, median of "
        f"{len(result['rounds'])} rounds.",
        "",
        "| arm | output tokens/s (median) | TTFT (median of rounds' medians) |",
        "|---|---|---|",
        f"| unconstrained | {tps['unconstrained']:.1f} | {ttft['unconstrained'] * 1000:.0f} ms |",
        f"| guided (JSON schema) | {tps['guided']:.1f} | {ttft['guided'] * 1000:.0f} ms |",
        "",
        f"Median per-round ratio guided / unconstrained: {result['median_ratio']:.2f} "
        f"(target >= 0.80: {'met' if result['target_met'] else 'NOT met'}).",
        "",
        f"Guide compile time: {result['compile_ms_per_schema']:.2f} ms per schema "
        f"({result['schemas_compiled']:.0f} compiled); cache hit rate on repeated schemas "
        f"{100 * result['cache_hit_rate']:.0f} %.",
    ]
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    sys.exit(main())
