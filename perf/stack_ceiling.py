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
  openai    (hook) the OpenAI API in front of the ensemble, once toolkit/api serves streams
"beyond engine" = ensemble us/token - engine us/token. One core carries 1e6 / (us/token) tokens/s.

    python perf/stack_ceiling.py [--concurrency 32] [--requests 192] [--output-tokens 128] [--profile]

writes perf/results/stack_ceiling.json and .md (and, with --profile, py-spy collapsed stacks).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path

import psutil

from toolkit.bench.perf_analyzer import find_perf_analyzer, run_perf_analyzer
from toolkit.bench.prompts import find_tokenizer, make_prompts, write_input_data
from toolkit.repository import contract as c
from toolkit.serve.launcher import ServerConfig, launch_server

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
        result[label] = times.user + times.system  # the process's own threads; children are listed on their own
    return result


def model_stats(http_url: str) -> dict[str, dict]:
    with urllib.request.urlopen(f"http://{http_url}/v2/models/stats", timeout=10) as response:
        stats = json.load(response)["model_stats"]
    return {s["name"]: {"success": s["inference_stats"]["success"]["count"], "inferences": s["inference_count"]} for s in stats}


def run_phase(server, pa, phase: str, model: str, input_file: Path, args, out: Path) -> PhaseResult:
    procs = server_processes(server.pid)
    pa_args = ["-m", model, "-i", "grpc", "--streaming", "-u", server.grpc_url, "--async", "--input-data", str(input_file),
               "--concurrency-range", str(args.concurrency), "--stability-percentage", "999",
               "--measurement-interval", "600000"]
    # Warm-up: stubs, gRPC channels and allocator pools reach steady state before we count.
    run_perf_analyzer(pa, pa_args + ["--request-count", str(args.concurrency * 2)], out / f"{phase}.warmup.log", 300)
    before_stats, before_cpu, t0 = model_stats(server.http_url), cpu_seconds(procs), time.monotonic()
    run_perf_analyzer(pa, pa_args + ["--request-count", str(args.requests)], out / f"{phase}.perf_analyzer.log", 600)
    wall, after_cpu, after_stats = time.monotonic() - t0, cpu_seconds(procs), model_stats(server.http_url)
    requests = after_stats[model]["success"] - before_stats[model]["success"]
    tokens = requests * args.output_tokens
    post = after_stats[c.POSTPROCESSING]["inferences"] - before_stats[c.POSTPROCESSING]["inferences"]
    if model == c.ENSEMBLE and post != tokens:
        raise SystemExit(f"{phase}: postprocessing ran {post} times for {tokens} tokens; tokens are not one per streamed piece")
    cpu = {k: after_cpu[k] - before_cpu[k] for k in procs}
    cpu["total"] = sum(cpu.values())
    per_token = {k: v * 1e6 / tokens for k, v in cpu.items()}
    return PhaseResult(phase, model, requests, tokens, wall, cpu, per_token, tokens / wall,
                       post if model == c.ENSEMBLE else None)


# --- profiling ----------------------------------------------------------------------------------
def profile_phase(server, pa, model: str, input_file: Path, args, out: Path) -> dict:
    """py-spy on every stub while the phase runs again (not counted: sampling costs CPU itself)."""
    procs = {k: p for k, p in server_processes(server.pid).items() if k.startswith("stub:")}
    spies = {}
    for label, proc in procs.items():
        path = out / f"{args.name}.pyspy.{model}.{label.split(':', 1)[1]}.txt"
        spies[label] = (path, subprocess.Popen(
            [str(Path(sys.executable).parent / "py-spy"), "record", "--pid", str(proc.pid), "--format", "raw",
             "--rate", "250", "--nonblocking", "--output", str(path), "--duration", str(args.profile_seconds)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True))
    pa_args = ["-m", model, "-i", "grpc", "--streaming", "-u", server.grpc_url, "--async", "--input-data", str(input_file),
               "--concurrency-range", str(args.concurrency), "--stability-percentage", "999", "--measurement-interval", "600000",
               "--request-count", str(args.requests)]
    run_perf_analyzer(pa, pa_args, out / f"{args.name}.profile.{model}.perf_analyzer.log", 600)
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
    return [(frame, round(hits / total, 3)) for frame, hits in leaves.most_common(n)] if total else []


# --- the run ------------------------------------------------------------------------------------
def build_repository(model: str, step_time_ms: float, folder: Path) -> Path:
    repo = folder / "synthetic_repo"
    subprocess.run([sys.executable, "-m", "toolkit.cli.main", "build", "-t", "synthetic", "-m", model, "-o", str(repo),
                    "--step-time-ms", str(step_time_ms)], check=True, stdout=subprocess.DEVNULL)
    return repo


def batched_copy(repo: Path, folder: Path) -> Path:
    """A copy of the repository whose text models batch requests across streams (dynamic_batching {})."""
    import shutil

    target = folder / "batched_repo"
    shutil.copytree(repo, target, symlinks=True)
    for name in (c.PREPROCESSING, c.POSTPROCESSING):
        config = target / name / "config.pbtxt"
        if "dynamic_batching" not in config.read_text():
            config.write_text(config.read_text() + "dynamic_batching {\n}\n")
    return target


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="smollm2-135m-instruct", help="checkpoint whose tokenizer the repository carries")
    parser.add_argument("--repo", type=Path, default=None, help="an already-built synthetic repository")
    parser.add_argument("--step-time-ms", type=float, default=0.0, help="synthetic engine step (0: as fast as the stack takes)")
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--requests", type=int, default=192)
    parser.add_argument("--input-tokens", type=int, default=64)
    parser.add_argument("--output-tokens", type=int, default=128)
    parser.add_argument("--port-base", type=int, default=18200, help="HTTP port; gRPC +1, metrics +2")
    parser.add_argument("--profile", action="store_true", help="also sample every stub with py-spy")
    parser.add_argument("--profile-seconds", type=int, default=8)
    parser.add_argument("--out", type=Path, default=HERE / "results")
    parser.add_argument("--name", default="stack_ceiling", help="result file stem")
    parser.add_argument("--batch-text-models", action="store_true",
                        help="experiment: give pre/postprocessing dynamic batching (many streams' pieces per stub call)")
    args = parser.parse_args(argv)

    args.out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="stack-ceiling-"))
    repo = args.repo or build_repository(args.model, args.step_time_ms, work)
    if args.batch_text_models:
        repo = batched_copy(repo, work)
    pa = find_perf_analyzer()
    server = launch_server(ServerConfig(repo=repo.resolve(), http_port=args.port_base, grpc_port=args.port_base + 1,
                                        metrics_port=args.port_base + 2, log_file=work / "tritonserver.log"))
    try:
        prompts = make_prompts(find_tokenizer(repo), 32, args.input_tokens, seed=1)
        inputs = {m: write_input_data(work / f"{m}.json", prompts, args.output_tokens, m) for m in (c.ENGINE, c.ENSEMBLE)}
        phases = [run_phase(server, pa, "engine", c.ENGINE, inputs[c.ENGINE], args, work),
                  run_phase(server, pa, "ensemble", c.ENSEMBLE, inputs[c.ENSEMBLE], args, work),
                  run_phase(server, pa, "bls", c.BLS, inputs[c.ENSEMBLE], args, work)]
        profile = {}
        if args.profile:
            profile = {m: profile_phase(server, pa, m, inputs[m], args, args.out) for m in (c.ENSEMBLE,)}
    finally:
        server.stop()
    record(args, phases, profile, repo)
    return 0


