"""The serving stack's own throughput ceiling: server CPU per streamed token, layer by layer.

On a GPU server the engine runs in C++ and every other layer (preprocessing, the ensemble's hops,
postprocessing / detokenization, the OpenAI API) shares the few CPU cores each GPU gets. This
benchmark serves a *synthetic* repository (the tensorrt_llm contract, tokens without a model), drives
it with perf_analyzer over gRPC streaming, and reads:
  - CPU time of tritonserver and of each Python-backend stub (per model), from /proc, before/after;
  - tokens, exactly: requests completed (Triton's per-model statistics) x the forced output length,
    cross-checked with postprocessing's inference count (one execution per streamed piece).
Phases, in one server session:
  engine    perf_analyzer -> tensorrt_llm directly: the synthetic engine's own cost (+ gRPC streaming)
  ensemble  perf_analyzer -> ensemble: preprocessing -> engine -> postprocessing, text streamed
  bls       perf_analyzer -> tensorrt_llm_bls: one stub tokenizes, calls the engine, detokenizes
  openai    a lean HTTP client -> `toolkit api` (its own process, counted) -> tensorrt_llm over gRPC:
            streaming /v1/completions, max_tokens = min_tokens = output length, tokens from `usage`
"beyond engine" = phase us/token - engine us/token, both from the same repeat; the result is the
median over `--repeats` repeats (phases alternate within each repeat, so drift on a shared machine
hits all of them alike). One core carries 1e6 / (us/token) tokens/s.

    python perf/stack_ceiling.py [--repeats 3] [--concurrency 32] [--requests 192] [--output-tokens 128] [--profile]

writes perf/results/stack_ceiling.json and .md (and, with --profile, py-spy collapsed stacks).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path

import psutil

from toolkit.api.app import ApiSettings
from toolkit.bench.perf_analyzer import find_perf_analyzer, run_perf_analyzer
from toolkit.bench.prompts import make_prompts, write_input_data
from toolkit.client.sse import LeanStreamClient
from toolkit.repository import contract as c
from toolkit.repository.reader import open_repository
from toolkit.serve.api_process import launch_api
from toolkit.serve.launcher import ServerConfig, launch_server
from toolkit.subprocs import stop_process

HERE = Path(__file__).resolve().parent
TARGET_US_PER_TOKEN = 36.0


@dataclass(frozen=True)
class PhaseResult:
    phase: str
    model: str
    requests: int
    tokens: int
    wall_s: float
    cpu_s: dict  # process label -> CPU seconds (user + system) during the phase
    us_per_token: dict  # process label -> CPU microseconds per streamed token, plus "total"
    tokens_per_s: float
    postprocessing_executions: int | None = None


# --- measuring --------------------------------------------------------------------------------
def server_processes(pid: int) -> dict[str, psutil.Process]:
    """tritonserver and its Python-backend stubs, labelled by model name."""
    root = psutil.Process(pid)
    found = {"tritonserver": root}
    for child in root.children(recursive=True):
        args = child.cmdline()
        if len(args) > 1 and args[0].endswith("triton_python_backend_stub"):
            label = f"stub:{Path(args[1]).parent.parent.name}"
            found[label if label not in found else f"{label}#{child.pid}"] = child
    return found


def cpu_seconds(processes: dict[str, psutil.Process]) -> dict[str, float]:
    result = {}
    for label, proc in processes.items():
        times = proc.cpu_times()
        # the process's own threads; children are listed on their own
        result[label] = times.user + times.system
    return result


def model_stats(http_url: str) -> dict[str, dict]:
    with urllib.request.urlopen(f"http://{http_url}/v2/models/stats", timeout=10) as response:
        stats = json.load(response)["model_stats"]
    return {
        s["name"]: {
            "success": s["inference_stats"]["success"]["count"],
            "inferences": s["inference_count"],
        }
        for s in stats
    }


def perf_analyzer_load(server, pa, model: str, input_file: Path, args, log: Path):
    """A callable that sends `count` requests through perf_analyzer; returns None (tokens come from stats)."""
    pa_args = [
        "-m",
        model,
        "-i",
        "grpc",
        "--streaming",
        "-u",
        server.grpc_url,
        "--async",
        "--input-data",
        str(input_file),
        "--concurrency-range",
        str(args.concurrency),
        "--stability-percentage",
        "999",
        "--measurement-interval",
        "600000",
    ]

    def send(count: int, suffix: str):
        run_perf_analyzer(
            pa, pa_args + ["--request-count", str(count)], log.with_suffix(f".{suffix}.log"), 600
        )
        return None

    return send


def api_load(api_url: str, args):
    """A callable that sends `count` streaming completions through the API; returns completion tokens (usage)."""

    def send(count: int, suffix: str):
        return asyncio.run(drive_api(api_url, count, args.concurrency, args.output_tokens))

    return send


def run_phase(server, phase: str, model: str, send, args, extra: dict | None = None) -> PhaseResult:
    procs = {**server_processes(server.pid), **(extra or {})}
    # stubs, channels and allocator pools reach steady state before we count
    send(args.concurrency * 2, "warmup")
    before_stats, before_cpu, t0 = (
        model_stats(server.http_url),
        cpu_seconds(procs),
        time.monotonic(),
    )
    counted = send(args.requests, "measured")
    wall, after_cpu, after_stats = (
        time.monotonic() - t0,
        cpu_seconds(procs),
        model_stats(server.http_url),
    )
    requests = after_stats[model]["success"] - before_stats[model]["success"]
    tokens = requests * args.output_tokens
    if requests != args.requests:
        raise SystemExit(f"{phase}: {requests} requests completed, {args.requests} sent")
    if counted is not None and counted != tokens:
        raise SystemExit(f"{phase}: the client counted {counted} tokens, expected {tokens}")
    post = (
        after_stats[c.POSTPROCESSING]["inferences"] - before_stats[c.POSTPROCESSING]["inferences"]
    )
    if model == c.ENSEMBLE and post != tokens:
        raise SystemExit(
            f"{phase}: postprocessing ran {post} times for {tokens} tokens; tokens are not one per streamed piece"
        )
    cpu = {k: after_cpu[k] - before_cpu[k] for k in procs}
    cpu["total"] = sum(cpu.values())
    per_token = {k: v * 1e6 / tokens for k, v in cpu.items()}
    return PhaseResult(
        phase,
        model,
        requests,
        tokens,
        wall,
        cpu,
        per_token,
        tokens / wall,
        post if model == c.ENSEMBLE else None,
    )


# --- the OpenAI API phase -----------------------------------------------------------------------
API_PROMPT = "Count from one to one thousand, one number per line."


async def drive_api(api_url: str, count: int, concurrency: int, output_tokens: int) -> int:
    """`count` streaming /v1/completions over `concurrency` keep-alive connections; returns usage tokens."""
    body = {
        "model": c.ENGINE,
        "prompt": API_PROMPT,
        "max_tokens": output_tokens,
        "min_tokens": output_tokens,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    remaining, total = [count], [0]

    async def connection():
        client = LeanStreamClient(f"http://{api_url}", "/v1/completions", body)
        try:
            while remaining[0] > 0:
                remaining[0] -= 1
                _first, tokens = await client.stream()
                if tokens is None:
                    raise SystemExit("an API stream ended without usage")
                total[0] += tokens
        finally:
            client.close()

    await asyncio.gather(*(connection() for _ in range(min(concurrency, count))))
    return total[0]


def start_api(server, repo: Path, port: int, work: Path):
    """The API as `toolkit serve --openai-port` starts it (python -m toolkit.api)."""
    settings = ApiSettings(server.grpc_url, repo, max_in_flight=1024)
    process, _log = launch_api(settings, host="127.0.0.1", port=port, log_file=work / "api.log")
    return process


# --- profiling ----------------------------------------------------------------------------------
def profile_phase(server, phase: str, send, args, out: Path, extra: dict | None = None) -> dict:
    """py-spy on every stub (and the API) while the phase runs again (not counted: sampling costs CPU itself)."""
    procs = {
        k: p
        for k, p in {**server_processes(server.pid), **(extra or {})}.items()
        if k != "tritonserver"
    }
    spies = {}
    for label, proc in procs.items():
        path = out / f"{args.name}.pyspy.{phase}.{label.split(':', 1)[-1]}.txt"
        spies[label] = (
            path,
            subprocess.Popen(
                [
                    str(Path(sys.executable).parent / "py-spy"),
                    "record",
                    "--pid",
                    str(proc.pid),
                    "--format",
                    "raw",
                    "--rate",
                    "250",
                    "--nonblocking",
                    "--output",
                    str(path),
                    "--duration",
                    str(args.profile_seconds),
                ],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,
            ),
        )
    send(args.requests, "profile")
    summary = {}
    for label, (path, spy) in spies.items():
        spy.wait(args.profile_seconds + 30)
        summary[label] = top_frames(path)
    return summary


def top_frames(path: Path, n: int = 12) -> list[tuple[str, float]]:
    """Self time by leaf frame (share of samples) from py-spy's collapsed-stack output."""
    leaves, total = Counter(), 0
    if not path.is_file():
        return []
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        frames = stack.split(";")
        leaf = frames[-1]
        leaves[leaf] += int(count)
        total += int(count)
    return (
        [(frame, round(hits / total, 3)) for frame, hits in leaves.most_common(n)] if total else []
    )


