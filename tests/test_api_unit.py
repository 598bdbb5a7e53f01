"""The OpenAI API without a server: validation, auth, unsupported fields, limits, stop handling, SSE format.

The app points at an unreachable Triton; only requests that pass every check reach it (and get 503).
The repository here is a minimal one: a preprocessing config with limits and a tiny word-level tokenizer.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from hypothesis import given, settings
from hypothesis import strategies as st

from toolkit.api import ApiSettings, create_app
from toolkit.api.generation import Generation, Job, SseFormatter
from toolkit.api.metrics import ApiMetrics
from toolkit.api.stops import StopScanner
from toolkit.api.triton import Piece, Sampling
from toolkit.repository.reader import open_repository
from toolkit.settings import api_keys

from repos import config_only_checkpoint, write_test_repository
from sse_events import sse_events
from toy_tokenizers import CHATML_EOS, chatml_tokenizer_files, word_level

UNREACHABLE = "127.0.0.1:1"
WORDS = [
    "hello",
    "world",
    "the",
    "capital",
    "of",
    "france",
    "is",
    "paris",
    "<|im_start|>",
    "<|im_end|>",
    "system",
    "user",
    "assistant",
    "\n",
]
MAX_INPUT = 24


def _write_tiny_repo(root: Path) -> Path:
    """A synthetic-engine repository (written by the toolkit's writer) over a tiny word-level tokenizer."""
    tokenizer = word_level(WORDS)
    checkpoint = config_only_checkpoint(
        root / "checkpoint",
        chatml_tokenizer_files(tokenizer),
        vocab_size=tokenizer.get_vocab_size(),
        eos_token_id=tokenizer.token_to_id(CHATML_EOS),
    )
    return write_test_repository(
        checkpoint,
        root / "repo",
        source="hf:HuggingFaceTB/Tiny-Test",
        synthetic=True,
        max_input_len=MAX_INPUT,
        max_output_len=16,
        max_seq_len=32,
        kv_cache_tokens=64,
    )


@pytest.fixture(scope="module")
def tiny_repo(tmp_path_factory) -> Path:
    return _write_tiny_repo(tmp_path_factory.mktemp("repo"))


def _client(repo: Path, **kw) -> TestClient:
    return TestClient(
        create_app(ApiSettings(UNREACHABLE, repo, **kw)), raise_server_exceptions=False
    )


@pytest.fixture(scope="module")
def client(tiny_repo):
    with _client(tiny_repo) as test_client:
        yield test_client


def _chat(**fields) -> dict:
    return {
        "model": "Tiny-Test",
        "messages": [{"role": "user", "content": "hello world"}],
        **fields,
    }


def _assert_openai_error(response, status: int, param: str | None = None) -> dict:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["message"]
    if param is not None:
        assert error["param"] == param
    return error


# --- facts and models --------------------------------------------------------------------------
def test_repository_limits_come_from_the_manifest(tiny_repo):
    repository = open_repository(tiny_repo)
    assert repository.limits.max_input_len == MAX_INPUT and repository.limits.output_limit(20) == 12
    assert repository.tokenizer_dir == tiny_repo / "preprocessing" / "1" / "tokenizer"


def test_models_lists_the_manifest_model(client):
    body = client.get("/v1/models").json()
    assert body["object"] == "list" and [m["id"] for m in body["data"]] == ["Tiny-Test"]
    assert client.get("/v1/models/Tiny-Test").json()["id"] == "Tiny-Test"
    _assert_openai_error(client.get("/v1/models/nope"), 404, "model")


def test_health_is_503_while_triton_is_unreachable(client):
    _assert_openai_error(client.get("/health"), 503)


def test_metrics_expose_the_promised_series(client):
    client.get("/v1/models")
    text = client.get("/metrics").text
    for name in (
        "toolkit_api_requests_total",
        "toolkit_api_prompt_tokens_total",
        "toolkit_api_completion_tokens_total",
        "toolkit_api_time_to_first_token_seconds_bucket",
        "toolkit_api_inter_token_latency_seconds_bucket",
        "toolkit_api_requests_in_flight",
    ):
        assert name in text
    assert 'toolkit_api_requests_total{endpoint="models",status="200"}' in text


# --- validation: 400 in OpenAI's format, never 422 ---------------------------------------------
@pytest.mark.parametrize(
    "fields, param",
    [
        ({"n": 2}, "n"),
        ({"n": True}, "n"),  # True == 1 in Python; not to us
        # without stream: OpenAI refuses it too
        (
            {"stream_options": {"include_usage": True}},
            "stream_options",
        ),
        ({"logprobs": True}, "logprobs"),
        ({"top_logprobs": 2}, "top_logprobs"),
        # tool_choice auto (the default) needs a tool-call parser; this tokenizer has no family's markers
        ({"tools": [{"type": "function", "function": {"name": "f"}}]}, "tool_choice"),
        ({"tools": [{"type": "function", "function": {"name": "bad name"}}]}, None),
        ({"tool_choice": "auto"}, "tool_choice"),  # no tools
        ({"response_format": {"type": "json_schema"}}, None),
        ({"response_format": {"type": "regex", "regex": ""}}, None),
        ({"response_format": {"type": "json_object"}}, "response_format"),
        ({"presence_penalty": 0.5}, "presence_penalty"),
        ({"logit_bias": {"1": 5}}, "logit_bias"),
        ({"frobnicate": 1}, "frobnicate"),
        ({"temperature": 3}, "temperature"),
        ({"top_p": -0.1}, "top_p"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"seed": -(2**63) - 1}, "seed"),  # below int64 (a negative int64 is a valid seed)
        ({"stop": ["a", "b", "c", "d", "e"]}, "stop"),
        ({"stop": ""}, None),
        ({"messages": []}, "messages"),
        (
            {
                "messages": [
                    {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}
                ]
            },
            None,
        ),
        (
            {
                "messages": [
                    {
                        "role": "assistant",
                        "tool_calls": [{"id": "1", "type": "function", "function": {"name": "f"}}],
                    }
                ]
            },
            None,
        ),  # a call without its arguments
        ({"stream_options": {"include_usage": True, "bogus": 1}}, None),
    ],
)
def test_chat_refuses_what_it_cannot_honour_with_400(client, fields, param):
    _assert_openai_error(client.post("/v1/chat/completions", json=_chat(**fields)), 400, param)


