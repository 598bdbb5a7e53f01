"""Traces across the stack: one per request, from the OpenAI API through tritonserver to the engine.

The unit tests check the decision to trace (off by default), tritonserver's flags against the record
of its documented settings (tests/data/upstream/triton_trace.json), the receiver's two encodings and
the engines' context lookup. The served test runs a real tritonserver on a CPU repository with a
local OTLP receiver and the API in this process, and reads back what each layer exported.
"""

from __future__ import annotations

import contextlib
import json
import re
import time
from pathlib import Path

import httpx
import pytest

from toolkit.api import ApiSettings, run_api_in_background
from toolkit.errors import TraceError
from toolkit.repository.sources import common_module
from toolkit.serve.net import free_port
from toolkit.settings import OtelEnvironment
from toolkit.trace.config import TracePlan, engine_environment, plan_tracing, triton_args
from toolkit.trace.receiver import SpanReceiver
from toolkit.trace.records import read_jsonl, traces

from repos import launch_on_free_ports, write_test_repository
from sse_events import sse_events
from tiny import make_tiny_checkpoint

UPSTREAM = json.loads(
    (Path(__file__).parent / "data" / "upstream" / "triton_trace.json").read_text()
)
ENDPOINT = OtelEnvironment(endpoint="http://127.0.0.1:4318")


# --- the decision ---------------------------------------------------------------------------------
def test_tracing_is_off_unless_a_rate_or_a_sampler_is_given():
    assert plan_tracing(None, None, OtelEnvironment()) is None
    assert plan_tracing(None, None, ENDPOINT) is None  # an endpoint alone traces nothing
    assert plan_tracing(0, None, ENDPOINT) is None
    plan = plan_tracing(0.25, None, ENDPOINT)
    assert plan is not None and plan.traces_url == "http://127.0.0.1:4318/v1/traces"
    assert plan.api_ratio == 0.25 and plan.triton_direct_rate == 4
    sampled = plan_tracing(None, None, OtelEnvironment(endpoint="h:1", sampler="always_on"))
    assert sampled is not None and sampled.api_ratio is None  # the SDK reads the sampler itself
    assert plan_tracing(1, None, OtelEnvironment(endpoint="h:1", sdk_disabled=True)) is None


@contextlib.contextmanager
def api_tracer_in_memory():
    """An ApiTracer exporting to a receiver, and an in-memory exporter beside it (the tracer is shut
    down, its spans all ended, when the block ends)."""
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from toolkit.api.tracing import ApiTracer

    with SpanReceiver(None, port=0) as receiver:
        tracer = ApiTracer(TracePlan(f"{receiver.url}/v1/traces", 1.0, "test"))
        memory = InMemorySpanExporter()
        tracer.provider.add_span_processor(SimpleSpanProcessor(memory))
        try:
            yield tracer, memory
        finally:
            tracer.shutdown()


def test_a_long_streams_span_lists_its_first_chunks_and_measures_every_gap():
    from toolkit.api.tracing import MAX_CHUNK_STAMPS

    with api_tracer_in_memory() as (tracer, memory):
        start = time.time_ns()
        trace = tracer.start(
            {"method": "POST", "path": "/v1/completions", "headers": []}, start, start
        )
        trace.call("tensorrt_llm")
        count = MAX_CHUNK_STAMPS + 10
        # a chunk every ms, one token each but the last (3), and a 40 ms stall before the last:
        # past the chunks the span lists
        stamps = [start + i * 1_000_000 for i in range(count - 1)]
        stamps.append(stamps[-1] + 40_000_000)
        trace.chunks = [(at, 1) for at in stamps[:-1]] + [(stamps[-1], 3)]
        trace.first_response_ns = start
        trace.first_write_ns, trace.last_write_ns = stamps[0], stamps[-1]
        trace.end(200)
    stream = next(s for s in memory.get_finished_spans() if s.name == "api.stream")
    attributes = stream.attributes
    assert attributes["toolkit.chunks"] == count and attributes["toolkit.tokens"] == count + 2
    offsets = [int(x) for x in attributes["toolkit.chunk_offsets_us"].split()]
    assert offsets == [i * 1000 for i in range(MAX_CHUNK_STAMPS)]
    assert attributes["toolkit.longest_chunk_gap_ms"] == 40.0  # the stall the list leaves out
    assert [int(x) for x in attributes["toolkit.chunk_tokens"].split()] == [1] * MAX_CHUNK_STAMPS


