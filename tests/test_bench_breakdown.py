"""`toolkit bench --breakdown`: where TTFT and inter-token time went, by layer, from the run's traces.

The unit tests build traces by hand and check that the parts add up to what the client saw. The
served tests run the synthetic engine (a known step time) on tritonserver with tracing, the API in
this process and a local receiver: the decode step must come out as the inter-token time, and an
API that spends 60 ms on each prompt must be named as where TTFT went.
"""

from __future__ import annotations

import json
import time

import pytest
from click.testing import CliRunner

from toolkit.api import ApiSettings, run_api_in_background
from toolkit.bench.breakdown import RequestBreakdown, point_breakdown, request_breakdown
from toolkit.bench.sweep import LoadPoint, plan_sweep, run_sweep
from toolkit.cli.main import cli
from toolkit.client.sse import TimedStream
from toolkit.errors import BenchError
from toolkit.serve.net import free_port
from toolkit.trace.config import TracePlan
from toolkit.trace.receiver import SpanReceiver
from toolkit.trace.records import SpanRecord

from repos import config_only_checkpoint, launch_on_free_ports, write_test_repository
from toy_tokenizers import CHATML_EOS, byte_level_bpe, chatml_tokenizer_files

MS = 1_000_000  # ns
STEP_MS = 20.0


# --- one request, by hand -------------------------------------------------------------------------
def _span(name, start_ms, end_ms, component, **attributes) -> SpanRecord:
    return SpanRecord(
        "t" * 32, name[:16].ljust(16, "0"), "", name, int(start_ms * MS), int(end_ms * MS),
        component=component, attributes=attributes,
    )  # fmt: skip


def _trace(engine: bool = True) -> list[SpanRecord]:
    """A request sent at 0 ms: the API has it at 1, calls Triton at 4, the engine has it at 5, runs it
    at 9 (queue 4), first token at 12 (prefill 3), then a token every 10 ms to 52 (5 tokens); the API
    gets each 1 ms after the engine, writes the first at 13.5 (1 ms of detokenizing per response)."""
    spans = [
        _span("POST /v1/completions", 1, 56, "api"),
        _span("api.generate", 4, 53, "api"),
        _span("api.first_chunk", 13, 13.5, "api"),
        _span(
            "api.stream", 13.5, 54, "api", **{"toolkit.detokenize_us": 5 * 100, "toolkit.tokens": 5}
        ),
    ]
    if engine:
        spans += [
            _span("engine.request", 5, 52.5, "engine"),
            _span("engine.queue", 5, 9, "engine"),
            _span("engine.prefill", 9, 12, "engine"),
            _span("engine.decode", 12, 52, "engine"),
        ]
    return spans


CLIENT = TimedStream(0, (14 * MS, 24 * MS, 34 * MS, 44 * MS, 55 * MS), 5)


def test_a_requests_parts_add_up_to_what_its_client_saw():
    parts = request_breakdown(CLIENT, "t" * 32, _trace())
    assert parts.ttft_ms == pytest.approx(14.0)
    assert sum(parts.ttft.values()) == pytest.approx(parts.ttft_ms)
    assert parts.ttft["engine_queue"] == pytest.approx(4.0)
    assert parts.ttft["prefill"] == pytest.approx(3.0)
    assert parts.ttft["triton"] == pytest.approx(1.0 + 1.0)  # in: 4 -> 5; back: 12 -> 13
    assert parts.ttft["detokenize"] == pytest.approx(0.1)
    assert parts.ttft["api"] == pytest.approx(3.0 + 0.4)  # 1 -> 4, and the rest of the first chunk
    assert parts.ttft["network"] == pytest.approx(1.0 + 0.5)
    assert parts.itl_ms == pytest.approx((55 - 14) / 4)
    assert sum(parts.itl.values()) == pytest.approx(parts.itl_ms)
    assert parts.itl["decode"] == pytest.approx(10.0)  # the engine's step
    assert parts.engine_spans