@pytest.mark.parametrize(
    "fields, param",
    [
        ({"best_of": 3}, "best_of"),
        ({"suffix": "x"}, "suffix"),
        ({"prompt": ["a"] * 65}, "prompt"),
        ({"prompt": [1, 2, 3]}, None),
        ({"response_format": {"type": "ebnf", "ebnf": 'root ::= "a"'}}, "response_format"),
        ({"logprobs": 2}, "logprobs"),
        ({"logprobs": 0}, "logprobs"),
        ({"n": 3}, "n"),
    ],
)
def test_completions_refuse_what_they_cannot_honour_with_400(client, fields, param):
    body = {"model": "Tiny-Test", "prompt": "hello", **fields}
    _assert_openai_error(client.post("/v1/completions", json=body), 400, param)


@pytest.mark.parametrize(
    "response_format, param",
    [
        (
            {"type": "json_schema", "json_schema": {"name": "x", "schema": 5}},
            "response_format.json_schema.schema",
        ),
        ({"type": "json_schema", "json_schema": {"name": ""}}, "response_format.json_schema.name"),
        ({"type": "regex", "regex": ""}, "response_format.regex"),
        ({"type": "ebnf"}, "response_format.ebnf"),
    ],
)
def test_a_response_format_error_names_the_field_once(client, response_format, param):
    """pydantic puts the member's tag in the location: `param` read
    response_format.json_schema.json_schema.schema."""
    body = _chat(response_format=response_format)
    _assert_openai_error(client.post("/v1/chat/completions", json=body), 400, param)


def test_malformed_json_and_missing_fields_are_400(client):
    _assert_openai_error(
        client.post(
            "/v1/chat/completions",
            content=b"{not json",
            headers={"content-type": "application/json"},
        ),
        400,
    )
    _assert_openai_error(client.post("/v1/chat/completions", json={}), 400)
    _assert_openai_error(client.post("/v1/completions", json={"model": "Tiny-Test"}), 400, "prompt")


def test_unknown_model_is_404(client):
    _assert_openai_error(
        client.post("/v1/chat/completions", json={**_chat(), "model": "gpt-4"}), 404, "model"
    )


def test_too_long_prompt_is_400_naming_the_limit(client):
    error = _assert_openai_error(
        client.post("/v1/completions", json={"model": "Tiny-Test", "prompt": "hello " * 40}),
        400,
        "prompt",
    )
    assert error["code"] == "context_length_exceeded" and str(MAX_INPUT) in error["message"]
    # A prompt long enough to be tokenized off the event loop gets the same answer.
    error = _assert_openai_error(
        client.post("/v1/completions", json={"model": "Tiny-Test", "prompt": "hello " * 20000}),
        400,
        "prompt",
    )
    assert error["code"] == "context_length_exceeded" and "20000 tokens" in error["message"]


def test_max_tokens_over_the_engine_limit_is_400(client):
    error = _assert_openai_error(
        client.post("/v1/chat/completions", json=_chat(max_completion_tokens=17)),
        400,
        "max_completion_tokens",
    )
    assert "16" in error["message"]


def test_lone_surrogate_prompt_is_400(client):
    raw = b'{"model": "Tiny-Test", "prompt": "hello \\ud800"}'
    _assert_openai_error(
        client.post("/v1/completions", content=raw, headers={"content-type": "application/json"}),
        400,
        "prompt",
    )