# --- the run ------------------------------------------------------------------------------------
def build_repository(model: str, step_time_ms: float, folder: Path) -> Path:
    repo = folder / "synthetic_repo"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "toolkit.cli.main",
            "build",
            "-t",
            "synthetic",
            "-m",
            model,
            "-o",
            str(repo),
            "--step-time-ms",
            str(step_time_ms),
        ],
        check=True,
        stdout=subprocess.DEVNULL,
    )
    return repo


def median_by_key(rows: list[dict]) -> dict:
    return {k: statistics.median(r[k] for r in rows if k in r) for k in rows[0]}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--model",
        default="smollm2-135m-instruct",
        help="checkpoint whose tokenizer the repository carries",
    )
    parser.add_argument(
        "--repo", type=Path, default=None, help="an already-built synthetic repository"
    )
    parser.add_argument(
        "--step-time-ms",
        type=float,
        default=0.0,
        help="synthetic engine step (0: as fast as the stack takes)",
    )
    parser.add_argument(
        "--repeats", type=int, default=3, help="repeats of all phases; results are medians"
    )
    parser.add_argument(
        "--phases",
        default="engine,ensemble,openai",
        help="comma-separated, engine first: engine,ensemble,bls,openai",
    )
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--requests", type=int, default=192)
    parser.add_argument("--input-tokens", type=int, default=64)
    parser.add_argument("--output-tokens", type=int, default=128)
    parser.add_argument(
        "--port-base", type=int, default=20200, help="HTTP port; gRPC +1, metrics +2, OpenAI API +3"
    )
    parser.add_argument(
        "--profile", action="store_true", help="also sample every stub and the API with py-spy"
    )
    parser.add_argument("--profile-seconds", type=int, default=8)
    parser.add_argument("--out", type=Path, default=HERE / "results")
    parser.add_argument("--name", default="stack_ceiling", help="result file stem")
    args = parser.parse_args(argv)
    names = [p for p in args.phases.split(",") if p]
    if names[0] != "engine":
        parser.error(
            "--phases must start with engine (the baseline every other phase is measured against)"
        )

    args.out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="stack-ceiling-"))
    repo = (args.repo or build_repository(args.model, args.step_time_ms, work)).resolve()
    pa = find_perf_analyzer()
    server = launch_server(
        ServerConfig(
            repo=repo,
            http_port=args.port_base,
            grpc_port=args.port_base + 1,
            metrics_port=args.port_base + 2,
            log_file=work / "tritonserver.log",
        )
    )
    api = None
    try:
        repository = open_repository(repo)
        prompts = make_prompts(
            repository.tokenizer_json,
            32,
            args.input_tokens,
            add_special_tokens=repository.tokens.add_special_tokens,
            bos_id=repository.tokens.bos_id,
            seed=1,
        )
        inputs = {
            m: write_input_data(work / f"{m}.json", prompts, args.output_tokens, m)
            for m in (c.ENGINE, c.ENSEMBLE)
        }
        extra = {}
        loads = {
            "engine": (
                c.ENGINE,
                perf_analyzer_load(server, pa, c.ENGINE, inputs[c.ENGINE], args, work / "engine"),
            ),
            "ensemble": (
                c.ENSEMBLE,
                perf_analyzer_load(
                    server, pa, c.ENSEMBLE, inputs[c.ENSEMBLE], args, work / "ensemble"
                ),
            ),
            "bls": (
                c.BLS,
                perf_analyzer_load(server, pa, c.BLS, inputs[c.ENSEMBLE], args, work / "bls"),
            ),
        }
        if "openai" in names:
            api = start_api(server, repo, args.port_base + 3, work)
            extra = {"api": psutil.Process(api.pid)}
            loads["openai"] = (c.ENGINE, api_load(f"127.0.0.1:{args.port_base + 3}", args))
        repeats = []
        for _ in range(args.repeats):
            repeats.append(
                [
                    run_phase(
                        server, n, loads[n][0], loads[n][1], args, extra if n == "openai" else None
                    )
                    for n in names
                ]
            )
            print(
                " ".join(f"{p.phase} {p.us_per_token['total']:.1f}" for p in repeats[-1]),
                "us/token",
                flush=True,
            )
        profile = {}
        if args.profile:
            profile = {
                n: profile_phase(
                    server, n, loads[n][1], args, args.out, extra if n == "openai" else None
                )
                for n in names
                if n in ("ensemble", "openai")
            }
    finally:
        if api is not None:
            stop_process(api)
        server.stop()
    record(args, repeats, profile, repo)
    return 0


