"""--engine-transport http: the OpenAI API reading the engine over Triton's HTTP generate_stream.

The session's real tritonserver on the CPU repository: the same requests through an API on each transport
give the same greedy text and usage; a client gone mid-stream cancels the engine request as over gRPC; the
engine's own errors and an unreachable port come back as they do there; log probs stay on gRPC.
"""

from __future__ import annotations

import asyncio
import re

import httpx
import numpy as np
import psutil
import pytest
from test_api_openai import COUNTING, disconnect_mid_stream

from toolkit.api import ApiSettings, run_api_in_background
from toolkit.api.engine_http import HttpEngineError, HttpEnginePool, _Response, request_body
from toolkit.api.triton import InferenceFailed, Sampling, TritonBackend, TritonUnavailable
from toolkit.repository.reader import open_repository
from toolkit.serve.net import free_port

from sse_events import chunk_text, sse_events

pytestmark = pytest.mark.server

MESSAGES = [{"role": "user", "content": "Name three colours."}]


@pytest.fixture(scope="module")
def api_options(served_repo) -> dict:
    """conftest's `api`, reading the engine over Triton's HTTP port."""
    return {"engine_http_url": served_repo.http_url}


@pytest.fixture(scope="module")
def grpc_api(served_repo):
    handle = run_api_in_background(
        ApiSettings(served_repo.grpc_url, served_repo.repo), port=free_port()
    )
    yield handle
    handle.stop()


def _stream(url: str, body: dict) -> tuple[str, dict, int]:
    """A streamed completion's text, its usage, and how many chunks carried text."""
    with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=120) as response:
        assert response.status_code == 200, response.read()
        events = [e for e in sse_events(response.iter_lines()) if isinstance(e, dict)]
    chunks = [e for e in events if e.get("choices")]
    usage = next(e["usage"] for e in events if e.get("usage"))
    return "".join(chunk_text(e) for e in chunks), usage, sum(1 for e in chunks if chunk_text(e))


def test_the_http_transport_answers_as_grpc_does(api, grpc_api, served_repo, model_id):
    """Greedy: streamed and whole completions, chat, n = 2 (sequence_index) and stop strings give the same
    text, usage and finish reasons on both transports, and the HTTP one's requests went over HTTP."""
    stream = {"model": model_id, "prompt": COUNTING, "max_tokens": 24, "temperature": 0, "stream": True,
              "stream_options": {"include_usage": True}}  # fmt: skip
    text, usage, chunks = _stream(api.url, stream)
    assert (text, usage) == _stream(grpc_api.url, stream)[:2]
    assert (
        usage["completion_tokens"] == 24 and chunks >= 20
    )  # one chunk per token, not one at the end
    bodies = [
        ("completions", {"prompt": COUNTING, "max_tokens": 16, "temperature": 0}),
        ("completions", {"prompt": COUNTING, "max_tokens": 16, "temperature": 0, "stop": ["17"]}),
        ("completions", {"prompt": COUNTING, "max_tokens": 8, "temperature": 0, "n": 2}),
        ("chat/completions", {"messages": MESSAGES, "max_tokens": 16, "temperature": 0}),
    ]
    for path, body in bodies:
        answers = []
        for url in (api.url, grpc_api.url):
            response = httpx.post(f"{url}/v1/{path}", json={"model": model_id, **body}, timeout=120)
            assert response.status_code == 200, response.text
            got = response.json()
            answers.append(
                (
                    [
                        (c.get("text") or c.get("message", {}).get("content"), c["finish_reason"])
                        for c in got["choices"]
                    ],
                    {k: got["usage"][k] for k in ("prompt_tokens", "completion_tokens")},
                )
            )
        assert answers[0] == answers[1], (path, body)
    assert len(answers[0][0]) == 1 and answers[0][1]["completion_tokens"] == 16
    # The HTTP transport keeps its connections to Triton's HTTP port open for the next requests.
    port = int(served_repo.http_url.rsplit(":", 1)[1])
    kept = [
        c for c in psutil.Process().net_connections("tcp")
        if c.raddr and c.raddr.port == port and c.status == psutil.CONN_ESTABLISHED
    ]  # fmt: skip
    assert kept, "no connection to Triton's HTTP port: the requests did not go over generate_stream"


def test_a_client_gone_mid_stream_cancels_the_engine_request_over_http(api, served_repo, model_id):
    """Closing the API's stream closes its generate_stream connection: Triton cancels the request and the
    engine stops generating for it, as the gRPC transport's cancellation does."""
    disconnect_mid_stream(served_repo, api.url, model_id)
    after = httpx.post(
        f"{api.url}/v1/completions",
        json={"model": model_id, "prompt": COUNTING, "max_tokens": 4, "temperature": 0},
        timeout=60,
    )
    assert after.status_code == 200 and after.json()["usage"]["completion_tokens"] == 4