def test_a_valid_request_reaches_triton_and_gets_503_when_it_is_down(tiny_repo):
    with _client(tiny_repo) as client:
        error = _assert_openai_error(
            client.post("/v1/chat/completions", json=_chat(max_tokens=4)), 503
        )
        assert error["code"] == "triton_unavailable"
        _assert_openai_error(
            client.post("/v1/chat/completions", json=_chat(max_tokens=4, stream=True)), 503
        )
        metrics = client.get("/metrics").text
    assert "toolkit_api_failed_requests_total 2.0" in metrics  # failures, not client cancellations
    assert "toolkit_api_cancelled_requests_total 0.0" in metrics


def test_openapi_schema_documents_the_routes(client):
    paths = client.get("/openapi.json").json()["paths"]
    assert {"/v1/chat/completions", "/v1/completions", "/v1/models", "/health", "/metrics"} <= set(
        paths
    )


# --- auth and backpressure ---------------------------------------------------------------------
def test_api_keys_guard_every_route_but_health_and_metrics(tiny_repo):
    with _client(tiny_repo, api_keys=("sk-right", "sk-other")) as client:
        error = _assert_openai_error(client.get("/v1/models"), 401)
        assert error["code"] == "invalid_api_key" and "sk-right" not in json.dumps(error)
        _assert_openai_error(
            client.get("/v1/models", headers={"Authorization": "Bearer sk-wrong"}), 401
        )
        _assert_openai_error(
            client.post(
                "/v1/chat/completions", json=_chat(), headers={"Authorization": "Basic sk-right"}
            ),
            401,
        )
        assert (
            client.get("/v1/models", headers={"Authorization": "Bearer sk-right"}).status_code
            == 200
        )
        assert (
            client.get("/v1/models", headers={"Authorization": "bearer sk-other"}).status_code
            == 200
        )
        assert client.get("/metrics").status_code == 200
        assert client.get("/health").status_code == 503  # open: Triton is down, not the caller
        for path in ("/openapi.json", "/docs", "/anything"):
            _assert_openai_error(client.get(path), 401)
        assert (
            client.get("/anything", headers={"Authorization": "Bearer sk-right"}).status_code == 404
        )


def test_in_flight_bound_answers_429_with_retry_after(tiny_repo):
    app = create_app(ApiSettings(UNREACHABLE, tiny_repo, max_in_flight=1, retry_after_s=2))
    with TestClient(app, raise_server_exceptions=False) as client:
        gate = app.middleware_stack  # built on first request
        while not hasattr(gate, "in_flight"):
            gate = gate.app
        gate.in_flight.count = 1  # as if one generation were running
        response = client.post("/v1/chat/completions", json=_chat())
        error = _assert_openai_error(response, 429)
        assert response.headers["retry-after"] == "2" and error["code"] == "rate_limit_exceeded"
        assert client.get("/v1/models").status_code == 200  # only generation is bounded
        gate.in_flight.count = 0
        assert client.post("/v1/chat/completions", json=_chat()).status_code == 503


def test_api_keys_merge_key_files_and_env(tmp_path, monkeypatch):
    keys = tmp_path / "keys"
    keys.write_text("a\n # a comment\n b \n\n")
    monkeypatch.setenv("TOOLKIT_API_KEYS", "c, a,,d")
    assert api_keys([keys]) == ("a", "b", "c", "d")


# --- stop strings and UTF-8 ----------------------------------------------------------------------
def _scan(pieces: list[bytes], stops: list[str]) -> tuple[str, bool]:
    scanner = StopScanner(stops)
    out = "".join(scanner.feed(p) for p in pieces)
    return out + scanner.flush(), scanner.stopped


def test_stop_string_split_across_pieces_is_cut_and_not_returned():
    assert _scan([b"Paris is", b" the cap", b"ital. EN", b"D and more"], ["END"]) == (
        "Paris is the capital. ",
        True,
    )


def test_multibyte_character_split_across_pieces_is_rejoined():
    data = "café ☕ naïve".encode()
    assert _scan([data[i : i + 1] for i in range(len(data))], []) == ("café ☕ naïve", False)


@settings(max_examples=200, deadline=None)
@given(
    st.text(min_size=0, max_size=40),
    st.lists(st.text(min_size=1, max_size=4), min_size=0, max_size=3),
    st.data(),
)
def test_stop_scanner_equals_cutting_the_whole_text(text, stops, data):
    raw = text.encode()
    cuts = sorted(data.draw(st.lists(st.integers(0, len(raw)), max_size=6)))
    pieces = [raw[a:b] for a, b in zip([0, *cuts], [*cuts, len(raw)], strict=True)]
    found = [(i + len(s), i) for s, i in ((s, text.find(s)) for s in stops) if i >= 0]
    # cut where the first stop to complete starts
    expected = text[: min(found)[1]] if found else text
    assert _scan(pieces, stops) == (expected, bool(found))
    # however the bytes are grouped
    assert _scan(pieces, stops) == _scan([raw[i : i + 1] for i in range(len(raw))], stops)