def record(args, repeats: list[list[PhaseResult]], profile: dict, repo: Path) -> None:
    """Per repeat: each phase's us/token minus the engine's from the same repeat; then medians."""
    beyond_rows, total_rows, split_rows = [], [], {}
    for phases in repeats:
        engine = phases[0].us_per_token["total"]
        beyond_rows.append({p.phase: p.us_per_token["total"] - engine for p in phases[1:]})
        total_rows.append({p.phase: p.us_per_token["total"] for p in phases})
        for p in phases:
            split_rows.setdefault(p.phase, []).append(p.us_per_token)
    beyond = median_by_key(beyond_rows)
    totals = median_by_key(total_rows)
    splits = {phase: median_by_key(rows) for phase, rows in split_rows.items()}
    manifest = open_repository(repo).manifest.to_dict()
    result = {
        "command": "python perf/stack_ceiling.py " + " ".join(sys.argv[1:]),
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": {"cpus": os.cpu_count(), "load_avg_1m": os.getloadavg()[0]},
        "settings": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "engine_parameters": manifest.get("engine"),
        "repeats": [[asdict(p) for p in phases] for phases in repeats],
        "median_us_per_token": totals,
        "median_us_per_token_by_process": splits,
        "median_beyond_engine_us_per_token": beyond,
        "beyond_engine_per_repeat": beyond_rows,
        "tokens_per_s_per_core_beyond_engine": {
            k: (1e6 / v if v > 0 else None) for k, v in beyond.items()
        },
        "target_us_per_token": TARGET_US_PER_TOKEN,
        "meets_target": {k: v <= TARGET_US_PER_TOKEN for k, v in beyond.items()},
        "profile_top_frames": profile,
    }
    (args.out / f"{args.name}.json").write_text(json.dumps(result, indent=2) + "\n")
    (args.out / f"{args.name}.md").write_text(markdown(result))
    print(markdown(result))


