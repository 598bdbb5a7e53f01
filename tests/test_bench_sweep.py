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
        # the length was forced
        assert m["output_len"]["min"] == m["output_len"]["max"] == OUTPUT_TOKENS
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


# --- where perf_analyzer's libcudart comes from (issue: the pinned container has no wheel) ----------
@pytest.fixture
def no_cudart_wheel(monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "nvidia" else real(name, *a)
    )


def _loader(monkeypatch, finds: bool):
    import ctypes

    from toolkit.bench import perf_analyzer as pa

    real = ctypes.CDLL

    def cdll(name, *args, **kwargs):
        if name == pa.CUDART and not finds:
            raise OSError(f"{name}: cannot open shared object file")
        if name == pa.CUDART:
            return object()
        return real(name, *args, **kwargs)

    monkeypatch.setattr(pa.ctypes, "CDLL", cdll)


def test_cudart_from_the_containers_own_cuda_when_no_wheel(no_cudart_wheel, monkeypatch, tmp_path):
    from toolkit.bench import perf_analyzer as pa

    cuda = tmp_path / "cuda" / "lib64"
    cuda.mkdir(parents=True)
    (cuda / pa.CUDART).write_bytes(b"")
    monkeypatch.setattr(pa, "CUDA_LIBRARY_DIRS", (str(tmp_path / "absent"), str(cuda)))
    _loader(monkeypatch, finds=False)
    assert pa._cudart_dir() == cuda
    _loader(monkeypatch, finds=True)  # on the loader's path already: nothing to add
    assert pa._cudart_dir() is None


def test_no_cudart_anywhere_is_a_clear_error_naming_what_was_tried(no_cudart_wheel, monkeypatch):
    from toolkit.bench import perf_analyzer as pa
    from toolkit.errors import BenchError

    monkeypatch.setattr(pa, "CUDA_LIBRARY_DIRS", ("/nonexistent/cuda/lib64",))
    _loader(monkeypatch, finds=False)
    with pytest.raises(BenchError) as error:
        pa._cudart_dir()
    assert (
        "nvidia-cuda-runtime-cu12" in error.value.message
        and "/nonexistent/cuda/lib64" in error.value.message
    )
    assert "LD_LIBRARY_PATH" in error.value.hint