def test_the_stop_that_completes_first_wins_whatever_the_grouping():
    # "bcd" completes before "abcdx" does, though "abcdx" starts first: token by token the text is "a".
    assert _scan([b"a", b"b", b"c", b"d", b"x"], ["bcd", "abcdx"]) == ("a", True)
    assert _scan([b"abcdx"], ["bcd", "abcdx"]) == ("a", True)


# --- generation bookkeeping and SSE format -------------------------------------------------------
class _FakeBackend:
    """Stands in for Triton at the backend seam: yields the given pieces, records whether it was closed early."""

    def __init__(self, pieces: list[Piece], engine: bool = True):
        self.pieces = pieces
        self.engine = (
            engine  # True: the tensorrt_llm contract (token counts); False: ensemble / BLS text
        )
        self.closed_early = False

    async def generate(self, prompt, prompt_ids, max_tokens, sampling, stops=False):
        finished = False
        try:
            for piece in self.pieces:
                yield piece
            finished = True
        finally:
            self.closed_early = not finished


def _job(**kw) -> Job:
    fields = dict(
        id="chatcmpl-1",
        kind="chat",
        model="m",
        prompt="p",
        prompt_ids=[1] * 5,
        prompt_tokens=5,
        max_tokens=4,
        sampling=Sampling(),
        stops=(),
        include_usage=True,
    )
    return Job(**{**fields, **kw})


async def _run(job: Job, backend, count_tokens=None) -> tuple[str, Generation]:
    generation = Generation(job, backend, ApiMetrics(), count_tokens)
    text = "".join([t async for t in generation.texts()])
    return text, generation


@pytest.mark.parametrize("count_reported", [True, False])
def test_generation_counts_tokens_and_finish_reason(count_reported):
    import asyncio

    pieces = [
        Piece(w.encode(), i + 1 if count_reported else None, i == 3)
        for i, w in enumerate(["a", "b", "c", "d"])
    ]
    text, generation = asyncio.run(_run(_job(), _FakeBackend(pieces)))
    assert (
        text == "abcd"
        and generation.finish_reason == "length"
        and generation.usage() == {"prompt_tokens": 5, "completion_tokens": 4, "total_tokens": 9}
    )
    text, generation = asyncio.run(_run(_job(max_tokens=10), _FakeBackend(pieces)))
    assert generation.finish_reason == "stop"  # the engine ended early: end of sequence


def test_a_traced_call_ends_with_the_engines_last_response_one_without_a_token_too():
    """The engine's final response after the end token carries no token: the call's span ended at the
    last token instead, leaving the end token's step (58 ms on SmolLM2) outside it."""
    import asyncio

    class Stamps:
        """The RequestTrace calls a generation makes, with a clock of its own."""

        model_name = "tensorrt_llm"

        def __init__(self):
            self.responses = 0

        def call(self, model):
            return "00-" + "1" * 32 + "-" + "2" * 16 + "-01"

        def response(self, now_ns):
            self.responses += 1

        def usage(self, *args):
            pass

    class Traced(_FakeBackend):
        model_name = "tensorrt_llm"

        async def generate(self, prompt, prompt_ids, max_tokens, sampling, **options):
            for piece in self.pieces:
                yield piece

    stamps = Stamps()
    pieces = [Piece(b"a", 1, False), Piece(b"b", 2, False), Piece(b"", 2, True)]
    text, generation = asyncio.run(_run(_job(max_tokens=10, trace=stamps), Traced(pieces)))
    assert text == "ab" and generation.finish_reason == "stop"
    assert stamps.responses == 3  # the last one, without a token, counted


def test_the_text_models_answers_are_counted_with_the_tokenizer_when_they_end():
    """The pinned release's ensemble and BLS return no token count: the text is counted at the end."""
    import asyncio

    pieces = [Piece(b"one two ", None, False), Piece(b"three", None, True)]
    words = lambda data: len(data.split())  # noqa: E731 - stands in for the repository's tokenizer
    text, generation = asyncio.run(
        _run(_job(max_tokens=3), _FakeBackend(pieces, engine=False), words)
    )
    assert (
        text == "one two three"
        and generation.completion_tokens == 3
        and generation.finish_reason == "length"
    )
    text, generation = asyncio.run(
        _run(_job(max_tokens=14), _FakeBackend(pieces, engine=False), words)
    )
    # 13 bytes cannot be 14 tokens: the engine ended early
    assert generation.completion_tokens == 3 and generation.finish_reason == "stop"


def test_stop_string_ends_generation_and_cancels_the_engine_request():
    import asyncio

    backend = _FakeBackend(
        [
            Piece(w.encode(), i + 1, False)
            for i, w in enumerate(["one ", "two ", "thr", "ee ", "four"])
        ]
    )
    text, generation = asyncio.run(_run(_job(max_tokens=10, stops=("three",)), backend))
    assert (
        text == "one two "
        and generation.finish_reason == "stop"
        and generation.completion_tokens == 4
    )
    assert backend.closed_early


