"""The OpenAI API as a front end: its CPU per streamed token, what a second worker buys, what tracing costs.

One synthetic repository on one tritonserver (started here, traced at rate 0: it traces only the
requests that carry a context, so an untraced API's requests cost it nothing but the check), a local
OTLP endpoint in its own process (--collector: a sink that reads and drops each export, by default,
or `toolkit trace collect`), and the API as
`toolkit serve --openai-port` starts it (python -m toolkit.api, its own process). Closed-loop streams
of streaming /v1/completions (max_tokens = min_tokens = --output-tokens) from the toolkit's lean
client (raw asyncio streams, in this process). Sides alternate within each
round so that drift on a shared machine hits them alike; the results are medians over --rounds.

  workers   --streams-workers streams (64) against 1 and against 2 API workers, engine steps of
            --workers-step-ms (0: as fast as the stack takes): API tokens/s (the ratio is the goal:
            >= 1.7) and API CPU us per streamed token (supervisor + workers, from /proc; goal <= 36)
  tracing   --streams-tracing streams (16) against an API tracing every request (Triton and the engine
            trace them too) and an API that traces nothing, engine steps of --tracing-step-ms (10):
            tokens/s lost (goal <= 3 %) and TTFT p50 added (goal <= 1 ms)
  baseline  --streams-workers streams against one API worker run from --baseline-tree (an older copy
            of the toolkit's tree) and one from this tree: API CPU us per streamed token, old and new
  interval  one API per --stream-intervals value (1,4,16: `toolkit serve --stream-interval`), at
            saturation (--streams-workers streams, --workers-step-ms steps) and paced (--streams-tracing
            streams, --tracing-step-ms steps): API CPU us per streamed token, tokens/s, TTFT p50; and the
            largest interval once more with the API holding per-step responses (as on a GPU engine)
  floor     one API worker on each engine transport (gRPC; --engine-transport http) beside
            perf/bare_relay.py (the least a Python relay of one SSE chunk per engine response does) over
            gRPC and over Triton's HTTP generate_stream, at saturation and paced as interval is: CPU us
            per streamed token of each, and their ratios

--engine-transport http: the APIs of workers, interval and baseline's "this tree" read the engine over
Triton's HTTP generate_stream (`toolkit serve --engine-transport http`) instead of gRPC.

TTFT added over direct Triton gRPC at 16 streams (goal <= 5 ms p50) is perf/api_overhead.py's (it takes
--api-workers). Examples:

    python perf/api_front_end.py --rounds 3 --out perf/results/api_front_end
    python perf/api_front_end.py --rounds 1 --requests-per-stream 1 --output-tokens 32   # a quick look
    git archive REV | tar -x -C /tmp/old && \
      python perf/api_front_end.py --measure baseline --baseline-tree /tmp/old --out perf/results/api_hotpath
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench_support import arrival_pauses, run_meta, think_ms_value, write_results_json  # noqa: E402

from toolkit.api.app import ApiSettings  # noqa: E402
from toolkit.bench.sweep import port_answers  # noqa: E402
from toolkit.client.sse import LeanStreamClient  # noqa: E402
from toolkit.repository.reader import open_repository  # noqa: E402
from toolkit.serve.api_process import launch_api  # noqa: E402
from toolkit.serve.launcher import ServerConfig, launch_server  # noqa: E402
from toolkit.serve.net import free_port  # noqa: E402
from toolkit.subprocs import stop_process  # noqa: E402
from toolkit.trace.config import TracePlan  # noqa: E402

PROMPT = "1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12,"
GOALS = {
    "workers_tokens_per_s_ratio_min": 1.7,
    "api_us_per_token_max": 36.0,
    "tracing_tokens_per_s_lost_pct_max": 3.0,
    "tracing_ttft_p50_added_ms_max": 1.0,
}


# --- load -------------------------------------------------------------------------------------------
async def closed_loop(
    url: str, model: str, streams: int, per_stream: int, output_tokens: int, think_ms: float = 0.0
):
    """`streams` connections, each sending `per_stream` requests one after the other, each after its
    arrival pause (bench_support.arrival_pauses: none when `think_ms` is 0)."""
    body = {
        "model": model, "prompt": PROMPT, "max_tokens": output_tokens, "min_tokens": output_tokens,
        "temperature": 0, "stream": True, "stream_options": {"include_usage": True},
    }  # fmt: skip
    ttfts, tokens, short = [], [0], [0]

    async def stream(index: int) -> None:
        client = LeanStreamClient(url, "/v1/completions", body)
        pause = arrival_pauses(index, think_ms)
        try:
            for _ in range(per_stream):
                await pause()
                first, count = await client.stream()
                if first is not None:
                    ttfts.append(first)
                tokens[0] += count or 0
                short[0] += (count or 0) != output_tokens
        finally:
            client.close()

    start = time.perf_counter()
    await asyncio.gather(*(stream(index) for index in range(streams)))
    return {
        "wall_s": time.perf_counter() - start, "tokens": tokens[0], "ttfts": ttfts,
        "short_requests": short[0],
    }  # fmt: skip


def api_cpu_s(process: subprocess.Popen) -> float:
    """CPU seconds of the API: its process and every worker it forked."""
    root = psutil.Process(process.pid)
    total = 0.0
    for proc in [root, *root.children(recursive=True)]:
        times = proc.cpu_times()
        total += times.user + times.system
    return total


def server_cpu_s(pid: int) -> tuple[float, float]:
    """CPU seconds of tritonserver itself and of its Python backend stubs (the engines, BLS, pre- and
    postprocessing), which it starts as its children."""
    root = psutil.Process(pid)
    own = sum(root.cpu_times()[:2])
    stubs = 0.0
    for proc in root.children(recursive=True):
        try:
            stubs += sum(proc.cpu_times()[:2])
        except psutil.NoSuchProcess:
            pass
    return own, stubs


def phase(
    api, url: str, model: str, streams: int, args, think_ms: float = 0.0, server_pid: int = 0
) -> dict:
    """One closed-loop run against `url`: tokens/s, TTFT p50, and CPU per token of the API and (with
    `server_pid`) of tritonserver and its stubs, which serve only this run meanwhile."""
    before = api_cpu_s(api)
    server_before = server_cpu_s(server_pid) if server_pid else (0.0, 0.0)
    result = asyncio.run(
        closed_loop(url, model, streams, args.requests_per_stream, args.output_tokens, think_ms)
    )
    cpu = api_cpu_s(api) - before
    tokens = max(1, result["tokens"])
    measures = {
        "tokens": result["tokens"],
        # requests whose usage said fewer than --output-tokens (min_tokens asks for them all): 0 expected
        "short_requests": result["short_requests"],
        "tokens_per_s": result["tokens"] / result["wall_s"],
        "ttft_p50_ms": 1000 * statistics.median(result["ttfts"]),
        "api_us_per_token": 1e6 * cpu / tokens,
    }
    if server_pid:
        own, stubs = (b - a for a, b in zip(server_before, server_cpu_s(server_pid), strict=True))
        measures["triton_us_per_token"] = 1e6 * own / tokens
        measures["stubs_us_per_token"] = 1e6 * stubs / tokens
    return measures


# --- the stack ----------------------------------------------------------------------------------------
def build_repository(folder: Path, step_ms: float, model: str) -> Path:
    repo = folder / f"synthetic-{step_ms:g}ms"
    subprocess.run(
        [sys.executable, "-m", "toolkit.cli.main", "build", "-t", "synthetic", "-m", model,
         "--step-time-ms", str(step_ms), "--max-batch-size", "128", "-o", str(repo)],
        check=True, stdout=subprocess.DEVNULL,
    )  # fmt: skip
    return repo


def _sink(port: int, batches, received) -> None:
    """An OTLP/HTTP endpoint that reads each export and answers 200 without parsing it (a process)."""
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    class Sink(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args) -> None:
            pass

        def do_POST(self) -> None:  # noqa: N802 - http.server's name
            size = len(self.rfile.read(int(self.headers.get("content-length") or 0)))
            with batches.get_lock():
                batches.value += 1
                received.value += size
            json_body = "json" in self.headers.get("content-type", "")
            body = b"{}" if json_body else b""
            self.send_response(200)
            self.send_header("Content-Type", self.headers.get("content-type", "application/json"))
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    ThreadingHTTPServer(("127.0.0.1", port), Sink).serve_forever()


class Collector:
    """Where the stack exports spans, in its own process (as a collector would be: inside this one it
    would parse every export under the load client's GIL and delay the client's reads).

    `sink` (the default): an endpoint that reads each export and answers 200 without parsing it, so
    that what tracing costs the serving stack is measured apart from what a collector costs (in
    production it runs elsewhere); `toolkit`: `toolkit trace collect`, parsing every span and writing
    it to `work`/spans.jsonl, on the same 2 cores."""

    def __init__(self, work: Path, kind: str = "sink"):
        self.kind = kind
        self.out = work / "spans.jsonl"
        port = free_port()
        self.url = f"http://127.0.0.1:{port}"
        if kind == "sink":
            context = multiprocessing.get_context("spawn")
            self.batches, self.bytes = context.Value("q", 0), context.Value("q", 0)
            self.process = context.Process(
                target=_sink, args=(port, self.batches, self.bytes), daemon=True
            )
            self.process.start()
        else:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "toolkit.cli.main", "trace", "collect", "-p", str(port),
                 "-o", str(self.out)],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
            )  # fmt: skip
        deadline = time.monotonic() + 60
        try:
            while not port_answers(f"127.0.0.1:{port}"):
                if not self._alive() or time.monotonic() > deadline:
                    raise SystemExit(
                        f"the trace {kind} did not start on port {port} within 60 s: run "
                        f"`toolkit trace collect -p {port}` to see why, or use --collector sink"
                    )
                time.sleep(0.1)
        except BaseException:
            self.__exit__()
            raise

    def _alive(self) -> bool:
        if isinstance(self.process, subprocess.Popen):
            return self.process.poll() is None
        return self.process.is_alive()

    def received(self) -> dict:
        """What arrived so far: export batches and bytes (sink), or spans (toolkit trace collect)."""
        if self.kind == "sink":
            return {"batches": self.batches.value, "bytes": self.bytes.value}
        if not self.out.exists():
            return {"spans": 0}
        with self.out.open("rb") as lines:
            return {"spans": sum(1 for _ in lines)}

    def __enter__(self) -> Collector:
        return self

    def __exit__(self, *exc) -> None:
        if isinstance(self.process, subprocess.Popen):
            stop_process(self.process, 10)
        else:
            self.process.terminate()
            self.process.join(10)


class Stack:
    """A traced tritonserver on `repo` and any number of APIs in front of it."""

    def __init__(self, repo: Path, receiver: Collector, work: Path):
        self.repo = repo
        self.work = work
        self.plan = TracePlan(f"{receiver.url}/v1/traces", 1.0, "toolkit-perf")
        ports = [free_port() for _ in range(3)]
        self.server = launch_server(
            ServerConfig(
                repo=repo, http_port=ports[0], grpc_port=ports[1], metrics_port=ports[2],
                log_file=work / f"triton-{repo.name}.log", trace=self.plan, traced_by_api=True,
            )
        )  # fmt: skip
        self.apis: list = []

    def api(
        self,
        workers: int = 1,
        traced: bool = False,
        tree: Path | None = None,
        interval: int = 1,
        repo: Path | None = None,
        engine_http: bool = False,
    ):
        """An API of `workers` processes; `tree`: a source tree of the toolkit to run it from (a baseline);
        `interval`: its --stream-interval; `repo`: the repository it reads, if not the served one's;
        `engine_http`: it reads the engine over Triton's HTTP generate_stream (--engine-transport http)."""
        port = free_port()
        settings = ApiSettings(
            self.server.grpc_url, repo or self.repo, max_in_flight=1024,
            trace=self.plan if traced else None,
            **({"stream_interval": interval} if interval > 1 else {}),
            **({"engine_http_url": self.server.http_url} if engine_http else {}),
        )  # fmt: skip
        # The API process imports the toolkit from `tree`: PYTHONSAFEPATH keeps `python -m` from
        # putting the working directory (this checkout, when run from its root) ahead of PYTHONPATH,
        # which made a baseline run this tree on both sides.
        override = {"PYTHONPATH": str(tree), "PYTHONSAFEPATH": "1"} if tree is not None else {}
        saved = {name: os.environ.get(name) for name in override}
        os.environ.update(override)
        try:
            process, _ = launch_api(
                settings, host="127.0.0.1", port=port, workers=workers,
                log_file=self.work / f"api-{port}.log",
            )  # fmt: skip
        finally:
            for name, value in saved.items():
                if value is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = value
        self.apis.append(process)
        return process, f"http://127.0.0.1:{port}"

    def relay(self, upstream: str = "grpc"):
        """perf/bare_relay.py in its own process: the floor of a Python relay, against this server, reading
        the engine over `upstream` (grpc: ModelStreamInfer as the API does; http: generate_stream)."""
        port = free_port()
        url = self.server.grpc_url if upstream == "grpc" else self.server.http_url
        with open(self.work / f"relay-{port}.log", "wb") as log:
            process = subprocess.Popen(
                [sys.executable, str(Path(__file__).with_name("bare_relay.py")),
                 "--upstream", upstream, f"--{upstream}-url", url, "--port", str(port)],
                stdout=subprocess.DEVNULL, stderr=log, start_new_session=True,
            )  # fmt: skip
        self.apis.append(process)
        deadline = time.monotonic() + 60
        while not port_answers(f"127.0.0.1:{port}"):
            if process.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(
                    f"perf/bare_relay.py did not start: see {self.work}/relay-{port}.log"
                )
            time.sleep(0.1)
        return process, f"http://127.0.0.1:{port}"

    def close(self) -> None:
        for process in self.apis:
            stop_process(process, 20)
        self.server.stop()


