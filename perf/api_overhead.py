"""What the OpenAI API costs over direct Triton gRPC: tokens/s and TTFT p50, same server, same run, same load.

For each concurrency, N closed-loop streams send the same greedy requests either straight to Triton
(tritonclient.grpc.aio streaming to the model the API calls, with the prompt tokenized by the
repository's tokenizer, as the API does) or to the API (`/v1/completions`, stream: true, through
`toolkit api` running as its own process). Phases alternate direct / api for `--rounds` rounds so
that drift on a shared machine hits both sides alike.

    python perf/api_overhead.py --triton-url 127.0.0.1:8001 --repo model_repository --out perf/results/api_overhead
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import shlex
import statistics
import sys
import time
from pathlib import Path

import httpx
import numpy as np
import tritonclient.grpc.aio as grpcclient

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench_support import arrival_pauses, machine, think_ms_value, write_results_json  # noqa: E402

from toolkit.api.app import ApiSettings  # noqa: E402
from toolkit.api.prompt import PromptCodec  # noqa: E402
from toolkit.client.sse import LeanStreamClient, sse_data  # noqa: E402
from toolkit.client.tensors import engine_inputs  # noqa: E402
from toolkit.repository.reader import open_repository  # noqa: E402
from toolkit.serve.api_process import launch_api  # noqa: E402
from toolkit.subprocs import stop_process  # noqa: E402

PROMPT = "1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12,"  # greedy decoding keeps counting: no early end


async def direct_stream(
    client, model: str, ids: list[int], max_tokens: int, end_id: int, interval: int = 1
) -> tuple[float, int]:
    """One streamed request straight to the engine (its stream_interval parameter `interval`, as the API
    sends it with --stream-interval); returns (TTFT s, tokens)."""
    inputs = engine_inputs(ids, max_tokens, end_id=end_id, streaming=True, runtime_top_k=1)
    done = asyncio.Event()

    async def requests():
        yield {
            "model_name": model,
            "inputs": inputs,
            "parameters": {
                "triton_enable_empty_final_response": True,
                **({"stream_interval": interval} if interval > 1 else {}),
            },
            "outputs": [
                grpcclient.InferRequestedOutput("output_ids"),
                grpcclient.InferRequestedOutput("sequence_length"),
            ],
        }
        await done.wait()

    start = time.perf_counter()
    ttft, tokens = None, 0
    try:
        async for result, error in client.stream_infer(requests()):
            if error is not None:
                raise RuntimeError(str(error))
            response = result.get_response()
            if response.outputs:
                n = int(result.as_numpy("sequence_length").reshape(-1)[0])
                if n and ttft is None:
                    ttft = time.perf_counter() - start
                tokens += n
            if response.parameters["triton_final_response"].bool_param:
                break
    finally:
        done.set()
    return ttft, tokens


async def api_stream(
    http: httpx.AsyncClient, url: str, model: str, max_tokens: int
) -> tuple[float, int]:
    """One streamed /v1/completions request; returns (TTFT s, completion tokens from usage)."""
    body = {
        "model": model,
        "prompt": PROMPT,
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    start = time.perf_counter()
    ttft, tokens = None, 0
    async with http.stream("POST", f"{url}/v1/completions", json=body) as response:
        response.raise_for_status()
        async for line in response.aiter_lines():
            chunk = sse_data(line)
            if not isinstance(chunk, dict):
                continue
            if ttft is None and chunk["choices"] and chunk["choices"][0]["text"]:
                ttft = time.perf_counter() - start
            if chunk.get("usage"):
                tokens = chunk["usage"]["completion_tokens"]
    return ttft, tokens


async def run_phase(
    make_request, concurrency: int, requests_per_stream: int, think_ms: float = 0.0
) -> dict:
    """`concurrency` closed-loop streams, each request after its stream's arrival pause
    (bench_support.arrival_pauses: none when `think_ms` is 0)."""
    ttfts, totals = [], []

    async def stream_loop(index: int):
        pause = arrival_pauses(index, think_ms)
        for _ in range(requests_per_stream):
            await pause()
            ttft, tokens = await make_request()
            ttfts.append(ttft)
            totals.append(tokens)

    start = time.perf_counter()
    await asyncio.gather(*(stream_loop(index) for index in range(concurrency)))
    wall = time.perf_counter() - start
    return {
        "requests": len(totals),
        "tokens": sum(totals),
        "wall_s": wall,
        "ttfts": [t for t in ttfts if t is not None],
    }


def summarize(phases: list[dict]) -> dict:
    tokens = sum(p["tokens"] for p in phases)
    wall = sum(p["wall_s"] for p in phases)
    ttfts = [t for p in phases for t in p["ttfts"]]
    return {
        "requests": sum(p["requests"] for p in phases),
        "tokens": tokens,
        "wall_s": round(wall, 3),
        "tokens_per_s": round(tokens / wall, 2),
        "ttft_p50_ms": round(statistics.median(ttfts) * 1000, 3),
        "ttft_p90_ms": round(float(np.percentile(ttfts, 90)) * 1000, 3),
    }


def start_api(args):
    """The API as `toolkit serve --openai-port` starts it (python -m toolkit.api), on its own port."""
    settings = ApiSettings(
        args.triton_url, args.repo, model_name=args.model_name, max_in_flight=256,
        stream_interval=args.stream_interval, engine_http_url=args.engine_http_url,
    )  # fmt: skip
    process, _log = launch_api(
        settings, host="127.0.0.1", port=args.api_port, workers=args.api_workers
    )
    return process


SPLIT = {
    "admission": "toolkit_api_admission_seconds",
    "engine_first_response": "toolkit_api_engine_first_response_seconds",
    "ttft_server_side": "toolkit_api_time_to_first_token_seconds",
}


async def split_totals(http, url: str) -> dict:
    """(sum, count) of the API's TTFT histograms: arrival -> gRPC call -> first engine token."""
    text = (await http.get(f"{url}/metrics")).text
    out = {}
    for key, name in SPLIT.items():
        total = re.search(rf"^{name}_sum (\S+)$", text, re.M)
        count = re.search(rf"^{name}_count (\S+)$", text, re.M)
        out[key] = (float(total.group(1)), float(count.group(1)))
    return out