def test_without_engine_spans_triton_and_the_engine_are_one_layer():
    parts = request_breakdown(CLIENT, "t" * 32, _trace(engine=False))
    assert set(parts.ttft) == {"network", "api", "detokenize", "engine"}
    assert parts.ttft["engine"] == pytest.approx(13 - 4)
    assert sum(parts.ttft.values()) == pytest.approx(parts.ttft_ms)
    assert sum(parts.itl.values()) == pytest.approx(parts.itl_ms)
    point = point_breakdown([parts], 0)
    assert point.notes and "no engine spans" in point.notes[0]


def test_a_trace_without_the_apis_spans_is_left_out():
    assert (
        request_breakdown(CLIENT, "t" * 32, [s for s in _trace() if s.component == "engine"])
        is None
    )
    point = point_breakdown([], 3)
    assert (point.requests, point.untraced, point.ttft) == (0, 3, ())


def test_the_percentiles_average_the_requests_around_each_rank():
    def request(ttft_api: float, itl_decode: float) -> RequestBreakdown:
        ttft = {"api": ttft_api, "engine_queue": 2.0}
        return RequestBreakdown(
            "t", sum(ttft.values()), ttft, itl_decode + 1, {"decode": itl_decode, "api": 1.0}, True
        )

    point = point_breakdown([request(1.0, 10.0)] * 99 + [request(50.0, 10.0)], 0)
    p50, _, p99 = point.ttft
    assert p50.total_ms == pytest.approx(3.0) and p50.dominant == "engine_queue"
    assert p99.total_ms > p50.total_ms and p99.dominant == "api"  # the slow one is in p99's window
    assert p99.requests < 10
    assert point.dominant_ttft == "engine_queue" and point.dominant_itl == "decode"


def test_breakdown_needs_the_api_and_the_spans_and_concurrency_points(tmp_path):
    with pytest.raises(BenchError, match="--traces"):
        plan_sweep("h:1", (LoadPoint("concurrency", 1),), input_tokens=4, output_tokens=4,
                   out_dir=tmp_path, tokenizer=tmp_path / "t.json", api_url="http://h:2")  # fmt: skip
    with pytest.raises(BenchError, match="concurrency points only"):
        plan_sweep("h:1", (LoadPoint("request_rate", 1),), input_tokens=4, output_tokens=4,
                   out_dir=tmp_path, tokenizer=tmp_path / "t.json", api_url="http://h:2",
                   traces=tmp_path / "s.jsonl")  # fmt: skip


def test_a_model_given_with_breakdown_is_refused_not_ignored(tmp_path):
    """--breakdown sends the load through the OpenAI API, to the model it serves: `-m tensorrt_llm` was
    taken and silently not used."""
    args = ["bench", "-u", "h:1", "-c", "1", "--breakdown", "--api-url", "http://h:2", "--traces"]
    result = CliRunner().invoke(cli, [*args, str(tmp_path / "s.jsonl"), "-m", "tensorrt_llm"])
    assert result.exit_code == 1, result.output
    assert "--model tensorrt_llm" in result.output and "drop --model" in result.output


def test_a_layer_has_one_colour_in_both_panels_of_the_plot(tmp_path, monkeypatch):
    """Each panel took matplotlib's colours in turn, so Triton was the 4th colour in the TTFT panel
    and the 3rd in the ITL one, and a layer with no time shifted every colour after it."""
    from types import SimpleNamespace

    from toolkit.bench import report

    def row(percentile, **layers):
        return SimpleNamespace(percentile=percentile, layers=layers)

    breakdown = SimpleNamespace(
        ttft=[row(50, network=1.0, api=2.0, triton=3.0, prefill=4.0)],
        itl=[row(50, api=0.5, triton=0.2, decode=9.0)],
    )
    result = SimpleNamespace(
        points=[SimpleNamespace(point=SimpleNamespace(value=4), breakdown=breakdown)],
        plan=SimpleNamespace(target="cpu", input_tokens=8, output_tokens=8),
    )
    figures = []
    monkeypatch.setattr(report, "_save", lambda fig, path, plt: figures.append(fig))
    report.plot_breakdown(result, tmp_path / "breakdown.png")
    colours: dict[str, set] = {}
    for ax in figures[0].axes:
        for bars in ax.containers:
            colours.setdefault(bars.get_label(), set()).add(bars.patches[0].get_facecolor())
    assert {"api", "triton"} <= set(colours)
    assert all(len(c) == 1 for c in colours.values()), colours  # one colour per layer, both panels
    assert len({next(iter(c)) for c in colours.values()}) == len(colours)  # each its own