def served_model(repo: Path) -> str:
    return open_repository(repo).served_model_name


def compare(stack: Stack, sides: dict, streams: int, args, think_ms: float = 0.0) -> dict:
    """Each side in turn, --rounds times; the median of each measure per side (short_requests: the sum)."""
    model = served_model(stack.repo)
    for _, url in sides.values():  # warm-up: channels, allocator pools, first-request paths
        asyncio.run(closed_loop(url, model, min(streams, 8), 1, args.output_tokens))
    rounds: dict[str, list[dict]] = {name: [] for name in sides}
    for index in range(args.rounds):
        for name, (api, url) in sides.items():
            rounds[name].append(phase(api, url, model, streams, args, think_ms, stack.server.pid))
            print(f"round {index + 1} {name}: {json.dumps(rounds[name][-1])}", flush=True)
    return {
        name: {
            key: sum(r[key] for r in results)  # every round's, not the median
            if key == "short_requests"
            else round(statistics.median(r[key] for r in results), 3)
            for key in results[0]
        }
        for name, results in rounds.items()
    }


def run(args) -> dict:
    work = Path(tempfile.mkdtemp(prefix="api-front-end-"))
    results: dict = {}
    with Collector(work, args.collector) as receiver:
        if "workers" in args.measure:
            stack = Stack(
                args.repo or build_repository(work, args.workers_step_ms, args.model),
                receiver,
                work,
            )
            try:
                http = args.engine_transport == "http"
                sides = {
                    "1 worker": stack.api(1, engine_http=http),
                    "2 workers": stack.api(2, engine_http=http),
                }
                medians = compare(stack, sides, args.streams_workers, args)
                one, two = medians["1 worker"], medians["2 workers"]
                results["workers"] = {
                    "streams": args.streams_workers,
                    "step_ms": args.workers_step_ms,
                    "engine_transport": args.engine_transport,
                    **medians,
                    "tokens_per_s_ratio": round(two["tokens_per_s"] / one["tokens_per_s"], 3),
                }
            finally:
                stack.close()
        if "baseline" in args.measure:
            results["baseline"] = baseline(args, receiver, work)
        if "interval" in args.measure:
            for key, streams, step_ms in (
                ("interval", args.streams_workers, args.workers_step_ms),
                ("interval_paced", args.streams_tracing, args.tracing_step_ms),
            ):
                results[key] = intervals(args, receiver, work, streams, step_ms)
        if "floor" in args.measure:
            for key, streams, step_ms in (
                ("floor", args.streams_workers, args.workers_step_ms),
                ("floor_paced", args.streams_tracing, args.tracing_step_ms),
            ):
                results[key] = floor(args, receiver, work, streams, step_ms)
        if "tracing" in args.measure:
            stack = Stack(build_repository(work, args.tracing_step_ms, args.model), receiver, work)
            try:
                sides = {"tracing off": stack.api(), "tracing on (100 %)": stack.api(traced=True)}
                for think_ms in args.tracing_think_ms:
                    before = receiver.received()
                    medians = compare(stack, sides, args.streams_tracing, args, think_ms)
                    after = receiver.received()
                    off, on = medians["tracing off"], medians["tracing on (100 %)"]
                    key = "tracing" if not think_ms else f"tracing_think_{think_ms:g}ms"
                    results[key] = {
                        "streams": args.streams_tracing,
                        "step_ms": args.tracing_step_ms,
                        "think_ms": think_ms,
                        **medians,
                        "tokens_per_s_lost_pct": round(
                            100 * (1 - on["tokens_per_s"] / off["tokens_per_s"]), 2
                        ),
                        "ttft_p50_added_ms": round(on["ttft_p50_ms"] - off["ttft_p50_ms"], 3),
                        "collector": args.collector,
                        "received": {k: after[k] - before[k] for k in after},
                    }
            finally:
                stack.close()
    return results