def test_an_unexpected_error_mid_stream_ends_with_an_error_event_and_done():
    import asyncio

    from toolkit.api.responses import _sse

    class Broken(_FakeBackend):
        async def generate(self, prompt, prompt_ids, max_tokens, sampling):
            yield Piece(b"one ", 1, False)
            raise RuntimeError("decoder blew up")

    async def stream():
        generation = Generation(_job(max_tokens=10), Broken([]), ApiMetrics())
        first = None
        sse = SseFormatter(generation.job)
        return [chunk async for chunk in _sse(sse, [generation], generation.deltas(), first)]

    body = b"".join(asyncio.run(stream())).decode()
    assert (
        '"content":"one "' in body
        and '"code":"internal_error"' in body
        and "decoder blew up" not in body
    )
    assert body.endswith("data: [DONE]\n\n")


def test_sse_chunks_follow_openai_chunk_format():
    job = _job()
    sse = SseFormatter(job)
    events = [sse.first(), sse.text('say "hi"\n')]
    generation = Generation(job, _FakeBackend([]), ApiMetrics())
    generation.completion_tokens, generation.finish_reason = 2, "stop"
    events.append(sse.end(generation))
    lines = [line for event in events for line in event.decode().split("\n\n") if line]
    assert lines[-1] == "data: [DONE]" and all(line.startswith("data: ") for line in lines)
    chunks = list(sse_events(lines[:-1]))
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert (
        chunks[1]["choices"][0]["delta"] == {"content": 'say "hi"\n'}
        and chunks[1]["object"] == "chat.completion.chunk"
    )
    assert chunks[2]["choices"][0]["finish_reason"] == "stop" and chunks[2]["usage"] is None
    assert chunks[3]["choices"] == [] and chunks[3]["usage"]["total_tokens"] == 7


# --- CLI -----------------------------------------------------------------------------------------
def test_cli_dry_run_prints_settings_without_keys(tiny_repo, monkeypatch):
    from click.testing import CliRunner

    from toolkit.cli.main import cli

    monkeypatch.setenv("TOOLKIT_API_KEYS", "sk-secret-1,sk-secret-2")
    key_file = tiny_repo.parent / "api-keys"
    key_file.write_text("sk-secret-3\n")
    result = CliRunner().invoke(
        cli, ["api", "--repo", str(tiny_repo), "--port", "19555", "-k", str(key_file), "--dry-run"]
    )
    assert result.exit_code == 0, result.output
    settings = json.loads(result.output)
    assert (
        settings["api_keys"] == 3 and settings["port"] == 19555 and settings["host"] == "127.0.0.1"
    )
    assert "sk-secret" not in result.output


def test_a_key_on_the_command_line_is_refused_naming_the_file_option(tiny_repo):
    from click.testing import CliRunner

    from toolkit.cli.main import cli

    result = CliRunner().invoke(
        cli, ["api", "--repo", str(tiny_repo), "--api-key", "sk-visible-in-ps", "--dry-run"]
    )
    assert result.exit_code == 1 and "fix:" in result.output  # a usage error, said as every error
    assert "--api-key-file" in result.output and "TOOLKIT_API_KEYS" in result.output


def test_cli_loop_and_http_choices(tiny_repo, monkeypatch):
    import importlib.util

    from click.testing import CliRunner

    from toolkit.cli.main import cli

    result = CliRunner().invoke(
        cli, ["api", "--repo", str(tiny_repo), "--loop", "asyncio", "--http", "h11", "--dry-run"]
    )
    assert result.exit_code == 0, result.output
    assert (
        json.loads(result.output)["loop"] == "asyncio"
        and json.loads(result.output)["http"] == "h11"
    )
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a: None if name == "uvloop" else real_find_spec(name, *a),
    )
    result = CliRunner().invoke(
        cli, ["api", "--repo", str(tiny_repo), "--loop", "uvloop", "--dry-run"]
    )
    assert (
        result.exit_code == 1
        and "pip install uvloop" in result.output
        and "--loop" in result.output
    )


def test_cli_refuses_a_folder_that_is_not_a_repository(tmp_path):
    from click.testing import CliRunner

    from toolkit.cli.main import cli

    result = CliRunner().invoke(cli, ["api", "--repo", str(tmp_path)])
    assert (
        result.exit_code == 1
        and "Error:" in result.output
        and "manifest.json" in result.output
        and "toolkit build" in result.output
    )
    assert "OpenAI API on" not in result.output  # refused before claiming to serve


def test_min_tokens_over_max_tokens_is_400(client):
    _assert_openai_error(
        client.post("/v1/chat/completions", json=_chat(max_tokens=4, min_tokens=5)),
        400,
        "min_tokens",
    )
    _assert_openai_error(
        client.post("/v1/chat/completions", json=_chat(max_tokens=4, min_tokens=-1)),
        400,
        "min_tokens",
    )


