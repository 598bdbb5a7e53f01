"""The API's own Python work per streamed token, in one process, without Triton, sockets or HTTP parsing.

The whole app (create_app on a synthetic repository: the gate, FastAPI's routing, validation,
tokenizing, Generation, Coalesced, the SSE formatter, Starlette's streaming response) is driven
through ASGI directly; its gRPC stub is a fake that answers every request with --output-tokens
engine responses of one token each (real ModelStreamInferResponse protobufs, one event-loop turn
apart, as a completion of grpc.aio's arrives). What it leaves out is the same for every tree:
grpc's C core and its threads, the socket writes, uvicorn's HTTP parsing and chunked framing
(perf/api_front_end.py measures the whole process). CPU seconds of this process per streamed token,
the minimum over --repeats (the least disturbed by other work on the machine), per tree; trees
alternate, each in a process of its own.

    git archive REV | tar -x -C /tmp/old
    python perf/api_token_path.py --baseline-tree /tmp/old --repo REPO --out perf/results/api_token_path
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

PROMPT = "1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12,"


def fake_stub(tokens: int):
    """A GRPCInferenceServiceStub stand-in whose ModelStreamInfer calls answer `tokens` responses."""
    from tritonclient.grpc import service_pb2

    def response(token: int, final: bool):
        message = service_pb2.ModelStreamInferResponse()
        infer = message.infer_response
        infer.model_name, infer.model_version, infer.id = "tensorrt_llm", "1", "api-1"
        infer.parameters["triton_final_response"].bool_param = final
        for name, shape in (("output_ids", [1, 1, 1]), ("sequence_length", [1, 1])):
            output = infer.outputs.add(name=name, datatype="INT32")
            output.shape.extend(shape)
        infer.raw_output_contents.append(token.to_bytes(4, "little"))
        infer.raw_output_contents.append((1).to_bytes(4, "little"))
        return message.SerializeToString()

    # serialized once; parsed per read, as grpc.aio deserializes each message it receives
    wire = [response(100 + i % 100, i == tokens - 1) for i in range(tokens)]
    parse = service_pb2.ModelStreamInferResponse.FromString

    class Call:
        """Both styles of grpc.aio's stream call: a request iterator and async iteration (tritonclient's
        stream_infer), or write/read/done_writing."""

        def __init__(self, requests=None):
            self.next = 0
            self.feeder = None
            if requests is not None:  # as grpc.aio does: a task consumes the request iterator
                self.feeder = asyncio.ensure_future(self._consume(requests))

        @staticmethod
        async def _consume(requests):
            async for _ in requests:
                pass

        async def write(self, request) -> None:
            request.SerializeToString()

        async def read(self):
            import grpc

            await asyncio.sleep(0)  # one loop turn per message, as a grpc.aio completion
            if self.next >= len(wire):
                return grpc.aio.EOF
            self.next += 1
            return parse(wire[self.next - 1])

        def __aiter__(self):
            return self

        async def __anext__(self):
            import grpc

            message = await self.read()
            if message is grpc.aio.EOF:
                raise StopAsyncIteration
            return message

        async def done_writing(self) -> None:
            pass

        def cancel(self) -> bool:
            if self.feeder is not None:
                self.feeder.cancel()
            return True

    class Stub:
        def ModelStreamInfer(self, requests=None, **_):  # noqa: N802 - the generated stub's name
            return Call(requests)

    return Stub()


async def one_request(app, body: bytes) -> int:
    """POST /v1/completions through the ASGI app; the bytes of its event stream."""
    scope = {
        "type": "http", "asgi": {"version": "3.0", "spec_version": "2.3"}, "http_version": "1.1",
        "method": "POST", "scheme": "http", "path": "/v1/completions", "raw_path": b"/v1/completions",
        "query_string": b"", "root_path": "", "client": ("127.0.0.1", 1), "server": ("127.0.0.1", 9),
        "headers": [(b"host", b"api"), (b"content-type", b"application/json"),
                    (b"content-length", str(len(body)).encode())],
    }  # fmt: skip
    sent = [False]
    out = [0]

    async def receive():
        if not sent[0]:
            sent[0] = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await asyncio.get_running_loop().create_future()  # no disconnect, ever

    async def send(message):
        if message["type"] == "http.response.body":
            out[0] += len(message.get("body", b""))

    await app(scope, receive, send)
    return out[0]


async def load(repo: Path, streams: int, per_stream: int, tokens: int, repeats: int) -> dict:
    from toolkit.api.app import ApiSettings, create_app
    from toolkit.repository.reader import open_repository

    app = create_app(ApiSettings("127.0.0.1:1", repo, max_in_flight=4096))
    backend = app.state.api.backend
    await backend.start()
    stub = fake_stub(tokens)
    if getattr(backend, "_stub", None) is not None:
        backend._stub = stub  # this tree: the streams' own stub
    else:
        backend._client._client_stub = stub  # older trees: tritonclient's stream_infer
    body = json.dumps({
        "model": open_repository(repo).served_model_name, "prompt": PROMPT, "max_tokens": tokens,
        "min_tokens": tokens, "temperature": 0, "stream": True, "stream_options": {"include_usage": True},
    }).encode()  # fmt: skip

    async def stream():
        for _ in range(per_stream):
            await one_request(app, body)

    await asyncio.gather(*(stream() for _ in range(4)))  # warm-up
    per_token = []
    for _ in range(repeats):
        start = time.process_time()
        await asyncio.gather(*(stream() for _ in range(streams)))
        per_token.append(1e6 * (time.process_time() - start) / (streams * per_stream * tokens))
    await backend.close()
    return {"us_per_token_min": min(per_token), "us_per_token_median": statistics.median(per_token)}


def side(tree: Path, args) -> dict:
    """One measurement in a process of its own, with the toolkit imported from `tree`."""
    env = {**os.environ, "PYTHONPATH": str(tree)}
    command = [sys.executable, str(Path(__file__).resolve()), "--child", "--repo", str(args.repo),
               "--streams", str(args.streams), "--requests-per-stream", str(args.requests_per_stream),
               "--output-tokens", str(args.output_tokens), "--repeats", str(args.repeats)]  # fmt: skip
    done = subprocess.run(command, env=env, check=True, capture_output=True, text=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--repo", type=Path, required=True, help="a synthetic repository")
    parser.add_argument("--baseline-tree", type=Path, help="an older copy of the toolkit's tree")
    parser.add_argument("--streams", type=int, default=32)
    parser.add_argument("--requests-per-stream", type=int, default=4)
    parser.add_argument("--output-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--out", default="perf/results/api_token_path")
    args = parser.parse_args()
    if args.child:
        import uvloop

        result = uvloop.run(
            load(
                args.repo, args.streams, args.requests_per_stream, args.output_tokens, args.repeats
            )
        )
        print(json.dumps(result))
        return
    this_tree = Path(__file__).resolve().parents[1]
    trees = {"this tree": this_tree}
    if args.baseline_tree is not None:
        trees = {"baseline": args.baseline_tree, **trees}
    rounds: dict[str, list[dict]] = {name: [] for name in trees}
    for index in range(args.rounds):
        for name, tree in trees.items():
            rounds[name].append(side(tree, args))
            print(f"round {index + 1} {name}: {json.dumps(rounds[name][-1])}", flush=True)
    medians = {
        name: round(statistics.median(r["us_per_token_min"] for r in results), 2)
        for name, results in rounds.items()
    }
    report = {
        "command": " ".join(sys.argv),
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "cpus": os.cpu_count(),
        "load_1min": round(os.getloadavg()[0], 2),
        "settings": {k: v for k, v in vars(args).items() if k not in ("child", "out")},
        "trees": {name: str(tree) for name, tree in trees.items()},
        "rounds": rounds,
        "us_per_token": medians,
    }
    if "baseline" in medians:
        report["ratio"] = round(medians["this tree"] / medians["baseline"], 3)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(report, indent=2, default=str) + "\n")
    print(json.dumps({"us_per_token": medians, "ratio": report.get("ratio")}))


if __name__ == "__main__":
    main()