def markdown(result: dict) -> str:
    n = len(result["repeats"])
    lines = [
        f"# Stack ceiling ({result['when']})",
        "",
        f"`{result['command']}`",
        "",
        f"machine: {result['machine']['cpus']} CPUs shared with other work (1-min load at the end "
        f"{result['machine']['load_avg_1m']:.2f}); synthetic engine {result['engine_parameters']}; "
        f"{result['settings']['concurrency']} streams, {result['settings']['input_tokens']} in / "
        f"{result['settings']['output_tokens']} out tokens, {result['settings']['requests']} requests per phase; "
        f"medians of {n} repeats, each phase minus the engine-alone phase of the same repeat.",
        "",
        "| phase | CPU us/token: total | beyond engine | one core carries (beyond engine) | per process (us/token) |",
        "|---|---|---|---|---|",
    ]
    beyond, per_core = (
        result["median_beyond_engine_us_per_token"],
        result["tokens_per_s_per_core_beyond_engine"],
    )
    for phase, total in result["median_us_per_token"].items():
        split = ", ".join(
            f"{k.removeprefix('stub:')} {v:.1f}"
            for k, v in result["median_us_per_token_by_process"][phase].items()
            if k != "total" and v >= 0.05
        )
        b = f"**{beyond[phase]:.1f}**" if phase in beyond else "(baseline)"
        core = f"{per_core[phase]:,.0f} tokens/s" if per_core.get(phase) else "-"
        lines.append(f"| {phase} | {total:.1f} | {b} | {core} | {split} |")
    lines += [
        "",
        "beyond the engine, per repeat: "
        + "; ".join(
            ", ".join(f"{k} {v:.1f}" for k, v in row.items())
            for row in result["beyond_engine_per_repeat"]
        ),
        "",
        f"target <= {result['target_us_per_token']:.0f} us/token beyond the engine: "
        + ", ".join(
            f"{k} {'met' if ok else 'NOT met'}" for k, ok in result["meets_target"].items()
        ),
        "",
    ]
    for phase, procs in (result.get("profile_top_frames") or {}).items():
        lines.append(f"## py-spy, {phase} phase (self time by leaf frame)")
        for label, frames in procs.items():
            lines.append(f"- {label}: " + "; ".join(f"{f} {s:.0%}" for f, s in frames[:6]))
        lines.append("")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
