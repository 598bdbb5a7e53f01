"""What the perf/ benchmarks share: the machine record of a result, the embedded default's CPU repository
built and served on free ports (with the OpenAI API beside it), streamed chat completions measured in
concurrent arms, and the report of an A/B benchmark of two arms.

Imported by the perf/ scripts that run as `python perf/SCRIPT.py` (their folder is on sys.path).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import random
import shlex
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

BENCH_MODEL = "smollm2-135m-instruct"
KV_CACHE_TOKENS = 32768  # room for 16 concurrent streams of a few hundred tokens


def machine() -> dict:
    """What a result records of the machine it was measured on."""
    return {
        "cpus": os.cpu_count(),
        "platform": platform.platform(),
        "python": platform.python_version(),
    }


def run_meta(**extra) -> dict:
    """What a result records of its run: the command line, when (UTC), the machine and its 1-min load
    (taken as the result is written), and `extra`."""
    return {
        "command": " ".join(shlex.quote(a) for a in sys.argv),
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": {**machine(), "load_1min": round(os.getloadavg()[0], 2)},
        **extra,
    }


def arrival_pauses(stream: int, think_ms: float) -> Callable[[], Awaitable[None]]:
    """A closed-loop stream's wait before each request: a random 0..think_ms, seeded by the stream's
    index so that every side of a comparison gets the same waits (0: none). With waits, requests arrive
    at any point of an engine step instead of in step with the responses that ended the previous ones,
    where a millisecond's delay can cost a whole step."""
    rng = random.Random(stream)

    async def pause() -> None:
        if think_ms:
            await asyncio.sleep(rng.uniform(0, think_ms) / 1000)

    return pause


def think_ms_value(text: str) -> float:
    """An argparse type: a think time in ms, 0 to 10000."""
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not 0 <= value <= 10_000:
        raise argparse.ArgumentTypeError(f"{text!r} is not a wait in ms from 0 to 10000 (e.g. 10)")
    return value


def write_results_json(out: Path | str, meta: dict, results) -> Path:
    """OUT.json with {"meta": meta, "results": results}, its folder made; returns OUT (a Path)."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(
        json.dumps({"meta": meta, "results": results}, indent=2) + "\n"
    )
    return out


def serve_cpu_repository(
    workdir: Path, log_file: Path | None = None, server: dict | None = None, **settings
):
    """(the resolved model, the running tritonserver) for BENCH_MODEL's CPU repository at workdir/repo;
    `server`: ServerConfig settings besides the ports (e.g. trace); `settings`: build settings besides
    the KV cache (e.g. lora)."""
    from toolkit.build import plan_local_repository
    from toolkit.build_settings import BuildSettings
    from toolkit.model.sources import resolve_model
    from toolkit.repository.writer import write_repository
    from toolkit.serve.launcher import ServerConfig, launch_server
    from toolkit.serve.net import free_port

    model = resolve_model(BENCH_MODEL, progress=False)
    build = BuildSettings(kv_cache_tokens=KV_CACHE_TOKENS, **settings)
    write_repository(plan_local_repository(model, workdir / "repo", "cpu", build))
    running = launch_server(
        ServerConfig(
            repo=workdir / "repo",
            http_port=free_port(),
            grpc_port=free_port(),
            metrics_port=free_port(),
            log_file=log_file,
            **(server or {}),
        )
    )
    return model, running


def serve_with_api(workdir: Path, **settings):
    """(the running tritonserver, the OpenAI API in the background) over serve_cpu_repository's repository."""
    from toolkit.api import ApiSettings, run_api_in_background
    from toolkit.serve.net import free_port

    _model, server = serve_cpu_repository(workdir, workdir / "tritonserver.log", **settings)
    api = run_api_in_background(ApiSettings(server.grpc_url, workdir / "repo"), port=free_port())
    return server, api


def chat_body(model: str, prompt: str, tokens: int, **extra) -> dict:
    """A streamed chat completion of at most `tokens` greedy tokens, its usage in the last chunk."""
    return {
        "model": model,
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": tokens,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
        **extra,
    }


async def stream_chat(client, url: str, body: dict) -> dict:
    """Send one streamed chat completion; its completion tokens and time to first content (s)."""
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


async def run_arm(url: str, bodies: list[dict]) -> dict:
    """All `bodies` at once: output tokens/s over the arm's wall time, and the median time to first token."""
    import httpx

    async with httpx.AsyncClient(timeout=600) as client:
        start = time.perf_counter()
        results = await asyncio.gather(*(stream_chat(client, url, body) for body in bodies))
        wall = time.perf_counter() - start
    produced = sum(r["tokens"] for r in results)
    return {
        "tokens_per_s": produced / wall,
        "tokens": produced,
        "ttft_median_s": statistics.median(r["ttft"] for r in results),
    }