def record(args, phases: list[PhaseResult], profile: dict, repo: Path) -> None:
    by = {p.phase: p for p in phases}
    engine, ensemble = by["engine"].us_per_token["total"], by["ensemble"].us_per_token["total"]
    bls = by["bls"].us_per_token["total"] - engine if "bls" in by else None
    beyond = ensemble - engine
    engine_stub_in_ensemble = by["ensemble"].us_per_token.get("stub:tensorrt_llm", 0.0)
    result = {
        "command": "python perf/stack_ceiling.py " + " ".join(sys.argv[1:]),
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": {"cpus": os.cpu_count(), "load_avg_1m": os.getloadavg()[0]},
        "settings": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "phases": [asdict(p) for p in phases],
        "us_per_token": {
            "engine_alone": engine,
            "ensemble_total": ensemble,
            "beyond_engine": beyond,
            "beyond_engine_upper_bound": ensemble - engine_stub_in_ensemble,
            "beyond_engine_via_bls": bls,
            "openai_api": None,  # hook: measured once toolkit/api streams (see perf/stack_ceiling.py docstring)
        },
        "tokens_per_s_per_core": {"beyond_engine": 1e6 / beyond if beyond > 0 else None,
                                   "ensemble_total": 1e6 / ensemble},
        "target_us_per_token": TARGET_US_PER_TOKEN,
        "meets_target": beyond <= TARGET_US_PER_TOKEN,
        "profile_top_frames": profile,
    }
    (args.out / f"{args.name}.json").write_text(json.dumps(result, indent=2) + "\n")
    (args.out / f"{args.name}.md").write_text(markdown(result, phases))
    print(markdown(result, phases))


def markdown(result: dict, phases: list[PhaseResult]) -> str:
    lines = [f"# Stack ceiling ({result['when']})", "", f"`{result['command']}`", "",
             f"machine: {result['machine']['cpus']} CPUs, 1-min load {result['machine']['load_avg_1m']:.2f} (shared)", "",
             "| phase | requests | tokens | wall s | tokens/s | " + " | ".join(["CPU us/token: total", "tritonserver", "stubs"]) + " |",
             "|---|---|---|---|---|---|---|---|"]
    for p in phases:
        stubs = ", ".join(f"{k[5:]} {v:.1f}" for k, v in p.us_per_token.items() if k.startswith("stub:") and v >= 0.05)
        lines.append(f"| {p.phase} | {p.requests} | {p.tokens} | {p.wall_s:.1f} | {p.tokens_per_s:,.0f} | "
                     f"{p.us_per_token['total']:.1f} | {p.us_per_token['tritonserver']:.1f} | {stubs} |")
    u, t = result["us_per_token"], result["tokens_per_s_per_core"]
    lines += ["", f"beyond the engine: **{u['beyond_engine']:.1f} us/token** "
              f"(upper bound, only the engine stub taken away: {u['beyond_engine_upper_bound']:.1f}); "
              f"one core carries {t['beyond_engine'] or 0:,.0f} tokens/s; target <= {result['target_us_per_token']:.0f} us/token: "
              f"{'met' if result['meets_target'] else 'NOT met'}", ""]
    for phase, stubs in (result.get("profile_top_frames") or {}).items():
        lines.append(f"## py-spy, {phase} phase (self time by leaf frame)")
        for label, frames in stubs.items():
            lines.append(f"- {label}: " + "; ".join(f"{f} {s:.0%}" for f, s in frames[:6]))
        lines.append("")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