def test_min_tokens_goes_to_the_engine_contract():
    names = {name for name, _, _ in Sampling(temperature=0, min_tokens=8).tensors(engine=True)}
    assert names == {"runtime_top_k", "min_tokens"}
    assert "min_tokens" not in {name for name, _, _ in Sampling(temperature=0).tensors(engine=True)}


def test_coalesced_pieces_concatenate_to_the_text_and_close_the_source():
    import asyncio

    from toolkit.api.generation import Coalesced

    class SlowBackend(_FakeBackend):
        async def generate(self, *args):
            finished = False
            try:
                for piece in self.pieces:
                    await asyncio.sleep(0.01)
                    yield piece
                finished = True
            finally:
                self.closed_early = not finished

    async def run(early: bool):
        backend = SlowBackend(
            [Piece(w.encode(), i + 1, i == 4) for i, w in enumerate(["a", "", "b", "c", "d"])]
        )
        generation = Generation(_job(max_tokens=5), backend, ApiMetrics())
        pieces = Coalesced(generation.texts())
        out = []
        async for text in pieces:
            assert text  # empty pieces are never sent
            out.append(text)
            if early:
                break
        await pieces.aclose()
        return "".join(out), backend.closed_early

    assert asyncio.run(run(False)) == ("abcd", False)
    text, closed_early = asyncio.run(run(True))
    assert "abcd".startswith(text) and closed_early


# --- cancellation against the engine watchdog ----------------------------------------------------
class _StalledCall:
    """A gRPC stream call that never answers; cancel() ends its iteration as grpc.aio's does (CancelledError)."""

    def __init__(self):
        import asyncio

        self.waiting = asyncio.get_running_loop().create_future()

    async def write(self, request) -> None:
        pass

    async def read(self):
        return await self.waiting

    def cancel(self) -> bool:
        return self.waiting.cancel()


@pytest.mark.parametrize(
    "client_cancels",
    [
        pytest.param(
            True,
            marks=pytest.mark.skipif(
                sys.version_info < (3, 11), reason="Task.cancelling() is Python 3.11+"
            ),
        ),
        False,
    ],
)
def test_a_client_cancel_survives_the_watchdog_failing_the_stream(client_cancels):
    """The watchdog fails a stream (its engine died) as the client's task is cancelled: the task must end
    cancelled, not with EngineFault, or the cancellation is lost; without the client's cancel, EngineFault."""
    import asyncio

    from toolkit.api.triton import EngineFault, TritonBackend

    async def run():
        backend = TritonBackend(UNREACHABLE, "ensemble")
        call = _StalledCall()
        backend._stream_call = lambda metadata: call

        async def consume():
            async for _ in backend.generate("hi", [], 4, Sampling(temperature=0)):
                pass

        task = asyncio.ensure_future(consume())
        while not backend._streams:
            await asyncio.sleep(0)
        backend._engine_failed("Stub process 'tensorrt_llm_0_0' is not healthy.")  # the watchdog
        if client_cancels:
            task.cancel()
        await asyncio.wait([task])
        return task

    task = asyncio.run(run())
    if client_cancels:
        assert task.cancelled(), task.exception()
    else:
        assert isinstance(task.exception(), EngineFault)


# --- finish reasons, pipelined requests, refusals by name, seeds, limits on the command line -----
def test_the_text_models_finish_reason_is_stop_only_when_the_api_can_know():
    """The text models return no token count. "stop": a stop string, a text too short (in bytes) for
    max_tokens tokens, or a re-tokenized count clearly (10 %) under max_tokens; "length" when the count
    is near or at max_tokens (the engine's own tokens may be a few more than the re-tokenization's)."""
    import asyncio

    pieces = [Piece(b"abcdefghij", None, False), Piece(b"klmnopqrst", None, True)]  # 20 bytes

    def finish(max_tokens: int, counted: int, stops=()) -> str:
        _, generation = asyncio.run(
            _run(
                _job(max_tokens=max_tokens, stops=stops),
                _FakeBackend(pieces, engine=False),
                lambda data: counted,
            )
        )
        assert generation.completion_tokens == counted
        return generation.finish_reason

    assert finish(max_tokens=2, counted=2) == "length"  # at max_tokens
    assert finish(max_tokens=20, counted=19) == "length"  # within the margin: maybe cut
    assert finish(max_tokens=20, counted=10) == "stop"  # far under: the engine ended
    assert finish(max_tokens=21, counted=21) == "stop"  # 20 bytes cannot be 21 tokens
    assert finish(max_tokens=2, counted=2, stops=("cd",)) == "stop"  # a stop string ended it


