"""The API's per-token path: SSE text chunks from byte templates, engine responses read from the protobuf,
the gRPC stream closed as Triton needs it (half-closed when finished, cancelled when not)."""

from __future__ import annotations

import asyncio
import json

import numpy as np
import pytest
from tritonclient.grpc import service_pb2

from toolkit.api.features import Features
from toolkit.api.generation import Delta, Job, SseFormatter
from toolkit.api.triton import TRACEPARENT_GUARD, Sampling, TritonBackend

UNREACHABLE = "127.0.0.1:1"
TEXTS = [
    "",
    " hello",
    'quote " back \\ slash',
    "new\nline\ttab \x00\x1f",
    "日本語 é \u2028",
    "\ud7ff",
]


def _job(kind: str, include_usage: bool, first_index: int = 0) -> Job:
    return Job(
        id="cmpl-7",
        kind=kind,
        model='odd "model" \x00 name',  # the template split must not be fooled by the model's name
        prompt="p",
        prompt_ids=[1],
        prompt_tokens=1,
        max_tokens=4,
        sampling=Sampling(),
        stops=(),
        include_usage=include_usage,
        first_index=first_index,
    )


def _expected(job: Job, index: int, text: str) -> dict:
    choice: dict = {"index": index}
    if job.kind == "chat":
        choice["delta"] = {"content": text}
    else:
        choice["text"] = text
    choice.update({"logprobs": None, "finish_reason": None})
    body = {
        "id": job.id,
        "created": job.created,
        "model": job.model,
        "object": "chat.completion.chunk" if job.kind == "chat" else "text_completion",
        "choices": [choice],
    }
    if job.include_usage:
        body["usage"] = None
    return body


@pytest.mark.parametrize("kind", ["chat", "completion"])
@pytest.mark.parametrize("include_usage", [True, False])
@pytest.mark.parametrize("index", [0, 3])
def test_a_text_chunk_from_its_template_is_the_json_of_the_whole_chunk(kind, include_usage, index):
    """Byte for byte what json.dumps(ensure_ascii=False, compact) makes of the whole chunk, for every
    choice index (each gets its own template) and texts that need escaping."""
    job = _job(kind, include_usage)
    sse = SseFormatter(job, choices=4)
    for text in TEXTS:
        chunk = sse.delta(Delta(index, text))
        body = _expected(job, index, text)
        whole = json.dumps(body, ensure_ascii=False, separators=(",", ":"))
        assert chunk == f"data: {whole}\n\n".encode(), text
        assert json.loads(chunk[len(b"data: ") :]) == body


# --- the engine contract's responses, read from the protobuf ---------------------------------------------
class _Decoder:
    def decode_bytes(self, ids) -> bytes:
        return b"".join(b"<%d>" % i for i in ids)


def _response(tokens: list[int], final: bool, **extra_int32: int):
    response = service_pb2.ModelInferResponse(model_name="tensorrt_llm", id="api-1")
    response.parameters["triton_final_response"].bool_param = final
    outputs = {
        "output_ids": tokens,
        "sequence_length": [len(tokens)],
        **{k: [v] for k, v in extra_int32.items()},
    }
    for name, values in outputs.items():
        output = response.outputs.add(name=name, datatype="INT32")
        output.shape.extend([1, 1, len(values)] if name == "output_ids" else [1, 1])
        response.raw_output_contents.append(
            b"".join(v.to_bytes(4, "little", signed=True) for v in values)
        )
    return response


def _backend() -> TritonBackend:
    from toolkit.model.tokens import TokenFacts

    tokens = TokenFacts(end_id=2, pad_id=2, bos_id=1, stop_ids=(), add_special_tokens=True)
    return TritonBackend(UNREACHABLE, decoder=_Decoder(), tokens=tokens)


def test_engine_responses_give_their_tokens_bytes_choice_and_final_flag():
    backend = _backend()
    features = Features(cached_tokens=False)
    one = backend._engine_piece(_response([17], False), 4, features)
    assert (one.data, one.tokens, one.output_tokens, one.final, one.index) == (
        b"<17>",
        (17,),
        5,
        False,
        0,
    )
    several = backend._engine_piece(_response([5, 6, 7], True, sequence_index=2), 0, features)
    assert (several.data, several.tokens, several.output_tokens, several.final, several.index) == (
        b"<5><6><7>",
        (5, 6, 7),
        3,
        True,
        2,
    )
    reused = backend._engine_piece(_response([], True, kv_cache_reused_blocks=3), 9, features)
    assert (reused.data, reused.output_tokens, reused.final, reused.reused_blocks) == (
        b"",
        9,
        True,
        3,
    )


