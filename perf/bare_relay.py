"""The floor of a Python front end: the least an OpenAI-style streaming relay on the toolkit's libraries does.

A bare ASGI app on uvicorn (uvloop, httptools: the API's own server settings) that, per POST, reads the
JSON body, opens one grpc.aio ModelStreamInfer call to the engine model (the same engine request the API
sends for a greedy completion with min_tokens, its prompt ids fixed), and writes each engine response
as one SSE chunk with the token's id as its text, then a usage chunk and `[DONE]`. No validation,
admission, tokenizing, detokenizing, metrics, tracing, stop strings or cancellation watch: what is left
is what any Python relay of one gRPC message in and one HTTP chunk out per token pays (grpc's C core
and its threads, the event loop, uvicorn's framing, the socket writes). perf/api_front_end.py
`--measure floor` sets the API beside it on one tritonserver, with the same load.

`--upstream http` reads the engine's responses from Triton's HTTP generate_stream endpoint (its SSE
events, parsed with httptools on a kept-alive connection) instead of gRPC: the same relay with the other
transport tritonserver offers, to tell the transport's share of the floor from the rest.

    python perf/bare_relay.py --grpc-url 127.0.0.1:8001 --port 9000
    python perf/bare_relay.py --upstream http --http-url 127.0.0.1:8000 --port 9000
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import sys
from pathlib import Path

import grpc
import httptools
import numpy as np
import uvicorn
from tritonclient.grpc import service_pb2_grpc

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from toolkit.api.wire import request_message  # noqa: E402

FINAL_FLAG = "triton_final_response"
PROMPT_IDS = [16, 28, 216, 17, 28, 216, 18, 28]  # fixed: tokenizing is not part of the floor


def engine_request(request_id: str, max_tokens: int, end_id: int):
    tensors = [
        ("input_ids", np.array([PROMPT_IDS], np.int32), "INT32"),
        ("input_lengths", np.array([[len(PROMPT_IDS)]], np.int32), "INT32"),
        ("request_output_len", np.array([[max_tokens]], np.int32), "INT32"),
        ("end_id", np.array([[end_id]], np.int32), "INT32"),
        ("pad_id", np.array([[end_id]], np.int32), "INT32"),
        ("streaming", np.array([[True]], bool), "BOOL"),
        ("exclude_input_in_output", np.array([[True]], bool), "BOOL"),
        ("min_tokens", np.array([[max_tokens]], np.int32), "INT32"),
        ("runtime_top_k", np.array([[1]], np.int32), "INT32"),
    ]
    return request_message("tensorrt_llm", request_id, tensors, ["output_ids", "sequence_length"])


SSE_START = {
    "type": "http.response.start",
    "status": 200,
    "headers": [(b"content-type", b"text/event-stream")],
}


async def read_body(receive) -> bytes:
    """An ASGI request's whole body."""
    body = b""
    while True:
        message = await receive()
        body += message.get("body", b"")
        if not message.get("more_body"):
            return body


def generate_body(max_tokens: int, end_id: int) -> bytes:
    """The engine request of engine_request() as the JSON body of Triton's generate extension."""
    return json.dumps(
        {
            "input_ids": PROMPT_IDS,
            "input_lengths": [len(PROMPT_IDS)],
            "request_output_len": [max_tokens],
            "end_id": [end_id],
            "pad_id": [end_id],
            "streaming": [True],
            "exclude_input_in_output": [True],
            "min_tokens": [max_tokens],
            "runtime_top_k": [1],
        }  # fmt: skip
    ).encode()


class _Events:
    """httptools callbacks for one generate_stream response: each SSE event's sequence_length."""

    def __init__(self, on_length) -> None:
        self.buffer = bytearray()
        self.on_length = on_length
        self.done = asyncio.get_running_loop().create_future()

    def on_body(self, data: bytes) -> None:
        self.buffer.extend(data)
        while (end := self.buffer.find(b"\n\n")) >= 0:
            event = bytes(self.buffer[:end])
            del self.buffer[: end + 2]
            if event.startswith(b"data: "):
                self.on_length(int(json.loads(event[6:]).get("sequence_length", 0)))

    def on_message_complete(self) -> None:
        self.done.set_result(None)