def baseline(args, receiver: Collector, work: Path) -> dict:
    """One API worker from --baseline-tree against one from this tree, on one tritonserver."""
    if args.baseline_tree is None:
        raise SystemExit(
            "--measure baseline needs --baseline-tree (a copy of the old toolkit's tree)"
        )
    repo = args.repo or build_repository(work, args.workers_step_ms, args.model)
    stack = Stack(repo, receiver, work)
    try:
        sides = {
            "baseline": stack.api(1, tree=args.baseline_tree),
            "this tree": stack.api(1, engine_http=args.engine_transport == "http"),
        }
        medians = compare(stack, sides, args.streams_workers, args)
        old, new = medians["baseline"], medians["this tree"]
        return {
            "streams": args.streams_workers,
            "step_ms": args.workers_step_ms,
            "baseline_tree": str(args.baseline_tree),
            "engine_transport": args.engine_transport,
            **medians,
            "api_us_per_token_ratio": round(new["api_us_per_token"] / old["api_us_per_token"], 3),
            "tokens_per_s_ratio": round(new["tokens_per_s"] / old["tokens_per_s"], 3),
        }
    finally:
        stack.close()


def floor(args, receiver: Collector, work: Path, streams: int, step_ms: float) -> dict:
    """One API worker beside perf/bare_relay.py on one tritonserver, the same load on each: how far the
    API's CPU per streamed token is above what any Python relay of one chunk per token pays."""
    stack = Stack(build_repository(work / f"floor{step_ms:g}", step_ms, args.model), receiver, work)
    try:
        sides = {
            "API (1 worker)": stack.api(1),
            "API (1 worker), --engine-transport http": stack.api(1, engine_http=True),
            "bare relay": stack.relay(),
            "bare relay, HTTP upstream": stack.relay("http"),
        }
        medians = compare(stack, sides, streams, args)
        api, relay = medians["API (1 worker)"], medians["bare relay"]
        http = medians["bare relay, HTTP upstream"]
        api_http = medians["API (1 worker), --engine-transport http"]
        return {
            "streams": streams,
            "step_ms": step_ms,
            **medians,
            "api_us_per_token_over_relay": round(
                api["api_us_per_token"] / relay["api_us_per_token"], 3
            ),
            "http_relay_us_per_token_over_relay": round(
                http["api_us_per_token"] / relay["api_us_per_token"], 3
            ),
            "api_http_us_per_token_over_api": round(
                api_http["api_us_per_token"] / api["api_us_per_token"], 3
            ),
            "api_http_us_per_token_over_http_relay": round(
                api_http["api_us_per_token"] / http["api_us_per_token"], 3
            ),
        }
    finally:
        stack.close()