# --- the gRPC stream's end -------------------------------------------------------------------------------
class _Call:
    """A ModelStreamInfer call (reader/writer style) answering the given responses, recording its end."""

    def __init__(self, responses):
        import grpc

        self.responses = [service_pb2.ModelStreamInferResponse(infer_response=r) for r in responses]
        self.eof = grpc.aio.EOF
        self.written: list = []
        self.cancelled = self.half_closed = False

    async def write(self, request) -> None:
        self.written.append(request)

    async def read(self):
        await asyncio.sleep(0)
        return self.responses.pop(0) if self.responses else self.eof

    async def done_writing(self) -> None:
        self.half_closed = True

    def cancel(self) -> bool:
        self.cancelled = True
        return True


def _stream(call: _Call, read_all: bool, traceparent: str | None = None) -> list:
    async def run():
        backend = _backend()
        metadata = []
        backend._stream_call = lambda m: metadata.append(m) or call
        pieces = backend.generate("p", [1, 2], 4, Sampling(temperature=0), traceparent=traceparent)
        got = []
        async for piece in pieces:
            got.append(piece)
            if not read_all:
                break
        await pieces.aclose()
        await asyncio.sleep(0)  # the half-close runs in the background
        await asyncio.sleep(0)
        return got, metadata

    return asyncio.run(run())


def test_a_finished_stream_is_half_closed_not_cancelled():
    """Triton keeps a stream open until the client closes its side: a finished generation closes it (its
    request counted done, not cancelled); the request was written once, with the trace context."""
    call = _Call([_response([3], False), _response([4], True)])
    (pieces, metadata) = _stream(
        call, read_all=True, traceparent="00-" + "1" * 32 + "-" + "2" * 16 + "-01"
    )
    assert [p.tokens for p in pieces] == [(3,), (4,)]
    assert call.half_closed and not call.cancelled
    assert len(call.written) == 1 and call.written[0].model_name == "tensorrt_llm"
    assert call.written[0].parameters["traceparent"].string_param.startswith("00-111")
    assert metadata[0][0] == ("traceparent", "00-" + "1" * 32 + "-" + "2" * 16 + "-01")


def test_the_grpc_trace_context_is_followed_by_a_guard_entry():
    """tritonserver (2.51, and main as of 2026-12) reads a gRPC metadata value as a C string: its
    GrpcServerCarrier::Get returns string_ref.data(), which is not NUL-terminated, so the bytes after
    `traceparent` joined it, the W3C length check (55 characters) failed, and Triton traced nothing of
    that request: 18 of 600 traced gRPC requests had no Triton span, 2 of 600 with the guard
    (perf/results/grpc_trace_context.md). Another entry right after it, which Triton never reads,
    puts its encoding's first byte, 0, behind the value wherever gRPC does not copy the value."""
    traceparent = "00-" + "1" * 32 + "-" + "2" * 16 + "-01"
    call = _Call([_response([4], True)])
    _, metadata = _stream(call, read_all=True, traceparent=traceparent)
    assert metadata == [(("traceparent", traceparent), TRACEPARENT_GUARD)]
    key, _ = TRACEPARENT_GUARD
    # a key Triton's propagators never read
    assert key not in ("traceparent", "tracestate", "baggage")


def test_a_stream_closed_before_its_final_response_is_cancelled():
    call = _Call([_response([3], False), _response([4], True)])
    pieces, metadata = _stream(call, read_all=False)
    assert [p.tokens for p in pieces] == [(3,)]
    assert call.cancelled and not call.half_closed
    assert metadata == [None]


# --- the request, built straight from the arrays --------------------------------------------------------
@pytest.mark.parametrize("engine", [True, False])
def test_the_request_protobuf_is_the_one_tritonclient_builds(engine):
    """The same inputs, raw contents, outputs and parameters as tritonclient's InferInput path (which the
    backend used before), for the engine contract (with log probs asked) and the text one (BYTES)."""
    import tritonclient.grpc as grpcclient
    from tritonclient.grpc._utils import _get_inference_request

    from toolkit.client.tensors import infer_inputs

    backend = _backend() if engine else TritonBackend(UNREACHABLE, "ensemble")
    sampling = Sampling(temperature=0.7, seed=5, min_tokens=2, presence_penalty=0.5)
    features = (
        Features(cached_tokens=False, logprobs=True, top_logprobs=2)
        if engine
        else Features(cached_tokens=False)
    )
    captured = {}
    backend._request = lambda tensors, outputs, real=backend._request: (
        captured.update(t=tensors, o=outputs) or real(tensors, outputs)
    )
    if engine:
        request = backend._engine_request([1, 2, 3], 8, sampling, features)
    else:
        request = backend._text_request("hé llo", 8, sampling, features)
    expected = _get_inference_request(
        model_name=backend.model_name, inputs=infer_inputs(captured["t"]), model_version="",
        request_id=request.id, sequence_id=0, sequence_start=False, sequence_end=False, priority=0,
        timeout=None, parameters={"triton_enable_empty_final_response": True},
        outputs=[grpcclient.InferRequestedOutput(name) for name in captured["o"]] if captured["o"] else None,
    )  # fmt: skip
    assert request == expected
    assert len(request.inputs) > 5


