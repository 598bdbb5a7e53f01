"""Metric calculations on hand-made perf_analyzer profile exports (no server, no binary)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from toolkit.bench.metrics import Distribution, flat_row, parse_profile_export, point_metrics
from toolkit.bench.scrape import parse_samples, summarize
from toolkit.bench.sweep import (
    Expected,
    LoadPoint,
    PointResult,
    SweepPlan,
    compared,
    parse_points,
    perf_analyzer_args,
)
from toolkit.errors import BenchError

MS = 1_000_000  # ns


def _request(start_ms: float, response_ms: list[float], texts: list[str] | None = None) -> dict:
    texts = texts if texts is not None else ["x"] * len(response_ms)
    return {
        "timestamp": int(start_ms * MS),
        "request_inputs": {"text_input": "hello", "max_tokens": len(response_ms)},
        "response_timestamps": [int(t * MS) for t in response_ms],
        "response_outputs": [{"text_output": t} for t in texts],
    }


def _export(requests: list[dict], mode: str = "concurrency", value: float = 2) -> str:
    return json.dumps(
        {
            "experiments": [
                {
                    "experiment": {"mode": mode, "value": value},
                    "requests": requests,
                    "window_boundaries": [0, 1],
                }
            ],
            "version": "2.51.0",
            "service_kind": "triton",
        }
    )


def test_ttft_itl_latency_follow_genai_perf_definitions():
    # request A: starts at 0, tokens at 10, 12, 14, 16 ms -> TTFT 10, latency 16, ITL (16-10)/3 = 2
    # request B: starts at 5, tokens at 25, 31 ms          -> TTFT 20, latency 26, ITL 6
    [exp] = parse_profile_export(_export([_request(0, [10, 12, 14, 16]), _request(5, [25, 31])]))
    m = point_metrics(exp)
    assert m.requests == 2
    assert m.ttft_ms.mean == pytest.approx(15.0)
    assert (m.ttft_ms.min, m.ttft_ms.max) == pytest.approx((10.0, 20.0))
    assert m.latency_ms.mean == pytest.approx(21.0)
    assert m.itl_ms.mean == pytest.approx(4.0)
    assert m.output_tokens == 6
    # duration: first start (0 ms) to last response (31 ms)
    assert m.duration_s == pytest.approx(0.031)
    assert m.output_tokens_per_s == pytest.approx(6 / 0.031)
    assert m.requests_per_s == pytest.approx(2 / 0.031)
    assert m.output_len.mean == pytest.approx(3.0)


def test_percentiles_match_numpy_linear_interpolation():
    requests = [_request(0, [float(t), float(t) + 1]) for t in range(1, 101)]  # TTFT 1..100 ms
    m = point_metrics(parse_profile_export(_export(requests))[0])
    values = np.arange(1, 101, dtype=float)
    assert m.ttft_ms.p50 == pytest.approx(np.percentile(values, 50))
    assert m.ttft_ms.p90 == pytest.approx(np.percentile(values, 90))
    assert m.ttft_ms.p99 == pytest.approx(np.percentile(values, 99))
    assert m.itl_ms.p99 == pytest.approx(1.0)


def test_empty_final_response_is_not_a_token_and_single_token_request_has_no_itl():
    # tokens at 10 and 20 ms, then an empty final-flag response at 30 ms
    with_empty = _request(0, [10, 20, 30], ["a", "b", ""])
    single = _request(0, [7], ["z"])
    m = point_metrics(parse_profile_export(_export([with_empty, single]))[0])
    assert m.output_tokens == 3
    assert m.latency_ms.max == pytest.approx(20.0)  # the empty response does not extend the latency
    assert m.itl_ms.mean == pytest.approx(10.0)  # only the 2-token request has an ITL


def test_engine_exports_count_tokens_by_sequence_length_outputs():
    request = {
        "timestamp": 0,
        "response_timestamps": [MS, 2 * MS],
        "response_outputs": [
            {"output_ids": 5, "sequence_length": 1},
            {"output_ids": 6, "sequence_length": 1},
        ],
    }
    m = point_metrics(parse_profile_export(_export([request]))[0])
    assert m.output_tokens == 2


def test_request_without_responses_is_dropped_and_all_failed_point_is_an_error():
    failed = {"timestamp": 0, "response_timestamps": [], "response_outputs": []}
    m = point_metrics(parse_profile_export(_export([failed, _request(0, [1, 2])]))[0])
    assert m.requests == 1
    with pytest.raises(BenchError, match="no request completed"):
        point_metrics(parse_profile_export(_export([failed]))[0])


def test_invalid_utf8_in_streamed_pieces_still_parses(tmp_path: Path):
    text = _export([_request(0, [1, 2], ["\u00e9", "b"])]).encode()
    broken = text.replace(b"\\u00e9", b"\xc3")  # a piece that ends inside a character, written raw
    path = tmp_path / "export.json"
    path.write_bytes(broken)
    assert point_metrics(parse_profile_export(path)[0]).output_tokens == 2


def test_malformed_exports_raise_bench_errors():
    with pytest.raises(BenchError, match="not JSON"):
        parse_profile_export("{nope")
    with pytest.raises(BenchError, match="experiments"):
        parse_profile_export("{}")


def test_flat_row_has_stat_columns():
    m = point_metrics(parse_profile_export(_export([_request(0, [1, 2])]))[0])
    row = flat_row(m, {"extra": 1})
    assert (
        row["ttft_ms_p50"] == pytest.approx(1.0)
        and row["extra"] == 1
        and row["mode"] == "concurrency"
    )


def test_distribution_of_nothing_is_nan():
    assert np.isnan(Distribution.of([]).mean)


def test_parse_points_and_errors():
    assert parse_points("1,4", "0.5") == (
        LoadPoint("concurrency", 1),
        LoadPoint("concurrency", 4),
        LoadPoint("request_rate", 0.5),
    )
    for bad in ("0", "1,x", "1.5"):
        with pytest.raises(BenchError, match="--concurrency"):
            parse_points(bad, None)
    with pytest.raises(BenchError, match="no load points"):
        parse_points(None, None)


def test_perf_analyzer_args_stream_over_grpc_with_a_fixed_count(tmp_path: Path):
    plan = SweepPlan(
        grpc_url="h:1",
        model="ensemble",
        points=(),
        input_tokens=8,
        output_tokens=4,
        prompts=2,
        requests=(),
        out_dir=tmp_path,
        tokenizer=tmp_path / "t.json",
    )
    args = perf_analyzer_args(
        plan, LoadPoint("request_rate", 2.5), 10, tmp_path / "in.json", tmp_path / "pe.json"
    )
    assert args[:7] == ["-m", "ensemble", "-i", "grpc", "--streaming", "-u", "h:1"]
    assert (
        args[args.index("--request-rate-range") + 1] == "2.5:2.5"
    )  # start:end: one rate (a lone rate under 1 reads as several)
    assert args[args.index("--request-count") + 1] == "10"
    assert args[args.index("--profile-export-file") + 1] == str(tmp_path / "pe.json")


def test_a_point_is_compared_with_the_plans_estimate_at_its_concurrency(tmp_path):
    """A healthy engine at high concurrency measures what the plan estimates there (100 %); the old
    comparison, batch-1 decode speed x concurrency, read it as a small fraction."""
    from toolkit.bench.metrics import Distribution, PointMetrics
    from toolkit.model.catalog import catalog_entry
    from toolkit.model.facts import facts_from_config
    from toolkit.plan.estimate import estimate_for_plan
    from toolkit.plan.gpus import get_gpu
    from toolkit.plan.memory import compute_plan

    facts = facts_from_config(catalog_entry("llama-3.1-8b-instruct").config)
    plan = compute_plan(facts, get_gpu("h100-sxm"), dtype="fp8", kv_dtype="fp8")
    estimate = estimate_for_plan(facts, plan, 512, 1024, 512)
    ttft, itl = (Distribution(v, v, v, v, v, v) for v in (estimate.ttft_ms, 1.1 * estimate.tpot_ms))
    measured = PointMetrics(
        "concurrency", 512, 4096, 60.0, 4096 * 512, estimate.output_tokens_per_s, 68.0,
        ttft, itl, ttft, ttft,
    )  # fmt: skip
    result = compared(
        PointResult(LoadPoint("concurrency", 512), measured, None, tmp_path / "x.json"),
        Expected.from_estimate(estimate),
    )
    assert result.tokens_per_s_of_expected == pytest.approx(1.0)
    assert result.itl_of_expected == pytest.approx(
        1.1
    ) and result.ttft_of_expected == pytest.approx(1.0)
    batch_one_times_streams = min(512, plan.max_batch_size) * 1e3 / plan.decode_step_ms_lower_bound
    assert estimate.output_tokens_per_s / batch_one_times_streams < 0.3  # what it used to report
    assert result.expected.concurrency == 512
    untouched = PointResult(LoadPoint("request_rate", 2), measured, None, tmp_path / "x.json")
    assert compared(untouched, None) == untouched


METRICS_T0 = """# TYPE nv_inference_request_success counter
nv_inference_request_success{model="ensemble",version="1"} 10
# TYPE nv_inference_queue_duration_us counter
nv_inference_queue_duration_us{model="ensemble",version="1"} 1000
# TYPE nv_inference_pending_request_count gauge
nv_inference_pending_request_count{model="tensorrt_llm",version="1"} 2
# TYPE nv_trt_llm_kv_cache_block_metrics gauge
nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type="fraction",model="tensorrt_llm",version="1"} 0.25
"""


def test_scrape_summary_differences_counters_and_summarizes_gauges():
    t1 = (
        METRICS_T0.replace("} 1000", "} 5000")
        .replace("} 10\n", "} 30\n")
        .replace("} 2\n", "} 6\n")
        .replace("0.25", "0.75")
    )
    summary = summarize([parse_samples(METRICS_T0), parse_samples(t1)])
    assert summary.samples == 2
    # 4000 us over 20 requests
    assert summary.queue_us_per_request == {"ensemble": pytest.approx(200.0)}
    assert summary.pending_max == {"tensorrt_llm": 6.0} and summary.pending_mean == {
        "tensorrt_llm": 4.0
    }
    [(series, stats)] = summary.kv_cache.items()
    assert "kv_cache_block_type=fraction" in series and stats == {"mean": 0.5, "max": 0.75}


def test_the_bench_summary_fits_80_columns_with_large_numbers(monkeypatch, tmp_path: Path):
    """A GPU-sized sweep (five-digit tokens/s, second-long latencies, a bound column) on an 80-column terminal."""
    import io

    from rich.console import Console

    from toolkit.bench.metrics import Distribution, PointMetrics
    from toolkit.bench.sweep import LoadPoint, PointResult, SweepPlan, SweepResult
    from toolkit.cli import cmd_bench

    wide = Distribution(12345.6, 1.0, 99999.0, 12345.6, 23456.7, 98765.4)
    points = tuple(
        PointResult(
            point=LoadPoint("concurrency", c),
            metrics=PointMetrics(
                "concurrency", c, 4096, 60.0, 1_800_000, 27_700.0, 68.27, wide, wide, wide, wide
            ),
            server=None,
            export_file=tmp_path / "x.json",
            tokens_per_s_of_expected=0.81,
        )
        for c in (1, 64, 1024)
    )
    plan = SweepPlan(
        "a-long-host-name.example.com:8001",
        "tensorrt_llm_bls",
        tuple(p.point for p in points),
        1024,
        512,
        16,
        (4096,) * 3,
        tmp_path,
        tmp_path / "tokenizer.json",
    )
    out = io.StringIO()
    monkeypatch.setattr(cmd_bench, "stdout_console", Console(file=out, width=80, color_system=None))
    cmd_bench._print_summary(SweepResult(plan, points, "now", "perf_analyzer"))
    lines = out.getvalue().splitlines()
    assert max(len(line) for line in lines) <= 80, "\n".join(lines)
    assert "27,700" in out.getvalue() and "81%" in out.getvalue()  # nothing cut off