def test_an_endpoint_flag_without_a_rate_is_refused_not_silently_off():
    with pytest.raises(TraceError) as caught:
        plan_tracing(None, "127.0.0.1:4318", OtelEnvironment())
    assert "127.0.0.1:4318" in caught.value.message and "--trace-rate" in caught.value.hint
    # a sampler from the environment, or an explicit rate, is a decision: no error
    assert plan_tracing(None, "h:1", OtelEnvironment(sampler="always_on")) is not None
    assert plan_tracing(0, "h:1", OtelEnvironment()) is None


def test_the_traces_url_follows_the_otlp_exporters_rules():
    env = OtelEnvironment(endpoint="http://a:1/", traces_endpoint="http://b:2/custom")
    assert plan_tracing(1, None, env).traces_url == "http://b:2/custom"  # used as it is
    assert plan_tracing(1, "c:3", env).traces_url == "http://c:3/v1/traces"  # the flag wins
    assert plan_tracing(1, None, OtelEnvironment(endpoint="http://a:1/")).traces_url == (
        "http://a:1/v1/traces"
    )


@pytest.mark.parametrize(
    "endpoint, variable",
    [
        ("http://otel:4318/v1/traces", None),  # the traces URL where the base goes
        ("http://otel:4318/v1/traces/", None),
        ("http://otel:4318 x", None),  # a space: what the shell split badly
        ("http://:4318", None),  # no host
        ("http://127.0.0.1:99999", None),  # no port
        (None, "http://otel:4318/otlp/v1/traces"),  # OTEL_EXPORTER_OTLP_ENDPOINT, likewise
    ],
)
def test_an_otlp_base_url_that_would_lose_every_span_is_refused(endpoint, variable):
    """Each was taken and spans went to …/v1/traces/v1/traces (a 404 the exporters only log) or to no
    host. The error names where the value came from; the traces variable stays a whole URL."""
    with pytest.raises(TraceError) as caught:
        plan_tracing(1, endpoint, OtelEnvironment(endpoint=variable))
    given = "--otlp-endpoint" if endpoint else "OTEL_EXPORTER_OTLP_ENDPOINT"
    assert caught.value.message.startswith(given), caught.value.message
    if "/v1/traces" in (endpoint or variable):
        assert "drop /v1/traces" in caught.value.hint
        assert "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT" in caught.value.hint
    whole = OtelEnvironment(traces_endpoint="http://otel:4318/v1/traces")
    assert plan_tracing(1, None, whole).traces_url == "http://otel:4318/v1/traces"
    prefixed = plan_tracing(1, "http://gw.example.com/otlp", OtelEnvironment())  # a proxy's path
    assert prefixed.traces_url == "http://gw.example.com/otlp/v1/traces"


@pytest.mark.parametrize(
    "sampler, arg, says",
    [
        ("bogus", None, "OTEL_TRACES_SAMPLER=bogus is not a sampler"),
        ("traceidratio", "lots", "OTEL_TRACES_SAMPLER_ARG=lots is not a fraction"),
        ("parentbased_traceidratio", None, "OTEL_TRACES_SAMPLER_ARG=(unset)"),
        ("traceidratio", "1.5", "OTEL_TRACES_SAMPLER_ARG=1.5"),
    ],
)
def test_a_sampler_the_sdk_would_read_as_trace_everything_is_refused(sampler, arg, says):
    """The SDK takes an unknown OTEL_TRACES_SAMPLER, or a ratio sampler without a ratio, as tracing every
    request (a log line says so): a misspelt sampler traced 100 % of production traffic."""
    env = OtelEnvironment(endpoint="http://otel:4318", sampler=sampler, sampler_arg=arg)
    with pytest.raises(TraceError, match=re.escape(says)):
        plan_tracing(None, None, env)
    fine = OtelEnvironment(
        endpoint="http://otel:4318", sampler="ParentBased_TraceIdRatio", sampler_arg="0.01"
    )
    assert plan_tracing(None, None, fine) is not None
    assert (
        plan_tracing(0.5, None, env) is not None
    )  # --trace-rate decides: the variable is not read


def _span_line(trace_id: str = "ab" * 16) -> str:
    return json.dumps({
        "trace_id": trace_id, "span_id": "c" * 16, "parent_id": "", "name": "POST /v1/completions",
        "service": "toolkit", "start_ns": 1, "end_ns": 2, "attributes": {}, "events": [],
    })  # fmt: skip


