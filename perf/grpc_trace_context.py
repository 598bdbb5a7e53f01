"""How many traced requests tritonserver leaves out of their trace, by how the API reaches it.

tritonserver reads the `traceparent` of a gRPC call as a C string (GrpcServerCarrier::Get in
src/grpc/infer_handler.h returns the metadata value's data(), which is not NUL-terminated), so
whatever lies after the value in memory can join it; the W3C length check then fails, and Triton
traces nothing of that request. Its HTTP server copies headers into C strings and has no such fault.

One CPU repository (BENCH_MODEL) on tritonserver with tracing, a receiver, and the OpenAI API in
this process, sampling every request. Rounds alternate three arms, --requests streamed completions
each, one at a time:

  grpc          the gRPC transport as the API sends it: `traceparent`, then TRACEPARENT_GUARD
  grpc-bare     the gRPC transport with `traceparent` alone (the API before the guard)
  http          Triton's HTTP generate_stream (serve's default transport), the header

After each round: how many of its traces got no Triton span (InferRequest) within --settle-s.

    python perf/grpc_trace_context.py --rounds 3 --requests 200 --out perf/results/grpc_trace_context
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench_support import run_meta, write_results_json  # noqa: E402

from toolkit.api import ApiSettings, run_api_in_background  # noqa: E402
from toolkit.api import triton as triton_api  # noqa: E402
from toolkit.serve.net import free_port  # noqa: E402
from toolkit.trace.config import TracePlan  # noqa: E402
from toolkit.trace.receiver import SpanReceiver  # noqa: E402

ARMS = ("grpc", "grpc-bare", "http")


class GuardSwitch:
    """Sends gRPC calls with or without the guard entry (the API's own call, filtered)."""

    def __init__(self):
        self.bare = False
        self.original = triton_api.TritonBackend._stream_call
        switch = self

        def stream_call(backend, metadata):
            if switch.bare and metadata is not None:
                metadata = tuple(m for m in metadata if m != triton_api.TRACEPARENT_GUARD)
            return switch.original(backend, metadata)

        triton_api.TritonBackend._stream_call = stream_call  # type: ignore[method-assign]


def one_round(url: str, model: str, receiver: SpanReceiver, requests: int, settle_s: float) -> dict:
    """`requests` streamed completions through the API at `url`; their traces' Triton spans."""
    before = {r.trace_id for r in receiver.records}
    body = {"model": model, "prompt": "The capital of France is", "max_tokens": 2, "stream": True}
    with httpx.Client(timeout=60) as client:
        for _ in range(requests):
            with client.stream("POST", f"{url}/v1/completions", json=body) as response:
                response.raise_for_status()
                for _line in response.iter_lines():
                    pass
    time.sleep(settle_s)  # Triton's exporter sends every second; the API's and the engine's sooner
    names: dict[str, set[str]] = {}
    for record in receiver.records:
        if record.trace_id not in before:
            names.setdefault(record.trace_id, set()).add(record.name)
    roots = [t for t, n in names.items() if any(s.startswith("POST ") for s in n)]
    without = [t for t in roots if "InferRequest" not in names[t]]
    # every trace still has the engine's spans: without Triton's context it parents them on the API's
    orphaned = [t for t in roots if "engine.request" not in names[t]]
    return {"traces": len(roots), "without_triton": len(without), "without_engine": len(orphaned)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--requests", type=int, default=200, help="per arm and round")
    parser.add_argument("--settle-s", type=float, default=4.0)
    parser.add_argument("--out", type=Path, default=Path("perf/results/grpc_trace_context"))
    args = parser.parse_args()

    from bench_support import serve_cpu_repository  # noqa: PLC0415 - after argument checks

    workdir = Path(tempfile.mkdtemp(prefix="grpc-trace-context-"))
    switch = GuardSwitch()
    rounds: list[dict] = []
    with SpanReceiver(workdir / "spans.jsonl", port=0) as receiver:
        plan = TracePlan(f"{receiver.url}/v1/traces", 1.0, "grpc-trace-context")
        _model, server = serve_cpu_repository(
            workdir, workdir / "tritonserver.log", {"trace": plan, "traced_by_api": True}
        )
        apis = {
            "grpc": run_api_in_background(
                ApiSettings(server.grpc_url, workdir / "repo", trace=plan), port=free_port()
            ),
            "http": run_api_in_background(
                ApiSettings(
                    server.grpc_url, workdir / "repo", trace=plan, engine_http_url=server.http_url
                ),
                port=free_port(),
            ),
        }
        try:
            model = httpx.get(f"{apis['grpc'].url}/v1/models").json()["data"][0]["id"]
            for index in range(args.rounds):
                for arm in ARMS:
                    switch.bare = arm == "grpc-bare"
                    api = apis["http" if arm == "http" else "grpc"]
                    counts = one_round(api.url, model, receiver, args.requests, args.settle_s)
                    rounds.append({"round": index, "arm": arm, **counts})
                    print(f"round {index} {arm}: {counts}", flush=True)
        finally:
            for api in apis.values():
                api.stop()
            server.stop()

    summary = {}
    for arm in ARMS:
        mine = [r for r in rounds if r["arm"] == arm]
        traces = sum(r["traces"] for r in mine)
        without = sum(r["without_triton"] for r in mine)
        summary[arm] = {
            "traces": traces,
            "without_triton": without,
            "share_pct": round(100 * without / max(traces, 1), 2),
            "per_round": [r["without_triton"] for r in mine],
            "without_engine": sum(r["without_engine"] for r in mine),
        }
    meta = run_meta(rounds=args.rounds, requests=args.requests, guard=triton_api.TRACEPARENT_GUARD)
    out = write_results_json(args.out, meta, {"rounds": rounds, "summary": summary})
    lines = [
        "# Traced requests tritonserver leaves out of their trace, by transport",
        "",
        f"`{meta['command']}` ({meta['date']}, {meta['machine']['cpus']} CPUs, load "
        f"{meta['machine']['load_1min']}). tritonserver 2.51, the CPU engine, one request at a time.",
        "",
        "| arm | traces | without Triton's spans | share | per round | without the engine's |",
        "|---|---|---|---|---|---|",
    ]
    for arm, s in summary.items():
        lines.append(
            f"| {arm} | {s['traces']} | {s['without_triton']} | {s['share_pct']} % | "
            f"{', '.join(map(str, s['per_round']))} | {s['without_engine']} |"
        )
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
