"""`toolkit bench` end to end: a two-point perf_analyzer sweep against the served CPU repository."""

from __future__ import annotations

import csv
import json

import pytest
from click.testing import CliRunner

from toolkit.cli.main import cli

pytestmark = pytest.mark.server

OUTPUT_TOKENS = 6


def test_two_point_sweep_writes_sane_results(served_repo, tmp_path):
    served = served_repo
    out = tmp_path / "bench"
    result = CliRunner().invoke(
        cli,
        [
            "bench",
            "-u",
            served.grpc_url,
            "-c",
            "1,2",
            "-i",
            "16",
            "-o",
            str(OUTPUT_TOKENS),
            "--prompts",
            "2",
            "--requests",
            "2",
            "--repo",
            str(served.repo),
            "--metrics-url",
            served.metrics_url,
            "--out",
            str(out),
            "--json",
        ],
    )
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert [p["point"] for p in data["points"]] == [
        {"mode": "concurrency", "value": 1.0},
        {"mode": "concurrency", "value": 2.0},
    ]
    for point in data["points"]:
        m = point["metrics"]
        assert m["requests"] == 2
        assert (
            m["output_len"]["min"] == m["output_len"]["max"] == OUTPUT_TOKENS
        )  # the length was forced
        assert 0 < m["ttft_ms"]["max"] <= m["latency_ms"]["max"]
        assert m["ttft_ms"]["p50"] <= m["latency_ms"]["p50"]
        assert m["itl_ms"]["mean"] > 0 and m["output_tokens_per_s"] > 0 and m["requests_per_s"] > 0
        assert point["server"]["samples"] >= 2  # Triton's metrics were scraped during the point
    with open(out / "sweep.csv") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 2 and float(rows[0]["output_len_mean"]) == OUTPUT_TOKENS
    for png in ("throughput_vs_latency.png", "ttft_itl_vs_load.png"):
        assert (out / png).read_bytes()[:4] == b"\x89PNG"
    prompts = json.loads((out / "inputs.json").read_text())["data"]
    assert all(entry["min_tokens"] == [OUTPUT_TOKENS] for entry in prompts)


def test_bench_refuses_bad_points_with_a_message(tmp_path):
    result = CliRunner().invoke(cli, ["bench", "-c", "0", "--tokenizer", str(tmp_path / "t.json")])
    assert result.exit_code == 1
    assert "--concurrency" in result.output and "must be positive" in result.output