def test_an_input_of_another_dtype_than_declared_is_refused():
    from toolkit.api.wire import raw_tensor
    from toolkit.errors import ClientError

    with pytest.raises(ClientError, match="`input_ids` input is int64 but declared INT32"):
        raw_tensor("input_ids", np.array([[1, 2]], np.int64), "INT32")


def test_top_logprobs_from_generation_logits_equal_a_log_softmax():
    """The GPU's top log probs come from its generation logits: the top ids in order and their log
    softmax, as a full sort of the vocabulary gives them (now without sorting it)."""
    import numpy as np

    from toolkit.api.features import _alternatives

    rng = np.random.default_rng(3)
    logits = rng.normal(size=(1, 1, 1, 5000)).astype(np.float32) * 4
    found = _alternatives({"generation_logits": logits}, 1, 5)[0]
    row = logits.reshape(-1).astype(np.float64)
    reference = row - np.log(np.exp(row - row.max()).sum()) - row.max()
    expected = np.argsort(-reference)[:5]
    assert [i for i, _ in found] == [int(i) for i in expected]
    assert np.allclose([v for _, v in found], reference[expected], atol=1e-4)


# --- --stream-interval ----------------------------------------------------------------------------------
@pytest.mark.parametrize("by_engine", [True, False])
def test_a_stream_interval_goes_to_an_engine_that_honours_it_else_the_api_holds_responses(
    by_engine,
):
    from toolkit.model.tokens import TokenFacts

    tokens = TokenFacts(end_id=2, pad_id=2, bos_id=1, stop_ids=(), add_special_tokens=True)
    backend = TritonBackend(
        UNREACHABLE,
        decoder=_Decoder(),
        tokens=tokens,
        stream_interval=4,
        engine_stream_interval=by_engine,
    )
    assert (backend.engine_interval(False), backend.hold(False)) == (
        (4, 1) if by_engine else (1, 4)
    )
    # A request with stop strings gets every token from the engine (the API cuts them between tokens).
    assert (backend.engine_interval(True), backend.hold(True)) == (1, 4)

    def sent(stops: bool):
        call = _Call([_response([3], False), _response([4, 5, 6], True)])

        async def run():
            backend._stream_call = lambda metadata: call
            pieces = backend.generate("p", [1, 2], 4, Sampling(temperature=0), stops=stops)
            return [p async for p in pieces]

        assert [p.tokens for p in asyncio.run(run())] == [(3,), (4, 5, 6)]
        return call.written[0].parameters

    if by_engine:
        assert sent(stops=False)["stream_interval"].int64_param == 4
    else:
        assert "stream_interval" not in sent(stops=False)
    assert "stream_interval" not in sent(stops=True)


def _coalesced(hold: int, count: int, error: Exception | None = None) -> list:
    """The items Coalesced(hold) gives for `count` one-token deltas arriving 1 ms apart (and then `error`)."""
    from toolkit.api.generation import Coalesced

    async def source():
        for i in range(count):
            await asyncio.sleep(0.001)
            yield Delta(0, f"<{i}>")
        if error is not None:
            raise error

    async def run():
        pieces = Coalesced(source(), hold)
        got: list = []
        try:
            async for batch in pieces:
                got.append("".join(d.text for d in batch))
        except RuntimeError as exc:
            got.append(exc)
        await pieces.aclose()
        return got

    return asyncio.run(run())


def test_the_api_holds_each_chunk_until_the_stream_interval_has_arrived_and_loses_nothing():
    held = _coalesced(hold=4, count=10)
    assert held == ["<0><1><2><3>", "<4><5><6><7>", "<8><9>"]
    # Without a hold, deltas 1 ms apart go one per chunk.
    assert _coalesced(hold=1, count=5) == ["<0>", "<1>", "<2>", "<3>", "<4>"]
    # An error after some text: the text first, then the error.
    failure = RuntimeError("engine gone")
    assert _coalesced(hold=4, count=2, error=failure) == ["<0><1>", failure]


def test_the_hold_counts_every_choice_and_is_one_where_the_engine_keeps_the_interval():
    from toolkit.api.responses import _hold

    # n = 3 at --stream-interval 4 on a GPU engine: 4 steps of 3 choices each
    assert _hold(4, 3) == 12
    # the engine answers every interval itself (backend.hold 1): write whatever has come, for any n
    assert _hold(1, 3) == 1


@pytest.mark.parametrize("value", [0, 1025, True, 2.0])
def test_api_settings_refuse_a_stream_interval_outside_1_to_1024_naming_it(value, tmp_path):
    """The settings' own check: `python -m toolkit.api` and library users pass no click range."""
    from toolkit.api.state import ApiSettings
    from toolkit.errors import ToolkitError

    with pytest.raises(ToolkitError, match=r"from 1 to 1024, not " + repr(value)):
        ApiSettings("127.0.0.1:1", tmp_path, stream_interval=value)