def intervals(args, receiver: Collector, work: Path, streams: int, step_ms: float) -> dict:
    """One API per --stream-intervals value on one tritonserver; each against the first (interval 1). One
    more API at the largest interval reads a copy of the repository whose capabilities say the engine does
    not keep the interval (as a GPU engine's): the engine answers every step and the API holds them."""
    repo = build_repository(work / f"step{step_ms:g}", step_ms, args.model)
    stack = Stack(repo, receiver, work)
    try:
        http = args.engine_transport == "http"
        sides = {
            f"interval {n}": stack.api(interval=n, engine_http=http) for n in args.stream_intervals
        }
        largest = max(args.stream_intervals)
        if largest > 1:
            sides[f"interval {largest} (API hold)"] = stack.api(
                interval=largest, repo=api_hold_copy(repo), engine_http=http
            )
        medians = compare(stack, sides, streams, args)
        first = medians[f"interval {args.stream_intervals[0]}"]
        return {
            "streams": streams,
            "step_ms": step_ms,
            "engine_transport": args.engine_transport,
            **medians,
            "api_us_per_token_ratio": {
                name: round(m["api_us_per_token"] / first["api_us_per_token"], 3)
                for name, m in medians.items()
            },
        }
    finally:
        stack.close()


def api_hold_copy(repo: Path) -> Path:
    """A copy of `repo` whose manifest says its engine does not answer every N tokens itself (the GPU
    engines' capability), so an API reading it holds the engine's per-step responses instead."""
    copy = repo.with_name(repo.name + "-api-hold")
    shutil.copytree(repo, copy)
    manifest = copy / "manifest.json"
    data = json.loads(manifest.read_text())
    data["capabilities"]["engine_stream_interval"] = False
    manifest.write_text(json.dumps(data, indent=2))
    return copy