def _bounded_protocol(http: str, app, header_timeout_s: float = 0.2):
    """A bounded uvicorn protocol on a fake transport (what the loop's transport would record)."""
    from uvicorn.config import Config
    from uvicorn.server import ServerState

    from toolkit.api.connection import bounded_protocol

    class Transport:
        def __init__(self):
            self.out = bytearray()
            self.closing = self.paused = False

        def get_extra_info(self, name, default=None):
            return {"peername": ("127.0.0.1", 5555), "sockname": ("127.0.0.1", 9000)}.get(
                name, default
            )

        def write(self, data):
            self.out += data

        def close(self):
            self.closing = True

        abort = close

        def is_closing(self):
            return self.closing

        def pause_reading(self):
            self.paused = True

        def resume_reading(self):
            self.paused = False

        def set_protocol(self, protocol):
            pass

    config = Config(app, http=http)
    config.load()
    protocol = bounded_protocol(http, header_timeout_s=header_timeout_s, send_timeout_s=30)(
        config=config, server_state=ServerState(), app_state={}
    )
    transport = Transport()
    protocol.connection_made(transport)
    return protocol, transport


def _slow_app(release):
    async def app(scope, receive, send):
        await release.wait()  # a generation in progress
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"x"})

    return app


@pytest.mark.parametrize("late", [False, True])
def test_headers_pipelined_during_a_response_are_bounded_in_size_and_time(late):
    """While a request was answered, httptools took the next request's headers without any bound (50 MiB
    here, no 431, no 408). Now they count from their first byte: past 64 KiB, or past --header-timeout, the
    connection is closed (no answer can be written in the middle of another response)."""
    import asyncio

    from toolkit.api.connection import MAX_HEADER_BYTES

    async def run():
        release = asyncio.Event()
        protocol, transport = _bounded_protocol("httptools", _slow_app(release))
        protocol.data_received(b"GET /v1/models HTTP/1.1\r\nhost: x\r\n\r\n")
        await asyncio.sleep(0)
        protocol.data_received(b"GET /v1/models HTTP/1.1\r\nhost: x\r\n")
        fed = 0
        if late:
            protocol.data_received(b"x-slow: a")
            deadline = asyncio.get_running_loop().time() + 5
            while not transport.closing:
                assert asyncio.get_running_loop().time() < deadline, "no header deadline"
                await asyncio.sleep(0.02)
        else:
            line = b"x-pad: " + b"a" * 16384 + b"\r\n"  # reads of 16 KiB
            while not transport.closing and fed < 50 * 2**20:
                protocol.data_received(line)
                fed += len(line)
            assert fed <= MAX_HEADER_BYTES + len(line), fed
        held = sum(len(n) + len(v) for n, v in protocol.headers)
        release.set()
        await asyncio.sleep(0.05)
        return transport, held

    transport, held = asyncio.run(run())
    assert transport.closing and held <= MAX_HEADER_BYTES + 32768
    # Nothing is written into the middle of the first response: it is cut off, then the connection closed.
    assert b"HTTP/1.1 431" not in transport.out and b"HTTP/1.1 408" not in transport.out


@pytest.mark.parametrize("http", ["httptools", "h11"])
def test_a_whole_request_pipelined_during_a_response_is_served_after_it(http):
    """A complete request pipelined behind a slow response is no abuse: reading pauses (h11 at once,
    httptools once its headers are complete) and it is answered after the first, past the header deadline."""
    import asyncio

    async def run():
        release = asyncio.Event()
        protocol, transport = _bounded_protocol(http, _slow_app(release))
        protocol.data_received(b"GET /v1/models HTTP/1.1\r\nhost: x\r\n\r\n")
        await asyncio.sleep(0)
        protocol.data_received(b"GET /v1/models HTTP/1.1\r\nhost: x\r\n\r\n")
        paused = transport.paused
        await asyncio.sleep(0.4)  # past the header deadline: the pipelined request is complete
        release.set()
        for _ in range(100):
            if transport.out.count(b"HTTP/1.1 200") == 2:
                break
            await asyncio.sleep(0.01)
        return paused, transport

    paused, transport = asyncio.run(run())
    assert paused and not transport.closing
    assert transport.out.count(b"HTTP/1.1 200") == 2, bytes(transport.out)


def test_unknown_routes_and_wrong_methods_are_named(client):
    error = _assert_openai_error(client.post("/v1/embeddings", json={}), 404)
    assert error["message"] == "Invalid URL (POST /v1/embeddings)"
    response = client.get("/v1/chat/completions")
    error = _assert_openai_error(response, 405)
    assert "GET" in error["message"] and "POST" in error["message"]
    assert "/v1/chat/completions" in error["message"] and response.headers["allow"] == "POST"


def test_a_body_sent_as_another_content_type_is_told_to_send_json(client):
    body = json.dumps({"model": "Tiny-Test", "prompt": "hello"})
    error = _assert_openai_error(
        client.post("/v1/completions", content=body, headers={"content-type": "text/plain"}), 400
    )
    assert "Content-Type: application/json" in error["message"]
    assert "text/plain" in error["message"]


