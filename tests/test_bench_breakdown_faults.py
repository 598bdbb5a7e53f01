"""`toolkit bench --breakdown` when things go wrong: what it refuses up front, an API that stops answering,
a point that fails after others finished, and files that are not spans. No server: the API is a socket
that accepts and never answers, or the point runner is replaced."""

from __future__ import annotations

import json
import socket
import threading
import time
from types import SimpleNamespace

import pytest

from toolkit.bench import sweep
from toolkit.bench.sweep import LoadPoint, SweepStopped, plan_sweep
from toolkit.bench.traced_load import run_traced_load
from toolkit.errors import BenchError
from toolkit.trace.records import read_jsonl

from toy_tokenizers import word_level

POINTS = (LoadPoint("concurrency", 1), LoadPoint("concurrency", 2))


@pytest.fixture
def tokenizer(tmp_path):
    path = tmp_path / "tokenizer.json"
    path.write_text(word_level(["hello", "world"]).to_str())  # a plan needs one; no prompt is made
    return path


def _traced_plan(tmp_path, tokenizer, **extra):
    return plan_sweep(
        "127.0.0.1:1",
        POINTS,
        input_tokens=8,
        output_tokens=4,
        out_dir=tmp_path / "out",
        tokenizer=tokenizer,
        api_url="http://127.0.0.1:9",
        traces=tmp_path / "spans.jsonl",
        **extra,
    )


def test_breakdown_with_a_lora_mix_is_refused_not_sent_to_the_base_model(tmp_path, tokenizer):
    """It used to accept the mix, multiply the request count by it and send every request to the base."""
    with pytest.raises(BenchError, match="cannot spread them over --lora-mix"):
        _traced_plan(tmp_path, tokenizer, lora_mix=("a", "base"))


def test_an_api_that_stops_answering_fails_the_point_at_its_timeout():
    """It used to wait for ever, whatever --timeout said."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    held: list[socket.socket] = []
    threading.Thread(target=lambda: held.append(listener.accept()[0]), daemon=True).start()
    started = time.monotonic()
    try:
        with pytest.raises(BenchError, match="did not finish within 1 s"):
            port = listener.getsockname()[1]
            run_traced_load(f"http://127.0.0.1:{port}", "m", ("hi",), 4, 1, 1, timeout_s=1)
    finally:
        for conn in held:
            conn.close()
        listener.close()
    assert time.monotonic() - started < 30


def test_a_failed_point_keeps_the_points_that_finished(tmp_path, tokenizer, monkeypatch):
    """The perf_analyzer sweep kept them already; the traced one threw them away."""
    plan = _traced_plan(tmp_path, tokenizer)
    finished = object()
    calls = []

    def point(*args, **kwargs):
        calls.append(args)
        if len(calls) == 2:
            raise BenchError("the API went away", hint="restart it")
        return finished

    monkeypatch.setattr(sweep, "run_traced_point", point)
    monkeypatch.setattr("toolkit.bench.traced_load.served_model", lambda url: "m")
    monkeypatch.setattr(sweep, "_plan_prompts", lambda plan: SimpleNamespace(prompts=("hi",)))
    with pytest.raises(SweepStopped) as stopped:
        sweep.run_sweep(plan, spans=[])
    assert stopped.value.partial.points == (finished,)
    assert isinstance(stopped.value.cause, BenchError)


def test_trace_files_with_other_json_lines_are_read_not_a_traceback(tmp_path):
    """bench --breakdown's own points/<label>.client.json is a JSON list: `trace show` on it crashed."""
    path = tmp_path / "mixed.jsonl"
    span = {
        "trace_id": "a" * 32,
        "span_id": "b" * 16,
        "parent_id": "",
        "name": "api.request",
        "service": "toolkit-api",
        "start_ns": 1,
        "end_ns": 2,
        "attributes": {},
        "events": [],
    }
    path.write_text("\n".join([json.dumps([1, 2]), json.dumps("text"), json.dumps(span)]) + "\n")
    records = read_jsonl(path)
    assert [r.name for r in records] == ["api.request"]