def write(args, results: dict) -> None:
    meta = run_meta(
        rounds=args.rounds, requests_per_stream=args.requests_per_stream,
        output_tokens=args.output_tokens, goals=GOALS,
    )  # fmt: skip
    out = write_results_json(args.out, meta, results)
    lines = [
        "# The OpenAI API as a front end: CPU per token, a second worker, tracing",
        "",
        f"`{meta['command']}`",
        "",
        f"{meta['date']}; {meta['machine']['cpus']} CPUs, 1-min load {meta['machine']['load_1min']} at the end; "
        f"medians of {args.rounds} alternating rounds; {args.output_tokens} tokens per request, "
        f"{args.requests_per_stream} requests per stream.",
        "",
    ]
    if "workers" in results:
        w = results["workers"]
        lines += [
            f"## 1 vs 2 API workers, {w['streams']} streams, engine step {w['step_ms']:g} ms"
            f"{_transport(w)}",
            "",
            *_cpu_table(w, ("1 worker", "2 workers")),
            "",
            f"2 workers / 1: **{w['tokens_per_s_ratio']}x** tokens/s "
            f"(goal >= {GOALS['workers_tokens_per_s_ratio_min']}); "
            f"API CPU per token goal <= {GOALS['api_us_per_token_max']} us.",
            "",
        ]  # fmt: skip
    if "baseline" in results:
        b = results["baseline"]
        lines += [
            f"## This tree vs {b['baseline_tree']}, 1 API worker each, {b['streams']} streams, "
            f"engine step {b['step_ms']:g} ms{_transport(b)} (this tree)",
            "",
            *_cpu_table(b, ("baseline", "this tree")),
            "",
            f"This tree / baseline: **{b['api_us_per_token_ratio']}x** API CPU per token, "
            f"{b['tokens_per_s_ratio']}x tokens/s; goal <= {GOALS['api_us_per_token_max']} us per token.",
            "",
        ]  # fmt: skip
    for key in [k for k in results if k.startswith("floor")]:
        f = results[key]
        lines += [
            f"## The API vs a bare relay (perf/bare_relay.py), {f['streams']} streams, engine step "
            f"{f['step_ms']:g} ms",
            "",
            *_cpu_table(f, tuple(k for k in f if isinstance(f[k], dict))),
            "",
            f"API / bare relay: **{f['api_us_per_token_over_relay']}x** CPU per streamed token; goal for the "
            f"API <= {GOALS['api_us_per_token_max']} us. The relay does only what any Python relay of one "
            "gRPC message in and one SSE chunk out per token must (no validation, tokenizing, "
            "detokenizing, metrics, cancellation): its figure is the floor of a Python front end "
            "reading the engine over gRPC.",
            *(
                [
                    "",
                    f"Bare relay with Triton's HTTP generate_stream as its upstream / with gRPC: "
                    f"**{f['http_relay_us_per_token_over_relay']}x** CPU per streamed token (the same "
                    "relay, the other transport tritonserver offers).",
                    "",
                    f"API with --engine-transport http / with gRPC: **{f['api_http_us_per_token_over_api']}x** "
                    f"CPU per streamed token; over the bare relay with the same upstream: "
                    f"{f['api_http_us_per_token_over_http_relay']}x.",
                ]
                if "http_relay_us_per_token_over_relay" in f
                else []
            ),
            "",
        ]  # fmt: skip
    for key in [k for k in results if k.startswith("interval")]:
        t = results[key]
        names = [name for name in t if name.startswith("interval ")]
        held = [name for name in names if name.endswith("(API hold)")]
        lines += [
            f"## --stream-interval, 1 API worker, {t['streams']} streams, engine step {t['step_ms']:g} ms"
            f"{_transport(t)}",
            "",
            "| API | tokens/s | API CPU us/token | TTFT p50 | CPU per token / the first |",
            "|---|---|---|---|---|",
            *(f"| {k} | {t[k]['tokens_per_s']} | {t[k]['api_us_per_token']} | {t[k]['ttft_p50_ms']} ms | "
              f"{t['api_us_per_token_ratio'][k]}x |" for k in names),
            "",
            f"API CPU per token goal <= {GOALS['api_us_per_token_max']} us."
            + (f" {held[0]}: the engine answers every step (as a GPU engine does) and the API holds "
               "that many responses per chunk." if held else ""),
            "",
        ]  # fmt: skip
    for key in [k for k in results if k.startswith("tracing")]:
        t = results[key]
        arrivals = (
            f"each request after a random 0..{t['think_ms']:g} ms wait (arrivals at any point of a step)"
            if t.get("think_ms")
            else "requests back to back (each arrives in step with the response that ended the last)"
        )
        lines += [
            f"## Tracing every request vs none, {t['streams']} streams, engine step {t['step_ms']:g} ms, "
            f"{arrivals}",
            "",
            "| API | tokens/s | TTFT p50 | CPU us/token: API | tritonserver | its stubs |",
            "|---|---|---|---|---|---|",
            *(f"| {k} | {t[k]['tokens_per_s']} | {t[k]['ttft_p50_ms']} ms | {t[k]['api_us_per_token']} | "
              f"{t[k].get('triton_us_per_token', '-')} | {t[k].get('stubs_us_per_token', '-')} |"
              for k in ("tracing off", "tracing on (100 %)")),
            "",
            f"Tracing on: **{t['tokens_per_s_lost_pct']} %** tokens/s lost (goal <= "
            f"{GOALS['tracing_tokens_per_s_lost_pct_max']} %), **{t['ttft_p50_added_ms']} ms** TTFT p50 added "
            f"(goal <= {GOALS['tracing_ttft_p50_added_ms_max']} ms); received by the "
            f"{t['collector']} collector in this comparison: {t['received']}.",
            "",
        ]  # fmt: skip
    out.with_suffix(".md").write_text("\n".join(lines))