@pytest.mark.parametrize(
    ("part", "kind"),
    [
        ({"type": "image_url", "image_url": {"url": "http://x/cat.png"}}, "image"),
        ({"type": "input_audio", "input_audio": {"data": "AA==", "format": "wav"}}, "audio"),
    ],
)
def test_image_and_audio_content_parts_are_refused_by_name(client, part, kind):
    messages = [{"role": "user", "content": [{"type": "text", "text": "what is it"}, part]}]
    error = _assert_openai_error(
        client.post("/v1/chat/completions", json=_chat(messages=messages)),
        400,
        "messages.0.content.1",
    )
    assert f"{kind.capitalize()} content is not supported" in error["message"]
    assert error["code"] == "unsupported_content"


def test_a_chat_template_refusal_is_one_sentence_without_a_cli_fix_line(tmp_path):
    repo = _write_tiny_repo(tmp_path)
    config = repo / "preprocessing" / "1" / "tokenizer" / "tokenizer_config.json"
    config.write_text(json.dumps({"eos_token": "<|im_end|>"}))  # no chat template
    with _client(repo) as client:
        error = _assert_openai_error(client.post("/v1/chat/completions", json=_chat()), 400)
    assert "\n" not in error["message"] and "fix:" not in error["message"]
    assert "no chat template" in error["message"] and "/v1/completions" in error["message"]


def test_only_the_repositorys_own_length_messages_are_context_length_errors():
    from toolkit.api.responses import engine_error as _engine_error
    from toolkit.api.triton import InferenceFailed
    from toolkit.repository.sources import common_module

    check = common_module("textcodec").check_request_lengths

    def code_of(message: str) -> tuple[int, str]:
        error = _engine_error(InferenceFailed(message))
        return error.status, error.code

    for args, code in [
        ((0, 4, 8, 8, 16), "invalid_value"),
        ((9, 4, 8, 8, 16), "context_length_exceeded"),
        ((4, 9, 8, 8, 16), "context_length_exceeded"),
    ]:
        with pytest.raises(ValueError) as refused:
            check(*args)
        # as Triton passes it on from an ensemble step
        assert code_of(f"in ensemble 'ensemble', {refused.value}") == (400, code)
    for message in (
        "synthetic engine: parameter token_ids is empty; rebuild the repository with toolkit build",
        "CPU engine: you hit the limit of 3 retries",
    ):
        assert code_of(message) == (502, "engine_error")


@pytest.mark.filterwarnings("error")  # numpy's out-of-bound cast: deprecated, an error in numpy 2.x
def test_a_negative_seed_is_a_signed_64_bit_seed():
    import numpy as np

    seeds = {
        name: value
        for name, value, _ in Sampling(temperature=1, seed=-1).tensors(engine=True)
        if name == "seed"
    }
    assert seeds["seed"].dtype == np.uint64 and int(seeds["seed"][0, 0]) == 2**64 - 1
    seeds = dict((n, v) for n, v, _ in Sampling(temperature=1, seed=-(2**63)).tensors(engine=False))
    assert int(seeds["seed"][0, 0]) == 2**63


def test_seeds_of_the_int64_range_are_accepted(client):
    for seed in (-1, -(2**63), 2**64 - 1):
        # valid: it reaches the (unreachable) Triton
        assert client.post("/v1/chat/completions", json=_chat(seed=seed)).status_code == 503
    for seed in (-(2**63) - 1, 2**64):
        _assert_openai_error(
            client.post("/v1/chat/completions", json=_chat(seed=seed)), 400, "seed"
        )


def test_python_m_toolkit_api_prints_invalid_limits_as_an_error_not_a_traceback(
    tiny_repo, monkeypatch, capsys
):
    import io

    from toolkit.api.__main__ import main

    settings = {
        "triton_url": UNREACHABLE,
        "repo": str(tiny_repo),
        "limits": {"max_body_bytes": 2**20, "body_read_budget_bytes": 2**10},
    }
    monkeypatch.setattr(sys, "stdin", io.StringIO(json.dumps(settings)))
    assert main() == 1
    err = capsys.readouterr().err
    assert err.startswith("Error: ") and "\n  fix: " in err and "--body-read-budget-mib" in err
    assert "Traceback" not in err


def test_cli_refuses_an_engine_http_address_that_is_not_host_port(tiny_repo):
    """--engine-http-url is checked when parsed (before: accepted, then a traceback when the API started),
    the error naming the value and the form; a good one goes through."""
    from click.testing import CliRunner

    from toolkit.cli.main import cli

    for bad in ("localhost", "127.0.0.1:99999", "http://127.0.0.1:8000/v2", ":8000"):
        result = CliRunner().invoke(
            cli, ["api", "--repo", str(tiny_repo), "--engine-http-url", bad, "--dry-run"]
        )
        assert result.exit_code != 0 and repr(bad) in result.output, result.output
        assert "HOST:PORT" in result.output and "--engine-http-url" in result.output
    result = CliRunner().invoke(
        cli,
        ["api", "--repo", str(tiny_repo), "--engine-http-url", "http://[::1]:8000", "--dry-run"],
    )
    assert (
        result.exit_code == 0
        and json.loads(result.output)["engine_http_url"] == "http://[::1]:8000"
    )