def test_trace_show_says_what_is_wrong_with_a_file_or_a_trace_id(tmp_path):
    """A file that is not UTF-8 gave a traceback; one of no spans, or an empty --trace-id (which matched
    every trace), or an upper-case one (which matched none), said nothing useful."""
    from click.testing import CliRunner

    from toolkit.cli.main import cli

    def show(*args):
        return CliRunner().invoke(cli, ["trace", "show", *map(str, args)])

    binary, other, spans = tmp_path / "b.jsonl", tmp_path / "o.jsonl", tmp_path / "s.jsonl"
    binary.write_bytes(b"\xff\xfe\x00bin")
    other.write_text("[1, 2]\nnot json\n")
    spans.write_text(_span_line() + "\n")
    result = show(binary)
    assert result.exit_code == 1 and "is not a spans file" in result.output, result.output
    result = show(other)
    assert result.exit_code == 1 and "no span in" in result.output, result.output
    for bad in ("", "xyz", "a" * 33):
        result = show(spans, "--trace-id", bad)
        assert result.exit_code == 1 and "is not a trace id" in result.output, (bad, result.output)
    assert show(spans, "--trace-id", "ABAB").exit_code == 0  # hex in any case
    result = show(spans, "--trace-id", "ff")
    assert (
        result.exit_code == 1 and "no trace ff" in result.output and "1 trace(s)" in result.output
    )


def test_trace_collect_refuses_an_out_it_cannot_write_and_a_forward_that_is_no_url(tmp_path):
    """Both started and listened: every batch then failed with a traceback (its spans lost), or the
    forwarding thread died on the first batch."""
    from click.testing import CliRunner

    from toolkit.cli.main import cli

    def collect(*args):
        return CliRunner().invoke(
            cli, ["trace", "collect", "-p", str(free_port()), *map(str, args)]
        )

    result = collect("-o", tmp_path / "missing" / "spans.jsonl")
    assert result.exit_code == 1 and "cannot write spans to" in result.output, result.output
    result = collect("-o", "")
    assert result.exit_code == 1 and "is a folder" in result.output, result.output
    for forward in ("http://", "ftp://collector/v1/traces", "http://collector:99999/v1/traces"):
        result = collect("-o", tmp_path / "s.jsonl", "--forward", forward)
        assert result.exit_code == 1 and "is not an http(s) URL" in result.output, result.output


def test_a_receiver_that_cannot_listen_says_why_for_its_host_and_its_port():
    """Every failure to listen said "is another receiver running there? pick another --port", also
    for a host that does not resolve or is not this machine's."""
    from toolkit.errors import ServerError

    with pytest.raises(ServerError) as raised:
        SpanReceiver(host="no-such-host.invalid", port=free_port())
    assert "--host" in raised.value.hint and "--port" not in raised.value.hint
    with pytest.raises(ServerError) as raised:
        SpanReceiver(host="192.0.2.1", port=free_port())  # TEST-NET-1: never this machine's
    assert "--host" in raised.value.hint and "127.0.0.1" in raised.value.hint
    with SpanReceiver(port=0) as taken, pytest.raises(ServerError) as raised:
        SpanReceiver(port=taken.server.server_address[1])
    assert "pick another --port" in raised.value.hint


@pytest.mark.parametrize("rate", [-0.1, 1.5, float("nan")])
def test_a_rate_that_is_no_fraction_is_refused(rate):
    with pytest.raises(TraceError, match="--trace-rate"):
        plan_tracing(rate, None, ENDPOINT)


def test_a_rate_without_an_endpoint_names_the_variable_and_the_receiver():
    with pytest.raises(TraceError) as error:
        plan_tracing(0.5, None, OtelEnvironment())
    assert "OTEL_EXPORTER_OTLP_ENDPOINT" in error.value.hint
    assert "toolkit trace collect" in error.value.hint
    with pytest.raises(TraceError, match="not an http"):
        plan_tracing(0.5, "grpc://127.0.0.1:4317", OtelEnvironment())