def _transport(section: dict) -> str:
    """A heading's note of the engine transport, when not gRPC (results before it existed were gRPC)."""
    transport = section.get("engine_transport", "grpc")
    return "" if transport == "grpc" else f", --engine-transport {transport}"


def _cpu_table(section: dict, arms: tuple[str, ...]) -> list[str]:
    """The table of API arms: tokens/s, API CPU per token, TTFT p50."""
    return [
        "| API | tokens/s | API CPU us/token | TTFT p50 |",
        "|---|---|---|---|",
        *(
            f"| {k} | {section[k]['tokens_per_s']} | {section[k]['api_us_per_token']} | "
            f"{section[k]['ttft_p50_ms']} ms |"
            for k in arms
        ),
        *(
            f"\n{k}: **{section[k]['short_requests']} requests came back short** of --output-tokens "
            "(their usage said fewer; min_tokens asked for all)."
            for k in arms
            if section[k].get("short_requests")
        ),
    ]


def stream_intervals(text: str) -> list[int]:
    """--stream-intervals: distinct whole numbers from 1 to 1024."""
    try:
        values = [int(x) for x in text.split(",")]
    except ValueError:
        values = []
    if not values or len(set(values)) != len(values) or not all(1 <= v <= 1024 for v in values):
        raise argparse.ArgumentTypeError(
            f"{text!r}: distinct whole numbers from 1 to 1024 (e.g. 1,4,16)"
        )
    return values