def test_log_probs_go_over_grpc_and_still_come_back(api, model_id):
    response = httpx.post(
        f"{api.url}/v1/completions",
        json={
            "model": model_id,
            "prompt": COUNTING,
            "max_tokens": 4,
            "temperature": 0,
            "logprobs": 2,
        },
        timeout=60,
    )
    assert response.status_code == 200, response.text
    logprobs = response.json()["choices"][0]["logprobs"]
    assert len(logprobs["token_logprobs"]) == 4 and all(v <= 0 for v in logprobs["token_logprobs"])


def _backend(served_repo, http_url: str | None, tokens=None) -> TritonBackend:
    """A backend on the served repository (its TokenFacts, or `tokens`); over HTTP with `http_url`."""
    repository = open_repository(served_repo.repo)
    from toolkit.api.prompt import PromptCodec

    return TritonBackend(
        served_repo.grpc_url, decoder=PromptCodec(repository), tokens=tokens or repository.tokens,
        engine_http_url=http_url, vocab_size=repository.manifest.model.facts.vocab_size,
    )  # fmt: skip


def test_the_engines_own_error_and_an_unreachable_port_come_back_as_over_grpc(served_repo):
    """The engine refusing a request (an SSE error event) is InferenceFailed with its message; a port
    nobody listens on is TritonUnavailable naming it."""

    async def run(http_url: str, max_tokens: int):
        backend = _backend(served_repo, http_url)
        await backend.start()
        try:
            return [
                p async for p in backend.generate("", [16, 28], max_tokens, Sampling(temperature=0))
            ]
        finally:
            await backend.close()

    with pytest.raises(InferenceFailed, match="request_output_len"):
        asyncio.run(run(served_repo.http_url, 0))
    dead = f"127.0.0.1:{free_port()}"
    with pytest.raises(TritonUnavailable, match=dead):
        asyncio.run(run(dead, 2))
    pieces = asyncio.run(run(served_repo.http_url, 3))
    assert sum(len(p.tokens) for p in pieces) == 3 and pieces[-1].final


def test_health_says_so_when_the_http_port_the_streams_go_over_does_not_answer(served_repo):
    """Every completion was a 503 naming the HTTP port while /health answered ok: it checked gRPC
    only. Now the port the streams are read over is checked too (Triton's own readiness check)."""

    async def health(http_url: str) -> str | None:
        backend = _backend(served_repo, http_url)
        await backend.start()
        try:
            return await backend.health()
        finally:
            await backend.close()

    assert asyncio.run(health(served_repo.http_url)) is None
    dead = f"127.0.0.1:{free_port()}"
    said = asyncio.run(health(dead))
    assert said is not None and dead in said and "takes no connection" in said
    # a port that answers, but not as Triton: its readiness check is no 200
    grpc_port = served_repo.grpc_url
    said = asyncio.run(health(grpc_port))
    assert said is not None and grpc_port in said


def test_events_split_anywhere_across_reads_parse_the_same():
    """Triton's chunked SSE arrives in arbitrary pieces: any split gives the same events."""
    body = b'data: {"output_ids":7,"sequence_length":1}\n\ndata: {"output_ids":[8,9],"sequence_length":2}\n\n'
    chunked = b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body)
    raw = (
        b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
        + chunked
    )
    for split in range(1, len(raw)):
        response = _Response()
        response.parser.feed_data(raw[:split])
        response.parser.feed_data(raw[split:])
        assert response.complete and response.status == 200
        assert [e["output_ids"] for e in response.events] == [7, [8, 9]]


def test_a_request_body_carries_each_tensor_as_its_items_values_flat():
    tensors = [
        ("input_ids", np.array([[1, 2, 3]], np.int32), "INT32"),
        ("streaming", np.array([[True]], bool), "BOOL"),
        ("stop_words_list", np.array([[[2, 5], [1, 2]]], np.int32), "INT32"),
        ("guided_decoding_guide", np.array([[b"{}"]], dtype=object), "BYTES"),
    ]
    assert request_body(tensors, {"stream_interval": 4}) == (
        b'{"input_ids":[1,2,3],"streaming":[true],"stop_words_list":[2,5,1,2],'
        b'"guided_decoding_guide":["{}"],"parameters":{"stream_interval":4}}'
    )
    with pytest.raises(ValueError, match="HOST:PORT"):
        HttpEnginePool("localhost")