def test_trace_context_only_runs_triton_at_rate_0_without_an_api_beside_it(monkeypatch, tmp_path):
    """The chart's triton container runs `toolkit serve` with no --openai-port (the API is its own
    container, which samples): --trace-context-only must start tritonserver at rate 0 all the same,
    else Triton would also trace 1 in 1/rate of the requests the API chose not to."""
    from toolkit.serve import lifecycle
    from toolkit.serve.launcher import ServerConfig

    started = []

    class Stop(Exception):
        pass

    def launch(config, on_wait, detached=False):
        started.append(triton_args(config.trace, behind_api=config.traced_by_api))
        raise Stop

    monkeypatch.setattr(lifecycle, "launch_server", launch)
    plan = TracePlan("http://127.0.0.1:4318/v1/traces", 0.1, "svc")
    for context_only in (True, False):
        options = lifecycle.ServeOptions(
            ServerConfig(tmp_path), trace=plan, trace_context_only=context_only
        )
        with pytest.raises(Stop):
            lifecycle.start_serving(options)
    assert "--trace-config=rate=0" in started[0]
    assert "--trace-config=rate=10" in started[1]  # alone, Triton samples 1 in 1/0.1 itself


def test_tritons_flags_are_its_documented_settings():
    plan = TracePlan("http://127.0.0.1:4318/v1/traces", 0.1, "svc")
    globals_, modes = UPSTREAM["global_settings"], UPSTREAM["mode_settings"]
    for behind_api, rate in ((True, "0"), (False, "10")):
        settings = {}
        for arg in triton_args(plan, behind_api=behind_api):
            flag, _, value = arg.partition("=")
            assert flag == UPSTREAM["flag"]
            head, _, rest = value.partition(",")
            if "=" in head:  # a global setting: <setting>=<value>
                key, _, setting = head.partition("=")
                assert key in globals_, arg
                settings[key] = setting
            else:  # <mode>,<setting>=<value>
                key, _, setting = rest.partition("=")
                assert head == "opentelemetry" and key in modes["opentelemetry"], arg
                settings[f"otel.{key}"] = setting
        assert (
            settings["mode"] == "opentelemetry" and settings["mode"] in globals_["mode"]["choices"]
        )
        assert settings["level"] in globals_["level"]["opentelemetry_supports"]
        # behind the API only what carries its context (rate 0, as the docs say); alone, 1 in 1/ratio
        assert settings["rate"] == rate
        assert settings["otel.url"] == plan.traces_url
        assert settings["otel.resource"] == "service.name=svc"


def test_the_engines_get_the_switch_and_the_endpoint():
    plan = TracePlan("http://h:1/v1/traces", 1.0, "svc")
    env = engine_environment(plan)
    tracing = common_module("tracing")
    assert env[tracing.ENGINE_SWITCH] == "1"
    assert env["OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"] == plan.traces_url


# --- the receiver ---------------------------------------------------------------------------------
def _export(url: str, body: bytes, content_type: str) -> int:
    response = httpx.post(f"{url}/v1/traces", content=body, headers={"content-type": content_type})
    return response.status_code


def _protobuf_export(trace_id: bytes, names: list[str]) -> bytes:
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    request = ExportTraceServiceRequest()
    resource = request.resource_spans.add()
    attribute = resource.resource.attributes.add()
    attribute.key, attribute.value.string_value = "service.name", "client"
    scope = resource.scope_spans.add()
    for index, name in enumerate(names):
        span = scope.spans.add()
        span.trace_id, span.span_id = trace_id, bytes([index + 1] * 8)
        span.name, span.start_time_unix_nano, span.end_time_unix_nano = name, 10, 20
    return request.SerializeToString()


def test_the_receiver_takes_json_and_protobuf_and_forwards_protobuf(tmp_path):
    with (
        SpanReceiver(None, port=0) as downstream,
        SpanReceiver(
            tmp_path / "spans.jsonl", port=0, forward=f"{downstream.url}/v1/traces"
        ) as receiver,
    ):
        # JSON as tritonserver sends it: ids in hex, times as strings, kind as a number
        json_body = {
            "resourceSpans": [
                {
                    "resource": {"attributes": []},
                    "scopeSpans": [
                        {
                            "scope": {"name": "triton-server"},
                            "spans": [
                                {
                                    "traceId": "0af7651916cd43dd8448eb211c80319c",
                                    "spanId": "b7ad6b7169203331",
                                    "name": "InferRequest",
                                    "kind": 2,
                                    "startTimeUnixNano": "100",
                                    "endTimeUnixNano": "300",
                                    "events": [{"name": "QUEUE_START", "timeUnixNano": "150"}],
                                    "attributes": [
                                        {"key": "triton.model_version", "value": {"intValue": "1"}}
                                    ],
                                }
                            ],
                        }
                    ],
                }
            ]
        }
        assert _export(receiver.url, json.dumps(json_body).encode(), "application/json") == 200
        assert (
            _export(
                receiver.url, _protobuf_export(b"\x01" * 16, ["a", "b"]), "application/x-protobuf"
            )
            == 200
        )
        assert _export(receiver.url, b"not otlp", "application/x-protobuf") == 400
        assert downstream.wait_for(lambda records: len(records) == 3, 10)
    written = read_jsonl(tmp_path / "spans.jsonl")
    triton = next(r for r in written if r.name == "InferRequest")
    assert (triton.trace_id, triton.span_id) == (
        "0af7651916cd43dd8448eb211c80319c",
        "b7ad6b7169203331",
    )
    assert (triton.start_ns, triton.end_ns, triton.component) == (100, 300, "triton")
    assert triton.event("QUEUE_START").time_ns == 150
    assert triton.attributes["triton.model_version"] == 1
    assert {r.name for r in written} == {"InferRequest", "a", "b"}
    # what went on, as protobuf, is what came in
    assert sorted((r.trace_id, r.name) for r in downstream.records) == sorted(
        (r.trace_id, r.name) for r in written
    )