def test_a_timeout_that_is_no_time_is_refused_when_parsed():
    """--timeout -1 ran the point and then blamed the API: 'did not finish within -1 s'."""
    for value in ("-1", "0"):
        result = CliRunner().invoke(cli, ["bench", "-u", "h:1", "--timeout", value])
        assert result.exit_code == 1 and "--timeout" in result.output, result.output


# --- served: the synthetic engine at a known step time --------------------------------------------
WORDS = [
    "river", "table", "garden", "window", "yellow", "planet", "silver", "orange", "forest", "bridge",
    "candle", "mirror", "pocket", "ladder", "rabbit", "castle", "button", "carpet", "dragon", "engine",
    "finger", "guitar", "hammer", "island", "jacket", "kettle", "lemon", "marble", "needle", "object",
    "pencil", "quartz", "rocket", "saddle", "tunnel", "umbrella", "valley", "walnut", "yogurt", "zebra",
    "anchor", "basket", "cotton", "desert", "feather", "ginger", "harbor", "insect", "jungle", "kitten",
    "lantern", "meadow", "napkin", "oyster", "parrot", "quiver", "ribbon", "shadow", "ticket", "velvet",
]  # fmt: skip


@pytest.fixture(scope="module")
def traced_synthetic(tmp_path_factory):
    """The synthetic engine (20 ms steps) on tritonserver with tracing, a receiver, a traced API."""
    root = tmp_path_factory.mktemp("breakdown")
    tokenizer = byte_level_bpe([" ".join(WORDS)] * 4, vocab_size=700)
    checkpoint = config_only_checkpoint(
        root / "checkpoint",
        chatml_tokenizer_files(tokenizer),
        vocab_size=tokenizer.get_vocab_size(),
        eos_token_id=tokenizer.token_to_id(CHATML_EOS),
    )
    repo = write_test_repository(
        checkpoint, root / "repo", synthetic=True, step_time_ms=STEP_MS, max_batch_size=8,
        max_input_len=64, max_output_len=32, max_seq_len=128, kv_cache_tokens=2048,
    )  # fmt: skip
    with (
        pytest.MonkeyPatch.context() as env,
        SpanReceiver(root / "spans.jsonl", port=0) as receiver,
    ):
        env.setenv("OTEL_BSP_SCHEDULE_DELAY", "200")
        plan = TracePlan(f"{receiver.url}/v1/traces", 1.0, "toolkit-test")
        server = launch_on_free_ports(
            repo, root / "server.log", 120, trace=plan, traced_by_api=True
        )
        api = run_api_in_background(
            ApiSettings(server.grpc_url, repo, trace=plan), port=free_port()
        )
        try:
            yield server, api, receiver, repo, root
        finally:
            api.stop()
            server.stop()


def _sweep(traced_synthetic, name: str, concurrency: int = 2, requests: int = 8):
    server, api, receiver, repo, root = traced_synthetic
    plan = plan_sweep(
        server.grpc_url, (LoadPoint("concurrency", concurrency),), input_tokens=8,
        output_tokens=12, out_dir=root / name, prompts=4, requests=requests, repo=repo,
        metrics_url=server.metrics_url, api_url=api.url, traces=root / "unused.jsonl",
    )  # fmt: skip
    result = run_sweep(plan, spans=lambda: list(receiver.records))
    (point,) = result.points
    return point