def think_times(text: str) -> list[float]:
    """--tracing-think-ms: distinct waits in ms, each >= 0."""
    values = [think_ms_value(x) for x in text.split(",")]
    if len(set(values)) != len(values):
        raise argparse.ArgumentTypeError(f"{text!r}: each wait once (e.g. 0,10)")
    return values


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--model", default="smollm2-135m-instruct", help="the tokenizer the repositories carry"
    )
    parser.add_argument(
        "--repo", type=Path, default=None, help="a synthetic repository for the workers measure"
    )
    parser.add_argument(
        "--measure",
        default="workers,tracing",
        help="any of workers, tracing, baseline, interval, floor (comma-separated)",
    )
    parser.add_argument(
        "--stream-intervals", type=stream_intervals, default=[1, 4, 16],
        help="interval: the --stream-interval of each API compared (the first is the reference)",
    )  # fmt: skip
    parser.add_argument(
        "--baseline-tree", type=Path, default=None,
        help="baseline: a copy of an older toolkit tree (git archive REV | tar -x -C DIR) to run one API from",
    )  # fmt: skip
    parser.add_argument("--streams-workers", type=int, default=64)
    parser.add_argument("--workers-step-ms", type=float, default=0.0)
    parser.add_argument("--streams-tracing", type=int, default=16)
    parser.add_argument("--tracing-step-ms", type=float, default=10.0)
    parser.add_argument(
        "--tracing-think-ms", type=think_times, default=[0.0, 10.0],
        help="tracing: one comparison per value, each request preceded by a random 0..T ms wait (0: back "
        "to back, in step with the engine's responses; the step time: arrivals at any point of a step)",
    )  # fmt: skip
    parser.add_argument(
        "--collector", choices=("sink", "toolkit"), default="sink",
        help="where spans go: a sink that reads and drops them, or toolkit trace collect (parses all)",
    )  # fmt: skip
    parser.add_argument(
        "--engine-transport", choices=("grpc", "http"), default="grpc",
        help="workers, interval, baseline (this tree): how the APIs read the engine (toolkit serve "
        "--engine-transport)",
    )  # fmt: skip
    parser.add_argument("--output-tokens", type=int, default=64)
    parser.add_argument("--requests-per-stream", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", default="perf/results/api_front_end")
    args = parser.parse_args()
    results = run(args)
    write(args, results)
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
