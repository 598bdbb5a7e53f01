"""`toolkit bench` as a new user meets it: docs/bench.md's commands run as written, against a server
that `toolkit serve` started (in the background or the foreground), and a sweep that stops midway
(a point fails, Ctrl-C) keeps and reports the points that finished.

The repository is a synthetic one (tokens without a model) over a word-level tokenizer made here, so
perf_analyzer's points take seconds. The docs' fixed ports (8000-8002) are replaced by free ones.
"""

from __future__ import annotations

import json
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from toolkit.bench.sweep import port_answers
from toolkit.model.sources import ResolvedModel
from toolkit.serve.net import free_port
from toolkit.subprocs import children_of, process_alive, signal_session

from repos import config_only_checkpoint, python_repository

pytestmark = pytest.mark.server

DOCS = Path(__file__).parents[1] / "docs" / "bench.md"
WORDS = [f"{a}{b}{c}" for a in "bcdfg" for b in "aeiou" for c in "lmnrst"]  # 150 three-letter words


def _word_tokenizer() -> str:
    """Whole words with their leading space, byte-level (" bal" is the token "Ġbal"), as GPT-2's are."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    vocab = {"[UNK]": 0, "<s>": 1, "</s>": 2, **{f"Ġ{w}": i + 3 for i, w in enumerate(WORDS)}}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_special_tokens(["<s>", "</s>"])
    return tokenizer.to_str()


def _synthetic_repo(folder: Path, step_time_ms: float = 0.0) -> Path:
    checkpoint = config_only_checkpoint(
        folder / "checkpoint",
        {
            "tokenizer.json": _word_tokenizer(),
            "tokenizer_config.json": json.dumps({"eos_token": "</s>"}),
        },
        vocab_size=len(WORDS) + 3,
        eos_token_id=2,
        max_position_embeddings=4096,
    )
    model = ResolvedModel(checkpoint, "hf:test/Bench-Words", None)
    return python_repository(
        model,
        folder / "repo",
        "synthetic",
        step_time_ms=step_time_ms,
        max_input_len=256,
        max_output_len=128,
        max_seq_len=512,
        kv_cache_tokens=8192,
        max_batch_size=16,
    )


def _toolkit(*args: str, cwd: Path, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "toolkit.cli.main", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def _docs_blocks() -> list[list[str]]:
    """The `toolkit ...` lines of each of docs/bench.md's code blocks, comments cut, optional [...] parts
    kept; blocks without one left out."""
    blocks: list[list[str]] = []
    inside = False
    for line in DOCS.read_text().splitlines():
        if line.startswith("```"):
            inside = not inside
            blocks.append([])
            continue
        if inside and line.strip().startswith("toolkit "):
            command = line.split("  #", 1)[0].strip()
            blocks[-1].append(re.sub(r"\[([^\]]*)\]", r"\1", command))
    return [block for block in blocks if block]


def _docs_commands() -> list[str]:
    """The first example: a background serve and the sweep."""
    return _docs_blocks()[0]


def _running_perf_analyzer(pid: int) -> bool:
    for child in children_of(pid):
        try:
            if Path(f"/proc/{child}/comm").read_text().strip() == "perf_analyzer":
                return True
        except OSError:
            continue
    return False


def _stop_background(home: Path) -> None:
    for record in (home / "servers").glob("*.json"):
        data = json.loads(record.read_text())
        for pid in (data.get("pid"), data.get("openai_pid")):
            if pid and process_alive(pid):
                signal_session(pid, signal.SIGTERM)


def test_the_docs_bench_commands_run_as_written(tmp_path, toolkit_home):
    """docs/bench.md's example: its serve line (a background server) and its bench line (every point
    mode, the optional parts included)."""
    _synthetic_repo(tmp_path)
    commands = _docs_commands()
    assert [c.split()[1] for c in commands] == ["serve", "bench"], commands
    ports = {flag: free_port() for flag in ("--http-port", "--grpc-port", "--metrics-port")}
    try:
        for command in commands:
            argv = shlex.split(
                command.replace("127.0.0.1:8001", f"127.0.0.1:{ports['--grpc-port']}")
            )
            if argv[1] == "serve":
                argv += [str(part) for pair in ports.items() for part in pair]
            done = _toolkit(*argv[1:], cwd=tmp_path)
            assert done.returncode == 0, (command, done.stdout, done.stderr)
        sweep = json.loads((tmp_path / "bench-results" / "sweep.json").read_text())
        loads = [(p["point"]["mode"], p["point"]["value"]) for p in sweep["points"]]
        assert loads == [("concurrency", c) for c in (1, 2, 4, 8)] + [
            ("request_rate", 2),
            ("request_rate", 4),
        ], loads
        assert sweep["plan"]["metrics_url"].endswith(f":{ports['--metrics-port']}/metrics")
    finally:
        _stop_background(toolkit_home)


def test_the_docs_breakdown_commands_run_as_written(tmp_path, toolkit_home):
    """docs/bench.md's --breakdown example as written: a receiver in the background, a traced serve with
    the API, and bench --breakdown with the API and metrics it recorded; a table per point and the plot."""
    blocks = _docs_blocks()
    assert len(blocks) == 2, blocks
    _synthetic_repo(tmp_path, step_time_ms=2)
    ports = {
        "9000": str(free_port()),
        "4318": str(free_port()),
        "8001": str(free_port()),
    }
    extra = ["--http-port", str(free_port()), "--grpc-port", ports["8001"]]
    extra += ["--metrics-port", str(free_port())]
    collector = None
    try:
        for command in blocks[1]:
            for docs_port, port in ports.items():
                command = command.replace(f":{docs_port}", f":{port}").replace(
                    f" {docs_port} ", f" {port} "
                )
            argv = shlex.split(command)
            if argv[-1] == "&":  # the receiver runs in the background until the test ends
                argv = argv[:-1] + ["-p", ports["4318"]]
                collector = subprocess.Popen(
                    [sys.executable, "-m", "toolkit.cli.main", *argv[1:]],
                    cwd=tmp_path,
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.PIPE,
                    text=True,
                )
                _wait_for_port(int(ports["4318"]), collector)
                continue
            if argv[1] == "serve":
                argv += extra
            elif argv[1] == "bench":  # the docs' default gRPC port (8001), here a free one
                argv += ["-u", f"127.0.0.1:{ports['8001']}"]
            done = _toolkit(*argv[1:], cwd=tmp_path)
            assert done.returncode == 0, (command, done.stdout, done.stderr)
        sweep = json.loads((tmp_path / "bench-results" / "sweep.json").read_text())
        assert [p["point"]["value"] for p in sweep["points"]] == [1, 16]
        assert all(p.get("breakdown") for p in sweep["points"]), sweep["points"]
        assert (tmp_path / "bench-results" / "breakdown.png").stat().st_size > 0
    finally:
        _stop_background(toolkit_home)
        if collector is not None:
            collector.terminate()
            collector.wait(timeout=30)


def _wait_for_port(port: int, process: subprocess.Popen) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        assert process.poll() is None, process.stderr.read() if process.stderr else ""
        if port_answers(f"127.0.0.1:{port}"):
            return
        time.sleep(0.2)
    raise AssertionError(f"nothing listens on {port}")


def _serve_foreground(repo: Path, tmp_path: Path, ports: dict) -> subprocess.Popen:
    argv = [sys.executable, "-m", "toolkit.cli.main", "serve", "--repo", str(repo)]
    for flag, port in ports.items():
        argv += [flag, str(port)]
    serve = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        assert serve.poll() is None, serve.stderr.read()
        try:
            if (
                httpx.get(
                    f"http://127.0.0.1:{ports['--http-port']}/v2/health/ready", timeout=2
                ).status_code
                == 200
            ):
                return serve
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise AssertionError("serve was not ready")


@pytest.fixture
def foreground(tmp_path):
    started = []

    def start(repo: Path) -> tuple[subprocess.Popen, dict]:
        ports = {flag: free_port() for flag in ("--http-port", "--grpc-port", "--metrics-port")}
        started.append(_serve_foreground(repo, tmp_path, ports))
        return started[-1], ports

    yield start
    for serve in started:
        if serve.poll() is None:
            serve.send_signal(signal.SIGINT)
            serve.wait(60)


def test_bench_finds_what_a_foreground_serve_serves_at_half_a_request_a_second(
    tmp_path, foreground
):
    """The README's quickstart serves in the foreground: bench found no tokenizer there, and took the
    metrics from port 8002 whatever the server's were. And a rate under 1/s always failed in perf_analyzer."""
    repo = _synthetic_repo(tmp_path)
    _serve, ports = foreground(repo)
    url = f"127.0.0.1:{ports['--grpc-port']}"
    done = _toolkit(
        "bench",
        "-u",
        url,
        "--request-rate",
        "0.5",
        "-i",
        "8",
        "-o",
        "4",
        "--requests",
        "4",
        "--json",
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr
    plan = json.loads(done.stdout)["plan"]
    assert plan["metrics_url"] == f"http://127.0.0.1:{ports['--metrics-port']}/metrics"
    assert Path(plan["tokenizer"]).parent.parent.parent.parent == repo


@pytest.mark.parametrize("stop", ["server-killed", "ctrl-c"])
def test_a_sweep_stopped_midway_keeps_and_shows_its_finished_points(tmp_path, foreground, stop):
    repo = _synthetic_repo(tmp_path, step_time_ms=20.0)
    serve, ports = foreground(repo)
    url = f"127.0.0.1:{ports['--grpc-port']}"
    out = tmp_path / "out"
    argv = [sys.executable, "-m", "toolkit.cli.main", "bench", "-u", url, "-c", "1,2,4", "-i", "8"]
    argv += ["-o", "8", "--requests", "24", "--repo", str(repo), "--out", str(out)]
    bench = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    points = out / "points"
    try:
        deadline = time.monotonic() + 120
        while not (
            (points / "concurrency1.profile_export.json").is_file()
            and (points / "concurrency2.perf_analyzer.log").is_file()
            and _running_perf_analyzer(bench.pid)  # started: not mid-fork
        ):
            assert bench.poll() is None and time.monotonic() < deadline, bench.communicate()
            time.sleep(0.2)
        if stop == "ctrl-c":
            bench.send_signal(signal.SIGINT)
        else:
            serve.send_signal(signal.SIGKILL)  # the server dies under the second point
        stdout, stderr = bench.communicate(timeout=120)
    finally:
        if bench.poll() is None:
            bench.kill()
    assert bench.returncode == 1, stderr
    sweep = json.loads((out / "sweep.json").read_text())
    assert [p["point"]["value"] for p in sweep["points"]] == [1.0], sweep["points"]
    assert "c1" in stdout  # the finished point's row
    assert "the finished points are kept" in stderr, stderr
    if stop == "ctrl-c":
        assert "Aborted!" in stderr, stderr
        return
    error = stderr[stderr.index("Error:") :]
    assert "Usage:" not in error and "SYNOPSIS" not in error, error  # the error, not the help