EVENT = b'data: {"output_ids":7,"sequence_length":1}\n\n'
SSE_ANSWER = (
    b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
    b"%x\r\n%s\r\n0\r\n\r\n" % (len(EVENT), EVENT)
)


def test_a_kept_connection_triton_closed_is_retried_once_on_a_fresh_one():
    """Triton may close an idle kept-alive connection just as the pool sends a request on it: the request
    never reached the model, so it goes again on a new connection. A new connection closed unanswered
    is Triton's failure: HttpEngineError, not a retry loop."""

    async def run(close_on: set[int]) -> tuple[list, list, int]:
        seen: list[int] = []  # the connection each request came on

        async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            connection = max(seen, default=-1) + 1
            while not reader.at_eof():
                try:
                    head = await reader.readuntil(b"\r\n\r\n")
                except asyncio.IncompleteReadError:
                    return  # the client closed it
                request = len(seen)
                seen.append(connection)
                length = re.search(rb"(?i)content-length: *(\d+)", head)
                await reader.readexactly(int(length.group(1)))
                if request in close_on:
                    writer.transport.abort()
                    return
                writer.write(SSE_ANSWER)
                await writer.drain()

        server = await asyncio.start_server(serve, "127.0.0.1", 0)
        pool = HttpEnginePool(f"127.0.0.1:{server.sockets[0].getsockname()[1]}")
        answers, failures = [], 0
        try:
            for _ in range(3):
                try:
                    answers.append([e async for e in pool.stream("m", b"{}").events()])
                except HttpEngineError:
                    failures += 1
        finally:
            await pool.close()
            server.close()
        return answers, seen, failures

    # the second request lands on the kept connection, which Triton closes: it goes again on a new one
    answers, seen, failures = asyncio.run(run({1}))
    assert answers == [[{"output_ids": 7, "sequence_length": 1}]] * 3 and failures == 0
    assert seen == [0, 0, 1, 1]
    # the very first connection closes unanswered: no retry, an error; the next request is served
    answers, seen, failures = asyncio.run(run({0}))
    assert failures == 1 and len(answers) == 2 and seen == [0, 1, 1]


def test_a_malformed_answer_is_an_engine_error_naming_it():
    """What is not HTTP (a proxy's garbage, a broken chunk) ends the stream as HttpEngineError, which
    the API answers as Triton unavailable, not as an unhandled parser exception."""

    async def run(answer: bytes) -> None:
        async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await reader.readuntil(b"\r\n\r\n")
            writer.write(answer)
            await writer.drain()
            await reader.read()  # until the client closes it

        server = await asyncio.start_server(serve, "127.0.0.1", 0)
        pool = HttpEnginePool(f"127.0.0.1:{server.sockets[0].getsockname()[1]}")
        try:
            [e async for e in pool.stream("m", b"").events()]
        finally:
            await pool.close()
            server.close()

    for answer in (
        b"SSH-2.0-OpenSSH_9.6\r\n",
        SSE_ANSWER.replace(b"0\r\n\r\n", b"zz\r\n"),
        SSE_ANSWER.replace(b'{"output_ids":7', b'{"output_ids":?'),  # an event that is not JSON
    ):
        with pytest.raises(HttpEngineError, match="not a valid generate_stream answer"):
            asyncio.run(run(answer))


def test_stop_words_of_several_tokens_stop_the_engine_as_over_grpc(served_repo):
    """The model's end tokens go to the engine as stop_words_list ([1, 2, N]). Triton's generate
    extension counts a tensor's elements by its JSON array's top-level length, so a nested [2, N] of
    more than one stop token was refused ("Shape does not match"; the bigram repositories' two end
    tokens hit it): both transports stop at the same token, on two stop ids."""
    from dataclasses import replace

    repository = open_repository(served_repo.repo)

    async def run(http_url: str | None, stop_ids: tuple[int, ...]) -> list[int]:
        backend = _backend(served_repo, http_url, replace(repository.tokens, stop_ids=stop_ids))
        await backend.start()
        try:
            pieces = [
                p async for p in backend.generate("", [16, 28, 17], 16, Sampling(temperature=0))
            ]
        finally:
            await backend.close()
        return [t for p in pieces for t in p.tokens]

    free = asyncio.run(run(None, ()))
    assert len(free) == 16
    stops = (free[6], free[9])
    over_grpc = asyncio.run(run(None, stops))
    assert len(over_grpc) < 16  # the engine stopped early on the stop ids
    assert asyncio.run(run(served_repo.http_url, stops)) == over_grpc