# --- the engines' context -------------------------------------------------------------------------
class _Trace:
    def __init__(self, context):
        self.context = context

    def get_context(self):
        return self.context


class _Request:
    def __init__(self, context=None, parameters="{}"):
        self._trace, self._parameters = _Trace(context), parameters

    def trace(self):
        return self._trace

    def parameters(self):
        return self._parameters


TP_TRITON = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
TP_API = "00-0af7651916cd43dd8448eb211c80319c-00f067aa0ba902b7-01"


def test_an_engine_parents_its_spans_on_tritons_span_else_on_the_apis_parameter():
    tracing = common_module("tracing")
    both = _Request(json.dumps({"traceparent": TP_TRITON}), json.dumps({"traceparent": TP_API}))
    assert tracing.request_context(both) == TP_TRITON
    assert tracing.request_context(_Request(None, json.dumps({"traceparent": TP_API}))) == TP_API
    assert tracing.request_context(_Request(None, "{}")) is None
    assert tracing.request_context(_Request(None, "not json")) is None


def test_an_engine_without_the_switch_traces_nothing(monkeypatch):
    tracing = common_module("tracing")
    monkeypatch.delenv(tracing.ENGINE_SWITCH, raising=False)
    tracer = tracing.EngineTracer("tensorrt_llm")
    assert not tracer.enabled
    assert tracer.start(_Request(json.dumps({"traceparent": TP_TRITON})), 4, 16) is None


def test_an_engine_records_its_spans_under_a_sampled_context_and_none_under_an_unsampled_one(
    monkeypatch,
):
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    tracing = common_module("tracing")
    monkeypatch.setenv(tracing.ENGINE_SWITCH, "1")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "http://127.0.0.1:9/v1/traces")
    tracer = tracing.EngineTracer("tensorrt_llm")
    memory = InMemorySpanExporter()
    tracer.provider.add_span_processor(SimpleSpanProcessor(memory))
    try:
        unsampled = TP_API[:-2] + "00"
        spans = tracer.start(_Request(None, json.dumps({"traceparent": unsampled})), 20, 16)
        spans.step(1)
        spans.finish("length")
        tracer.build_ended()
        assert memory.get_finished_spans() == ()  # the caller did not sample it: no spans
        spans = tracer.start(_Request(None, json.dumps({"traceparent": TP_API})), 20, 16)
        for _ in range(3):
            spans.step(1)
        tracer.stop_builder()  # what finish() itself does is seen alone
        spans.finish("length")
        assert memory.get_finished_spans() == ()  # the step loop only queued it
        tracer.build_ended()
        assert len(memory.get_finished_spans()) == 4
    finally:
        tracer.shutdown()
    by_name = {span.name: span for span in memory.get_finished_spans()}
    assert set(by_name) == {"engine.request", "engine.queue", "engine.prefill", "engine.decode"}
    request = by_name["engine.request"]
    assert f"{request.context.trace_id:032x}" == TP_API.split("-")[1]
    assert f"{request.parent.span_id:016x}" == TP_API.split("-")[2]  # the API's call span
    for name in ("engine.queue", "engine.prefill", "engine.decode"):
        span = by_name[name]
        assert span.parent.span_id == request.context.span_id
        assert request.start_time <= span.start_time <= span.end_time <= request.end_time
    assert request.attributes["engine.kv_blocks"] == 2  # 20 prompt + 3 output tokens in 16-blocks
    assert by_name["engine.decode"].attributes["engine.decode_steps"] == 3
    assert request.resource.attributes["toolkit.component"] == "engine"
    assert request.instrumentation_scope.name == "toolkit.engine"