@dataclass(frozen=True)
class Comparison:
    """An A/B benchmark of two arms in the same run, declared once: its rounds, its result and its report.
    `arms`: each arm's key (in the rounds) -> (its name in the round lines, its label in the report's table);
    the ratio is the second arm's tokens/s over the first's, and should reach `target`."""

    script: str  # perf/SCRIPT, for the result's command
    title: str  # the report's heading
    arms: dict[str, tuple[str, str]]
    ratio: str  # the ratio's name in the report
    target: float
    goal: str  # the target in words (the result's "target")

    def parser(self, description: str) -> argparse.ArgumentParser:
        """The options every comparison has: --streams and --tokens (each request's), --repeats (rounds),
        --out (perf/results/<script's name>); the script adds its own."""
        parser = argparse.ArgumentParser(
            description=description, formatter_class=argparse.RawDescriptionHelpFormatter
        )
        parser.add_argument("--streams", type=int, default=16)
        parser.add_argument("--tokens", type=int, default=64)
        parser.add_argument("--repeats", type=int, default=3)
        out = Path("perf/results") / Path(self.script).stem
        parser.add_argument("--out", type=Path, default=out)
        return parser

    def rounds(self, repeats: int, run) -> list[dict]:
        """`repeats` rounds, which arm goes first alternating (no order bias): `run(index, key)` measures
        one arm (run_arm's record); a round holds both and their ratio."""
        first, second = self.arms
        rounds = []
        for index in range(repeats):
            order = (first, second) if index % 2 == 0 else (second, first)
            measured = {key: run(index, key) for key in order}
            row = {
                first: measured[first],
                second: measured[second],
                "ratio": measured[second]["tokens_per_s"] / measured[first]["tokens_per_s"],
            }
            rounds.append(row)
            (a, _), (b, _) = self.arms.values()
            print(
                f"round {index + 1}: {a} {row[first]['tokens_per_s']:.1f} tok/s, {b} "
                f"{row[second]['tokens_per_s']:.1f} tok/s, ratio {row['ratio']:.2f}",
                flush=True,
            )
        return rounds

    def result(
        self, args, rounds: list[dict], *, workload: dict, measured: dict | None = None
    ) -> dict:
        """The command and machine, args.streams and args.tokens and the rest of the `workload`, the rounds,
        each arm's median tokens/s and the rounds' median ratio (then `measured`), whether it met the target."""
        result = {
            "command": f"python perf/{self.script} " + " ".join(sys.argv[1:]),
            "machine": machine(),
            "streams": args.streams,
            "tokens_per_request": args.tokens,
            **workload,
            "rounds": rounds,
            "median_tokens_per_s": {
                key: statistics.median(r[key]["tokens_per_s"] for r in rounds) for key in self.arms
            },
            "median_ratio": statistics.median(r["ratio"] for r in rounds),
            **(measured or {}),
            "target": self.goal,
        }
        result["target_met"] = result["median_ratio"] >= self.target
        return result

    def write(
        self, out: Path, result: dict, *, setup: str = "", notes: tuple[str, ...] = ()
    ) -> None:
        """OUT.json (the result) and OUT.md (printed too): `setup` (what else the arms ran with) goes in the
        machine line, `notes` follow the ratio."""
        out.parent.mkdir(parents=True, exist_ok=True)
        out.with_suffix(".json").write_text(json.dumps(result, indent=2) + "\n")
        tps = result["median_tokens_per_s"]
        lines = [
            self.title,
            "",
            f"Command: `{result['command']}`",
            "",
            f"Machine: {result['machine']['cpus']} CPUs, {result['machine']['platform']}; "
            f"{result['streams']} streams of {result['tokens_per_request']} tokens, {setup}median of "
            f"{len(result['rounds'])} rounds.",
            "",
            "| arm | output tokens/s (median) | TTFT (median of rounds' medians) |",
            "|---|---|---|",
        ]
        for key, (_, label) in self.arms.items():
            ttft = statistics.median(r[key]["ttft_median_s"] for r in result["rounds"])
            lines.append(f"| {label} | {tps[key]:.1f} | {ttft * 1000:.0f} ms |")
        met = "met" if result["target_met"] else "NOT met"
        lines += [
            "",
            f"Median per-round ratio {self.ratio}: {result['median_ratio']:.2f} "
            f"(target >= {self.target:.2f}: {met}).",
            *notes,
        ]
        out.with_suffix(".md").write_text("\n".join(lines) + "\n")
        print("\n".join(lines))