def split_means_ms(before: dict, after: dict) -> dict:
    return {
        key: round(
            1000 * (after[key][0] - before[key][0]) / max(after[key][1] - before[key][1], 1), 3
        )
        for key in SPLIT
    }


async def measure(args) -> dict:
    repository = open_repository(args.repo)
    ids = PromptCodec(repository).encode(PROMPT)
    url = f"http://127.0.0.1:{args.api_port}"
    client = grpcclient.InferenceServerClient(args.triton_url)
    limits = httpx.Limits(max_connections=256, max_keepalive_connections=256)
    async with httpx.AsyncClient(timeout=300, limits=limits) as http:
        model = (await http.get(f"{url}/v1/models")).json()["data"][0]["id"]
        direct = lambda: direct_stream(  # noqa: E731
            client,
            args.model_name,
            ids,
            args.max_tokens,
            repository.tokens.end_id,
            args.stream_interval,
        )
        lean = LeanStreamClient(
            url,
            "/v1/completions",
            {
                "model": model,
                "prompt": PROMPT,
                "max_tokens": args.max_tokens,
                "temperature": 0,
                "stream": True,
                "stream_options": {"include_usage": True},
            },
        )
        api = (
            (lambda: api_stream(http, url, model, args.max_tokens))
            if args.client == "httpx"
            else lean.stream
        )
        await run_phase(direct, 2, 1)  # warm-up, not counted
        await run_phase(api, 2, 1)
        results = {}
        for concurrency in args.concurrency:
            phases = {"direct": [], "api": []}
            before = await split_totals(http, url)
            for _ in range(args.rounds):
                for side, make in (("direct", direct), ("api", api)):
                    phases[side].append(
                        await run_phase(make, concurrency, args.requests_per_stream, args.think_ms)
                    )
            d, a = summarize(phases["direct"]), summarize(phases["api"])
            a["server_side_mean_ms"] = split_means_ms(before, await split_totals(http, url))
            results[str(concurrency)] = {
                "direct_grpc": d,
                "api": a,
                "tokens_per_s_ratio": round(a["tokens_per_s"] / d["tokens_per_s"], 4),
                "tokens_per_s_lost_pct": round(
                    100 * (1 - a["tokens_per_s"] / d["tokens_per_s"]), 2
                ),
                "ttft_p50_added_ms": round(a["ttft_p50_ms"] - d["ttft_p50_ms"], 3),
            }
            print(json.dumps({concurrency: results[str(concurrency)]}), flush=True)
    lean.close()
    await client.close()
    return results