def test_the_apis_recorded_spans_are_children_of_its_request_span_in_its_trace():
    with api_tracer_in_memory() as (tracer, memory):
        start = time.time_ns()
        trace = tracer.start(
            {"method": "POST", "path": "/v1/completions", "headers": []}, start, start + 5
        )
        trace.tokenized(start + 6, start + 9)
        traceparent = trace.call("tensorrt_llm")
        trace.response(time.time_ns())
        trace.wrote(1)
        tracer.recorder.stop_builder()  # what end() itself does is seen alone
        trace.end(200)
        assert memory.get_finished_spans() == ()  # the event loop only queued its stamps
        tracer.recorder.build_queued()
        assert len(memory.get_finished_spans()) == 7
    by_name = {span.name: span for span in memory.get_finished_spans()}
    root = by_name["POST /v1/completions"]
    assert set(by_name) == {
        root.name, "api.receive", "api.admission", "api.tokenize", "api.generate",
        "api.first_chunk", "api.stream",
    }  # fmt: skip
    ids = {span.context.span_id for span in by_name.values()}
    assert len(ids) == len(by_name)  # each its own id
    for name, span in by_name.items():
        assert span.context.trace_id == root.context.trace_id
        if name != root.name:
            parent = by_name["api.admission"] if name == "api.tokenize" else root
            assert span.parent.span_id == parent.context.span_id, name
            assert span.resource.attributes["toolkit.component"] == "api"
            assert span.instrumentation_scope.name == "toolkit.api"
    assert (by_name["api.receive"].start_time, by_name["api.receive"].end_time) == (
        start,
        start + 5,
    )
    assert (by_name["api.tokenize"].start_time, by_name["api.tokenize"].end_time) == (
        start + 6,
        start + 9,
    )
    call = by_name["api.generate"]  # the span whose context went to Triton
    assert traceparent == f"00-{root.context.trace_id:032x}-{call.context.span_id:016x}-01"
    assert root.parent is None and root.kind.name == "SERVER" and call.kind.name == "CLIENT"
    assert [event.name for event in root.events] == ["first_token"]
    assert root.attributes["http.response.status_code"] == 200


def test_the_api_follows_a_clients_sampling_decision_and_its_ratio_otherwise():
    from toolkit.api.tracing import ApiTracer

    def scope(traceparent: str | None = None) -> dict:
        headers = [(b"traceparent", traceparent.encode())] if traceparent else []
        return {"method": "POST", "path": "/v1/completions", "headers": headers}

    client_trace, client_span = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
    with SpanReceiver(None, port=0) as receiver:
        never = ApiTracer(TracePlan(f"{receiver.url}/v1/traces", 1e-12, "test"))
        always = ApiTracer(TracePlan(f"{receiver.url}/v1/traces", 1.0, "test"))
        try:
            now = time.time_ns()
            assert never.start(scope(), now, now) is None
            followed = never.start(scope(f"00-{client_trace}-{client_span}-01"), now, now)
            assert followed is not None and f"{followed.root.trace_id:032x}" == client_trace
            assert f"{followed.parent.span_id:016x}" == client_span
            assert always.start(scope(f"00-{client_trace}-{client_span}-00"), now, now) is None
            # malformed: a trace of its own
            fresh = always.start(scope("00-not-a-context"), now, now)
            assert fresh is not None and fresh.parent is None
            assert f"{fresh.root.trace_id:032x}" != client_trace
        finally:
            never.shutdown()
            always.shutdown()


