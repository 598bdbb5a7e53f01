"""What one large prompt does to everyone else: /v1/models latency while the API handles it, against idle.

The API runs as its own process (`python -m toolkit.api`, settings as JSON on stdin: what `toolkit serve
--openai-port` starts), over a synthetic repository of the embedded default model (its real tokenizer and
chat template; --max-input-len tokens). For each case and API variant, in one run: a baseline of
back-to-back GET /v1/models on the idle API, then the same GETs while one large request is in the API;
reported are the medians and maxima, their ratio to the baseline median, the large request's status
and time, and the API process's RSS before, at peak and after (psutil).

Cases: a 10 MB completion prompt; a 10 MB chat message (template rendering); a completion prompt that
fits the character bound of max_input_len tokens, so that it is tokenized (~--tokenized-chars).
Variants: this checkout with its default limits; with --max-body-mib 64 (the 10 MB bodies get past the
size limit, into the prompt checks); and, with --before DIR, the API code in DIR (for example the
committed code: `git archive HEAD toolkit model_repo | tar -x -C DIR`), which gets no limits.

    python perf/api_large_prompt.py --before /tmp/api-head --out perf/results/api_large_prompt
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx
import psutil

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from bench_support import machine, write_results_json  # noqa: E402

from toolkit.serve.net import free_port  # noqa: E402

UNREACHABLE = "127.0.0.1:1"  # every request measured here is refused or counted before any engine
TEN_MB = 10 * 2**20
TEXT = "The quick brown fox jumps over the lazy dog. "


def write_repository(folder: Path, max_input_len: int) -> Path:
    """A synthetic repository of the embedded default: its tokenizer and template, no weights needed."""
    from toolkit.build import plan_local_repository
    from toolkit.build_settings import BuildSettings
    from toolkit.model.sources import resolve_model
    from toolkit.repository.writer import write_repository

    model = resolve_model("smollm2-135m-instruct", progress=False)
    settings = BuildSettings(
        max_input_len=max_input_len,
        max_output_len=256,
        max_seq_len=max_input_len + 256,
        kv_cache_tokens=max_input_len + 256,
    )
    return write_repository(plan_local_repository(model, folder, "synthetic", settings)).path


class ApiProcess:
    """`python -m toolkit.api` from `code` (a folder holding toolkit/ and model_repo/)."""

    def __init__(self, code: Path, repo: Path, limits: dict | None, log: Path):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        payload = {"triton_url": UNREACHABLE, "repo": str(repo), "port": self.port}
        payload["log_level"] = "warning"
        if limits is not None:
            payload["limits"] = limits
        env = {**os.environ, "PYTHONPATH": str(code)}
        self.log = log.open("wb")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "toolkit.api"],
            stdin=subprocess.PIPE,
            stdout=self.log,
            stderr=self.log,
            env=env,
            cwd=code,
        )
        self.process.stdin.write(json.dumps(payload).encode())
        self.process.stdin.close()
        self.ps = psutil.Process(self.process.pid)
        deadline = time.monotonic() + 120
        while not self._answers():
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"the API from {code} did not start: see {log}")
            time.sleep(0.2)

    def _answers(self) -> bool:
        try:
            return httpx.get(f"{self.url}/v1/models", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    def rss_mb(self) -> float:
        return round(self.ps.memory_info().rss / 2**20, 1)

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(30)
        self.log.close()


def models_latencies(client: httpx.Client, url: str, count: int) -> list[float]:
    latencies = []
    for _ in range(count):
        started = time.perf_counter()
        client.get(f"{url}/v1/models").raise_for_status()
        latencies.append(time.perf_counter() - started)
        time.sleep(0.01)
    return latencies


def while_large(api: ApiProcess, client: httpx.Client, path: str, body: bytes) -> dict:
    """GET /v1/models back to back while `body` is POSTed to `path` on a thread."""
    result: dict = {}

    def send():
        started = time.perf_counter()
        response = httpx.post(
            f"{api.url}{path}",
            content=body,
            headers={"Content-Type": "application/json"},
            timeout=300,
        )
        result.update(status=response.status_code, seconds=time.perf_counter() - started)
        result["error"] = (response.json().get("error") or {}).get("code")

    rss_before = api.rss_mb()
    worker = threading.Thread(target=send)
    worker.start()
    latencies, peak = [], rss_before
    while worker.is_alive():
        started = time.perf_counter()
        client.get(f"{api.url}/v1/models").raise_for_status()
        latencies.append(time.perf_counter() - started)
        peak = max(peak, api.rss_mb())
        time.sleep(0.01)
    worker.join()
    time.sleep(0.5)
    return {
        **result,
        "latencies": latencies,
        "rss_mb": {"before": rss_before, "peak": peak, "after": api.rss_mb()},
    }


def cases(model: str, tokenized_chars: int) -> dict[str, tuple[str, bytes]]:
    ten_mb = (TEXT * (TEN_MB // len(TEXT) + 1))[:TEN_MB]
    fits = (TEXT * (tokenized_chars // len(TEXT) + 1))[:tokenized_chars]

    def completion(prompt: str) -> bytes:
        return json.dumps({"model": model, "prompt": prompt, "max_tokens": 4}).encode()

    chat = {"model": model, "messages": [{"role": "user", "content": ten_mb}], "max_tokens": 4}
    return {
        "completion, 10 MB prompt": ("/v1/completions", completion(ten_mb)),
        "chat, 10 MB message": ("/v1/chat/completions", json.dumps(chat).encode()),
        f"completion, {tokenized_chars} characters (tokenized)": (
            "/v1/completions",
            completion(fits),
        ),
    }


def ms(seconds: float) -> float:
    return round(seconds * 1000, 2)


def summarize(baseline: list[float], runs: list[dict]) -> dict:
    loaded = [x for run in runs for x in run["latencies"]]
    base = statistics.median(baseline)
    return {
        "baseline_median_ms": ms(base),
        "baseline_max_ms": ms(max(baseline)),
        "loaded_median_ms": ms(statistics.median(loaded)),
        "loaded_max_ms": ms(max(loaded)),
        "median_ratio": round(statistics.median(loaded) / base, 2),
        "max_ratio": round(max(loaded) / base, 1),
        "samples": len(loaded),
        "large_request": [
            {"status": r["status"], "code": r["error"], "seconds": round(r["seconds"], 2)}
            for r in runs
        ],
        "rss_mb": [r["rss_mb"] for r in runs],
    }


def measure_variant(code: Path, limits: dict | None, repo: Path, args, log: Path) -> dict:
    api = ApiProcess(code, repo, limits, log)
    results = {}
    try:
        with httpx.Client(timeout=300) as client:
            model = client.get(f"{api.url}/v1/models").json()["data"][0]["id"]
            for name, (path, body) in cases(model, args.tokenized_chars).items():
                baseline = models_latencies(client, api.url, args.baseline)
                runs = [while_large(api, client, path, body) for _ in range(args.repeats)]
                results[name] = summarize(baseline, runs)
                print(f"  {name}: {results[name]}", file=sys.stderr)
    finally:
        api.stop()
    return results


def write_results(args, variants: dict, repo_limits: dict) -> None:
    meta = {
        "command": " ".join(shlex.quote(a) for a in sys.argv),
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "repository_limits": repo_limits,
        "baseline_requests": args.baseline,
        "repeats": args.repeats,
        "machine": machine(),
    }
    out = write_results_json(args.out, meta, variants)
    rows = [
        "| API | case | large request | /v1/models idle p50 | while large: p50 | max | p50 ratio "
        "| max ratio | API RSS before / peak / after |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for variant, results in variants.items():
        for case, r in results.items():
            large = ", ".join(
                f"{x['status']} {x['code'] or ''} in {x['seconds']} s".replace("  ", " ")
                for x in r["large_request"]
            )
            rss = "; ".join(f"{m['before']} / {m['peak']} / {m['after']} MB" for m in r["rss_mb"])
            rows.append(
                f"| {variant} | {case} | {large} | {r['baseline_median_ms']} ms | "
                f"{r['loaded_median_ms']} ms | {r['loaded_max_ms']} ms | {r['median_ratio']}x | "
                f"{r['max_ratio']}x | {rss} |"
            )
    out.with_suffix(".md").write_text(
        "# /v1/models while the API handles one large prompt\n\n"
        f"Command: `{meta['command']}`\n\n"
        f"Date {meta['date']}; {meta['machine']['cpus']} CPUs (shared); repository limits "
        f"{json.dumps(repo_limits)}; {args.baseline} idle requests for the baseline, {args.repeats} large "
        "requests per case.\n\n" + "\n".join(rows) + "\n"
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--before", type=Path, default=None, help="a folder with other API code to compare"
    )
    parser.add_argument(
        "--max-input-len",
        type=int,
        default=7936,
        help="+256 output tokens: the model's 8192 positions",
    )
    parser.add_argument("--tokenized-chars", type=int, default=600_000)
    parser.add_argument("--baseline", type=int, default=50)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--out", default="perf/results/api_large_prompt")
    args = parser.parse_args()
    variants = {}
    with tempfile.TemporaryDirectory() as scratch:
        repo = write_repository(Path(scratch) / "repo", args.max_input_len)
        runs = [("this checkout, default limits", ROOT, {})]
        runs.append(("this checkout, --max-body-mib 64", ROOT, {"max_body_bytes": 64 * 2**20}))
        if args.before is not None:
            runs.insert(0, (f"before ({args.before.name})", args.before.resolve(), None))
        for label, code, limits in runs:
            print(f"{label}:", file=sys.stderr)
            log = Path(scratch) / f"api-{len(variants)}.log"
            variants[label] = measure_variant(code, limits, repo, args, log)
    limits = {"max_input_len": args.max_input_len, "max_seq_len": args.max_input_len + 256}
    write_results(args, variants, limits)


if __name__ == "__main__":
    main()