def write_results(args, results: dict, manifest: dict) -> None:
    meta = {
        "command": " ".join(shlex.quote(a) for a in sys.argv),
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "target": manifest.get("target"),
        "engine_parameters": manifest.get("engine"),
        "limits": manifest.get("limits"),
        "model_called": args.model_name,
        "max_tokens": args.max_tokens,
        "requests_per_stream": args.requests_per_stream,
        "rounds": args.rounds,
        "client": args.client,
        "think_ms": args.think_ms,
        "api_workers": args.api_workers,
        "stream_interval": args.stream_interval,
        "api_engine_transport": "http" if args.engine_http_url else "grpc",
        "machine": machine(),
        "targets": {"tokens_per_s_lost_pct_max": 5.0, "ttft_p50_added_ms_max": 5.0},
    }
    out = write_results_json(args.out, meta, results)
    rows = [
        "| streams | direct tok/s | API tok/s | tok/s lost | direct TTFT p50 | API TTFT p50 | TTFT added |",
        "|---|---|---|---|---|---|---|",
    ]
    for concurrency, r in results.items():
        d, a = r["direct_grpc"], r["api"]
        rows.append(
            f"| {concurrency} | {d['tokens_per_s']} | {a['tokens_per_s']} | {r['tokens_per_s_lost_pct']} % | "
            f"{d['ttft_p50_ms']} ms | {a['ttft_p50_ms']} ms | {r['ttft_p50_added_ms']} ms |"
        )
    rows += [
        "",
        "Inside the API (means from its own histograms over the API phases; TTFT here starts when the request "
        "passes the gate):",
        "",
        "| streams | arrival -> gRPC call | gRPC call -> first engine token | server-side TTFT |",
        "|---|---|---|---|",
    ]
    for concurrency, r in results.items():
        m = r["api"]["server_side_mean_ms"]
        rows.append(
            f"| {concurrency} | {m['admission']} ms | {m['engine_first_response']} ms | {m['ttft_server_side']} ms "
            "|"
        )
    text = [
        f"# OpenAI API overhead over direct Triton gRPC ({meta['target']} engine)",
        "",
        f"Command: `{meta['command']}`",
        "",
        f"Date {meta['date']}; {meta['machine']['cpus']} CPUs (shared); engine parameters "
        f"{meta['engine_parameters']}; "
        f"model called: `{args.model_name}`; {args.max_tokens} tokens per request, {args.requests_per_stream} "
        "requests per stream, "
        f"{args.rounds} alternating rounds per side; API-side client: {args.client}; "
        f"think time before each request: uniform 0..{args.think_ms} ms; stream interval "
        f"{args.stream_interval} (both sides); the API reads the engine over "
        + (
            f"Triton's HTTP generate_stream ({args.engine_http_url})"
            if args.engine_http_url
            else "gRPC"
        )
        + ".",
        "",
        *rows,
        "",
        "Targets: at most 5 % tokens/s lost, at most 5 ms added to TTFT p50.",
        "",
    ]
    out.with_suffix(".md").write_text("\n".join(text))


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--triton-url", default="127.0.0.1:8001")
    parser.add_argument("--repo", type=Path, required=True)
    parser.add_argument("--model-name", default="tensorrt_llm")
    parser.add_argument("--api-port", type=int, default=19120)
    parser.add_argument(
        "--concurrency", type=lambda s: [int(x) for x in s.split(",")], default=[1, 16]
    )
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--requests-per-stream", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument(
        "--client",
        choices=["lean", "httpx"],
        default="lean",
        help="API-side load generator: raw asyncio streams (lean) or httpx with a JSON parse per chunk",
    )
    parser.add_argument(
        "--api-workers",
        type=int,
        default=1,
        help="API worker processes (toolkit serve --api-workers)",
    )
    parser.add_argument(
        "--think-ms",
        type=think_ms_value,
        default=0.0,
        help="a random 0..T ms wait before each request, both sides (0: back to back, so each request "
        "arrives in step with the response that ended the last; an engine step: arrivals at any phase)",
    )
    parser.add_argument(
        "--stream-interval",
        type=int,
        default=1,
        help="the API's --stream-interval; direct requests ask the engine for the same (its stream_interval "
        "parameter: the synthetic and CPU engines honour it)",
    )
    parser.add_argument(
        "--engine-http-url", default=None, metavar="HOST:PORT",
        help="the API reads the engine over Triton's HTTP generate_stream at this address (toolkit serve's "
        "default, --engine-transport http); unset: over gRPC at --triton-url. The direct side is gRPC either way",
    )  # fmt: skip
    parser.add_argument("--out", default="perf/results/api_overhead")
    args = parser.parse_args()
    manifest = open_repository(args.repo).manifest.to_dict()
    api = start_api(args)
    try:
        results = asyncio.run(measure(args))
    finally:
        stop_process(api)
    write_results(args, results, manifest)


if __name__ == "__main__":
    main()