# --- served: one trace across the API, tritonserver and the CPU engine ----------------------------
@pytest.fixture(scope="module")
def traced_stack(tmp_path_factory):
    """A tiny CPU repository on tritonserver with tracing, a receiver, and traced APIs in this process:
    one that samples every request, one that follows only a client's sampled context."""
    root = tmp_path_factory.mktemp("traced")
    with (
        pytest.MonkeyPatch.context() as env,
        SpanReceiver(root / "spans.jsonl", port=0) as receiver,
    ):
        env.setenv(
            "OTEL_BSP_SCHEDULE_DELAY", "100"
        )  # the engines' and the API's exports, every 0.1 s
        repo = write_test_repository(make_tiny_checkpoint(root / "checkpoint"), root / "repo")
        plan = TracePlan(f"{receiver.url}/v1/traces", 1.0, "toolkit-test")
        server = launch_on_free_ports(
            repo, root / "tritonserver.log", 300, trace=plan, traced_by_api=True
        )
        followed = TracePlan(
            plan.traces_url, 1e-12, plan.service_name
        )  # in effect: never on its own
        # The first reads the engine over HTTP (serve's default), the second over gRPC: a trace
        # crosses both transports.
        apis = [
            run_api_in_background(
                ApiSettings(server.grpc_url, repo, trace=p, engine_http_url=http), port=free_port()
            )
            for p, http in ((plan, server.http_url), (followed, None))
        ]
        try:
            yield receiver, *apis
        finally:
            for api in apis:
                api.stop()
            server.stop()