@pytest.mark.server
def test_the_decode_step_is_the_inter_token_time(traced_synthetic):
    point = _sweep(traced_synthetic, "decode")
    b = point.breakdown
    assert b.requests == 8 and b.untraced == 0
    p50 = b.itl[0]
    assert p50.layers["decode"] == pytest.approx(STEP_MS, rel=0.10)
    assert b.dominant_itl == "decode"
    # what the client measured agrees: the step is the inter-token time
    assert point.metrics.itl_ms.p50 == pytest.approx(STEP_MS, rel=0.15)
    # the engine's own metrics say the same step
    assert b.engine_step_ms == pytest.approx(STEP_MS, rel=0.15)


@pytest.mark.server
def test_an_api_that_is_slow_to_admit_is_named_as_where_ttft_went(traced_synthetic, monkeypatch):
    from toolkit.api.prompt import PromptCodec

    encode = PromptCodec.encode

    def slow_encode(self, text):
        time.sleep(0.060)  # 60 ms of the API's own work per prompt, on its event loop
        return encode(self, text)

    monkeypatch.setattr(PromptCodec, "encode", slow_encode)
    point = _sweep(traced_synthetic, "slow-api", concurrency=1, requests=6)
    b = point.breakdown
    assert b.dominant_ttft == "api"
    assert b.ttft[0].layers["api"] >= 55
    assert b.dominant_itl == "decode"  # the stream itself is as fast as before


@pytest.mark.server
def test_the_command_reads_the_collectors_file_and_writes_the_plot(traced_synthetic):
    server, api, _, repo, root = traced_synthetic
    out = root / "cli"
    result = CliRunner().invoke(
        cli,
        ["bench", "-u", server.grpc_url, "-c", "2", "-i", "8", "-o", "8", "--prompts", "4",
         "--requests", "4", "--repo", str(repo), "--metrics-url", server.metrics_url,
         "--breakdown", "--api-url", api.url, "--traces", str(root / "spans.jsonl"),
         "--out", str(out)],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "where the time went (4 traced requests)" in result.output
    assert "dominant" in result.output
    recorded = json.loads((out / "sweep.json").read_text())
    assert recorded["points"][0]["breakdown"]["dominant_itl"] == "decode"
    assert (out / "breakdown.png").stat().st_size > 10_000


@pytest.mark.server
def test_a_point_none_of_whose_requests_was_traced_fails_naming_the_spans_file(
    traced_synthetic, monkeypatch
):
    """It printed an empty table ("0 traced requests") and exited 0: what a user sees who forgot to
    start the receiver, or pointed --traces at another file."""
    from toolkit.bench import traced_load

    monkeypatch.setattr(traced_load, "SPANS_WAIT_S", 1.0)
    server, api, _, repo, root = traced_synthetic
    plan = plan_sweep(
        server.grpc_url, (LoadPoint("concurrency", 1),), input_tokens=8, output_tokens=4,
        out_dir=root / "untraced", prompts=2, requests=2, repo=repo, metrics_url=server.metrics_url,
        api_url=api.url, traces=root / "elsewhere.jsonl",
    )  # fmt: skip
    with pytest.raises(BenchError, match="none of its 2 requests was traced") as refused:
        run_sweep(plan, spans=lambda: [])
    assert "elsewhere.jsonl" in str(refused.value) and "toolkit trace collect" in refused.value.hint
    # and a spans file that does not exist is refused before any request is sent
    with pytest.raises(BenchError, match="elsewhere.jsonl does not exist"):
        run_sweep(plan)


def test_the_engine_step_comes_from_its_iteration_counter():
    from toolkit.bench.scrape import parse_samples, summarize

    def snapshot(iterations: int, at: float) -> dict:
        labels = 'general_type="iteration_counter",model="tensorrt_llm",version="1"'
        text = (
            "# TYPE nv_trt_llm_general_metrics gauge\n"
            f"nv_trt_llm_general_metrics{{{labels}}} {iterations}\n"
        )
        return {**parse_samples(text), "_time": at}

    assert summarize([snapshot(10, 5.0), snapshot(60, 6.0)]).engine_step_ms == pytest.approx(20.0)
    assert summarize([snapshot(10, 5.0), snapshot(10, 6.0)]).engine_step_ms is None