def make_http_app(http_url: str, end_id: int):
    """The relay with Triton's HTTP generate_stream as its upstream: one kept-alive connection per
    request in flight, pooled."""
    host, port = http_url.rsplit(":", 1)
    idle: list = []

    async def app(scope, receive, send) -> None:
        if scope["type"] == "lifespan":
            while (await receive())["type"] != "lifespan.shutdown":
                await send({"type": "lifespan.startup.complete"})
            return await send({"type": "lifespan.shutdown.complete"})
        body = await read_body(receive)
        payload = generate_body(int(json.loads(body)["max_tokens"]), end_id)
        await send(SSE_START)
        reader, writer = idle.pop() if idle else await asyncio.open_connection(host, int(port))
        writer.write(
            b"POST /v2/models/tensorrt_llm/generate_stream HTTP/1.1\r\nHost: triton\r\n"
            b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
            % (len(payload), payload)
        )
        chunks: list[bytes] = []
        count = 0

        def on_length(length: int) -> None:
            nonlocal count
            if length:
                count += length
                chunks.append(b'data: {"choices":[{"index":0,"text":"%d"}]}\n\n' % length)

        events = _Events(on_length)
        parser = httptools.HttpResponseParser(events)
        while not events.done.done():
            data = await reader.read(65536)
            if not data:
                raise ConnectionError("tritonserver closed the generate_stream connection")
            parser.feed_data(data)
            for chunk in chunks:  # one SSE chunk per engine response, as the gRPC side writes
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            chunks.clear()
        idle.append((reader, writer))
        usage = b'data: {"choices":[],"usage":{"completion_tokens":%d}}\n\ndata: [DONE]\n\n' % count
        await send({"type": "http.response.body", "body": usage})

    return app


def make_app(grpc_url: str, end_id: int):
    state: dict = {}
    ids = itertools.count(1)

    async def lifespan(receive, send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                state["channel"] = grpc.aio.insecure_channel(grpc_url)
                state["stub"] = service_pb2_grpc.GRPCInferenceServiceStub(state["channel"])
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await state["channel"].close()
                await send({"type": "lifespan.shutdown.complete"})
                return

    async def app(scope, receive, send) -> None:
        if scope["type"] == "lifespan":
            return await lifespan(receive, send)
        body = await read_body(receive)
        max_tokens = int(json.loads(body)["max_tokens"])
        await send(SSE_START)
        call = state["stub"].ModelStreamInfer()
        await call.write(engine_request(str(next(ids)), max_tokens, end_id))
        count = 0
        while (response := await call.read()) is not grpc.aio.EOF:
            infer = response.infer_response
            for output, raw in zip(infer.outputs, infer.raw_output_contents, strict=False):
                if output.name == "sequence_length":
                    length = int.from_bytes(raw[:4], "little")
                    if length:
                        count += length
                        chunk = b'data: {"choices":[{"index":0,"text":"%d"}]}\n\n' % length
                        await send({"type": "http.response.body", "body": chunk, "more_body": True})
            if FINAL_FLAG in infer.parameters and infer.parameters[FINAL_FLAG].bool_param:
                break
        await call.done_writing()
        usage = b'data: {"choices":[],"usage":{"completion_tokens":%d}}\n\ndata: [DONE]\n\n' % count
        await send({"type": "http.response.body", "body": usage})

    return app


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--upstream", choices=("grpc", "http"), default="grpc")
    parser.add_argument("--grpc-url", help="tritonserver's gRPC address (--upstream grpc)")
    parser.add_argument("--http-url", help="tritonserver's HTTP address (--upstream http)")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--end-id", type=int, default=2)
    args = parser.parse_args()
    url = args.grpc_url if args.upstream == "grpc" else args.http_url
    if not url:
        parser.error(f"--upstream {args.upstream} needs --{args.upstream}-url HOST:PORT")
    uvicorn.run(
        (make_app if args.upstream == "grpc" else make_http_app)(url, args.end_id),
        host="127.0.0.1",
        port=args.port,
        loop="uvloop",
        http="httptools",
        log_level="warning",
        access_log=False,
    )


if __name__ == "__main__":
    main()