def _stream(url: str, headers: dict | None = None) -> dict:
    body = {
        "model": "tensorrt_llm",
        "prompt": "The capital of France is",
        "max_tokens": 6,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    with httpx.stream("POST", f"{url}/v1/completions", json=body, headers=headers, timeout=60) as r:
        assert r.status_code == 200
        events = list(sse_events(r.iter_lines()))
    return next(e for e in events if isinstance(e, dict) and e.get("usage"))["usage"]


# The engine's and Triton's exporters send on their own schedules (every few seconds); a loaded 2-core
# machine once took over 15 s for the last of them to arrive.
def _whole_trace(
    receiver: SpanReceiver, trace_id: str, timeout_s: float = 30.0, *, triton: bool = True
):
    """The trace's spans once the API's root, the engine's and (`triton`) Triton's top span have all
    arrived. A request the API sends over gRPC may lack Triton's spans: tritonserver misreads a few
    gRPC trace contexts in a thousand even with the API's guard (toolkit.api.triton.TRACEPARENT_GUARD),
    and then traces nothing of the request (the engine's spans then hang under api.generate)."""
    needed = {"engine.request", "engine.decode"} | ({"InferRequest"} if triton else set())

    def whole(records) -> bool:
        names = {r.name for r in records if r.trace_id == trace_id}
        return needed <= names and any(
            r.trace_id == trace_id and r.name.startswith("POST ") for r in records
        )

    if not receiver.wait_for(whole, timeout_s):
        seen = sorted({r.name for r in receiver.records if r.trace_id == trace_id})
        raise AssertionError(
            f"the trace did not arrive whole in {timeout_s:g} s: its spans were {seen}; the receiver "
            f"took {receiver.batches} batches and refused {receiver.rejected}"
        )
    time.sleep(0.3)  # the rest of the same exports
    return traces(receiver.records)[trace_id]


@pytest.mark.server
def test_one_request_is_one_trace_from_the_api_through_triton_to_the_engine(traced_stack):
    receiver, api, _ = traced_stack
    before = {r.trace_id for r in receiver.records}
    usage = _stream(api.url)
    root = _wait_root(receiver, before)
    spans = _whole_trace(receiver, root.trace_id)
    by_name = {s.name: s for s in spans}
    assert {s.component for s in spans} == {"api", "triton", "engine"}
    # the chain of parents: API request -> its gRPC call -> Triton's request -> the engine's model span
    # -> the engine's request and its phases
    parent = {s.span_id: s for s in spans}
    engine = by_name["engine.request"]
    chain = []
    node = engine
    while node.parent_id in parent:
        node = parent[node.parent_id]
        chain.append(node.name)
    assert chain == ["tensorrt_llm", "InferRequest", "api.generate", root.name]
    assert parent[by_name["engine.decode"].parent_id].name == "engine.request"
    # in order: the API calls, Triton receives, the engine runs, each inside its caller
    call, triton = by_name["api.generate"], by_name["InferRequest"]
    assert root.start_ns <= by_name["api.receive"].start_ns <= by_name["api.admission"].end_ns
    assert by_name["api.admission"].end_ns <= call.start_ns <= triton.start_ns <= engine.start_ns
    assert by_name["engine.queue"].end_ns <= by_name["engine.decode"].start_ns
    assert by_name["engine.decode"].end_ns <= call.end_ns <= root.end_ns
    assert by_name["api.first_chunk"].end_ns <= by_name["api.stream"].end_ns <= root.end_ns
    # the request's token counts, as every layer saw them
    assert root.attributes["gen_ai.usage.output_tokens"] == usage["completion_tokens"]
    assert root.attributes["gen_ai.usage.input_tokens"] == usage["prompt_tokens"]
    assert engine.attributes["engine.output_tokens"] == usage["completion_tokens"]
    assert engine.attributes["gen_ai.usage.input_tokens"] == usage["prompt_tokens"]
    stream = by_name["api.stream"]
    assert stream.attributes["toolkit.tokens"] == usage["completion_tokens"]
    assert engine.attributes["engine.decode_steps"] >= 1
    # each chunk's time, us after the first, within the stream span; its tokens when not one each
    offsets = [int(x) for x in stream.attributes["toolkit.chunk_offsets_us"].split()]
    assert len(offsets) == stream.attributes["toolkit.chunks"] >= 1 and offsets[0] == 0
    assert offsets == sorted(offsets)
    assert offsets[-1] * 1000 <= stream.end_ns - stream.start_ns + 1000
    gaps = [b - a for a, b in zip(offsets, offsets[1:], strict=False)]
    assert stream.attributes["toolkit.longest_chunk_gap_ms"] == max(gaps, default=0) / 1000
    per_chunk = stream.attributes.get("toolkit.chunk_tokens")
    counts = [int(x) for x in per_chunk.split()] if per_chunk else [1] * len(offsets)
    assert sum(counts) == usage["completion_tokens"]


END_ID = 2  # the tiny checkpoint's eos_token_id


@pytest.mark.server
def test_a_stream_that_ends_on_the_end_token_keeps_every_span_inside_its_parent(traced_stack):
    """The engine's last step, the one that draws the end token, gives the client no token: the API's
    call span ended at the last token and the engine's decode span at the last token shown, so that
    step (58 ms on SmolLM2) fell outside both, and the breakdown gave it to Triton."""
    receiver, api, _ = traced_stack
    before = {r.trace_id for r in receiver.records}
    body = {
        "model": "tensorrt_llm", "prompt": "The capital of France is", "max_tokens": 6,
        "min_tokens": 3, "logit_bias": {str(END_ID): 100}, "temperature": 0, "stream": True,
        "stream_options": {"include_usage": True},
    }  # fmt: skip
    with httpx.stream("POST", f"{api.url}/v1/completions", json=body, timeout=60) as r:
        events = [e for e in sse_events(r.iter_lines()) if isinstance(e, dict)]
    finishes = [c["finish_reason"] for e in events for c in e["choices"] if c["finish_reason"]]
    assert finishes == ["stop"]
    usage = next(e["usage"] for e in events if e.get("usage"))
    assert usage["completion_tokens"] == 3  # the end token, at the first step it may come
    # over gRPC (a logit bias): Triton's own spans are not certain (_whole_trace)
    spans = _whole_trace(receiver, _wait_root(receiver, before).trace_id, triton=False)
    by_name = {s.name: s for s in spans}
    engine, decode = by_name["engine.request"], by_name["engine.decode"]
    assert engine.attributes["engine.decode_steps"] == 3 + 1  # the end token's step counts
    phases = [s for s in spans if s.name.startswith("engine.") and s is not engine]
    assert decode.end_ns == max(s.end_ns for s in phases)
    # the call ends with the final response, which the engine sends as it ends the request (Triton's
    # own span ends a little after it: its release of the request)
    assert engine.end_ns <= by_name["api.generate"].end_ns


def _wait_root(receiver: SpanReceiver, before: set[str], timeout_s: float = 15.0):
    def arrived(records) -> bool:
        return any(r.name.startswith("POST ") and r.trace_id not in before for r in records)

    assert receiver.wait_for(arrived, timeout_s), "no API span arrived"
    return next(
        r for r in receiver.records if r.name.startswith("POST ") and r.trace_id not in before
    )


@pytest.mark.server
def test_a_clients_sampled_context_is_followed_and_an_unsampled_request_is_not_traced(traced_stack):
    receiver, _, follower = traced_stack
    before = {r.trace_id for r in receiver.records}
    _stream(follower.url)  # no context: this API's ratio leaves it out
    client_trace, client_span = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
    _stream(follower.url, {"traceparent": f"00-{client_trace}-{client_span}-01"})
    spans = _whole_trace(receiver, client_trace, triton=False)  # this API calls Triton over gRPC
    root = next(s for s in spans if s.name.startswith("POST "))
    assert root.parent_id == client_span  # a child of the client's span, in the client's trace
    assert {r.trace_id for r in receiver.records} - before == {client_trace}
