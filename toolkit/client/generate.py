"""Send one prompt to the ensemble (or the BLS model) over gRPC streaming or Triton's HTTP generate endpoint.

Streamed pieces are bytes (a piece may end inside a multi-byte character); an incremental
UTF-8 decoder per request turns them into text as they arrive.
"""

from __future__ import annotations

import codecs
import http.client
import json
import queue
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import numpy as np

from toolkit.client.tensors import infer_inputs, scalar
from toolkit.errors import ClientError


@dataclass(frozen=True)
class GenerateRequest:
    prompt: str
    max_tokens: int = 64
    temperature: float | None = None
    top_k: int | None = None
    top_p: float | None = None
    seed: int | None = None
    stop_words: tuple[str, ...] = ()
    min_tokens: int | None = None
    end_id: int | None = None
    lora_task_id: int | None = (
        None  # the LoRA adapter (toolkit.client.adapters), None: the base model
    )

    def validate(self) -> None:
        if self.max_tokens <= 0:
            raise ClientError(
                f"--max-tokens={self.max_tokens} must be at least 1",
                hint="pass --max-tokens 64, say",
            )
        if self.temperature is not None and self.temperature < 0:
            raise ClientError(
                f"--temperature={self.temperature} must be >= 0", hint="0 is greedy; 0.7 is typical"
            )
        if self.top_p is not None and not 0 <= self.top_p <= 1:
            raise ClientError(
                f"--top-p={self.top_p} must be within [0, 1]", hint="pass --top-p 0.9, say"
            )
        if self.top_k is not None and self.top_k < 0:
            raise ClientError(f"--top-k={self.top_k} must be >= 0", hint="0 disables top-k")


@dataclass
class GenerateResult:
    text: str
    pieces: list[str] = field(default_factory=list)
    time_to_first_piece_s: float | None = None
    total_s: float = 0.0


def _optional_inputs(request: GenerateRequest) -> dict[str, tuple[object, str]]:
    """The request's optional tensors. TensorRT-LLM samples only with top_k > 1 or top_p > 0, so a
    temperature given alone comes with top_p 1.0 (the whole distribution): what a user means by it."""
    top_p = request.top_p
    if request.temperature and request.top_k is None and top_p is None:
        top_p = 1.0
    values = {
        "temperature": (request.temperature, "FP32"),
        "top_k": (request.top_k, "INT32"),
        "top_p": (top_p, "FP32"),
        "seed": (request.seed, "UINT64"),
        "min_tokens": (request.min_tokens, "INT32"),
        "end_id": (request.end_id, "INT32"),
        "lora_task_id": (request.lora_task_id, "UINT64"),
    }
    return {name: pair for name, pair in values.items() if pair[0] is not None}


def grpc_inputs(request: GenerateRequest, stream: bool):
    tensors = [
        ("text_input", np.array([[request.prompt.encode("utf-8")]], dtype=object), "BYTES"),
        scalar("max_tokens", request.max_tokens, "INT32"),
        scalar("stream", stream, "BOOL"),
    ]
    if request.stop_words:
        tensors.append(
            (
                "stop_words",
                np.array([[w.encode() for w in request.stop_words]], dtype=object),
                "BYTES",
            )
        )
    tensors += [
        scalar(name, value, dtype) for name, (value, dtype) in _optional_inputs(request).items()
    ]
    return infer_inputs(tensors)


def generate_grpc(
    url: str,
    request: GenerateRequest,
    *,
    model: str = "ensemble",
    stream: bool | None = None,
    on_piece: Callable[[str], None] = lambda _: None,
    timeout_s: float = 600.0,
) -> GenerateResult:
    """Send one request over a gRPC stream; calls on_piece with each decoded piece as it arrives.
    stream None: token by token where the model is decoupled, one response where it is not
    (a repository built with --no-decoupled)."""
    import tritonclient.grpc as grpcclient
    from tritonclient.utils import InferenceServerException

    request.validate()
    responses: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(url)
    if stream is None:
        stream = _decoupled(client, model, url)
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    result = GenerateResult(text="")
    start = time.perf_counter()
    finished = False
    try:
        client.start_stream(callback=lambda result, error: responses.put((result, error)))
        client.async_stream_infer(
            model, grpc_inputs(request, stream), enable_empty_final_response=True
        )
        for piece in _pieces(responses, timeout_s):
            text = decoder.decode(piece)
            if result.time_to_first_piece_s is None:
                result.time_to_first_piece_s = time.perf_counter() - start
            if text:
                result.pieces.append(text)
                on_piece(text)
        tail = decoder.decode(b"", final=True)
        if tail:
            result.pieces.append(tail)
            on_piece(tail)
        finished = True
    except InferenceServerException as exc:
        raise ClientError(
            f"{model} at {url}: {exc.message()}", hint=_hint_for(exc.message())
        ) from exc
    finally:
        # Cancel only what is still running (an error, a timeout, Ctrl-C); a finished request needs no cancel.
        client.stop_stream(cancel_requests=not finished)
        client.close()
    result.text = "".join(result.pieces)
    result.total_s = time.perf_counter() - start
    return result


def _decoupled(client, model: str, url: str) -> bool:
    """Whether `model` streams (decoupled); a server that cannot be asked is reported as the call would be."""
    from tritonclient.utils import InferenceServerException

    try:
        config = client.get_model_config(model, client_timeout=30).config
    except InferenceServerException as exc:
        client.close()
        raise ClientError(
            f"{model} at {url}: {exc.message()}", hint=_hint_for(exc.message())
        ) from exc
    return config.model_transaction_policy.decoupled


def _pieces(responses: queue.Queue, timeout_s: float) -> Iterator[bytes]:
    from tritonclient.utils import InferenceServerException

    deadline = time.monotonic() + timeout_s
    while True:
        try:
            res, err = responses.get(timeout=max(deadline - time.monotonic(), 0.001))
        except queue.Empty as exc:
            raise ClientError(
                f"no response within {timeout_s:.0f}s",
                hint="raise --timeout, or check the server log",
            ) from exc
        if err is not None:
            message = err.message() if isinstance(err, InferenceServerException) else str(err)
            raise ClientError(message, hint=_hint_for(message))
        output = res.as_numpy("text_output")
        if output is not None:
            for piece in output.reshape(-1):
                yield piece if isinstance(piece, bytes) else str(piece).encode()
        final = res.get_response(as_json=False).parameters.get("triton_final_response")
        if final is not None and final.bool_param:
            return


def generate_http(
    url: str, request: GenerateRequest, *, model: str = "ensemble", timeout_s: float = 600.0
) -> GenerateResult:
    """Triton's HTTP generate endpoint: one JSON request, one JSON response."""
    request.validate()
    body = {"text_input": request.prompt, "max_tokens": request.max_tokens, "stream": False}
    body.update({name: value for name, (value, _) in _optional_inputs(request).items()})
    if request.stop_words:
        body["stop_words"] = list(request.stop_words)
    base = url if url.startswith("http") else f"http://{url}"
    call = urllib.request.Request(
        f"{base}/v2/models/{model}/generate",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    start = time.perf_counter()
    try:
        with urllib.request.urlopen(call, timeout=timeout_s) as response:
            payload = json.loads(response.read())
    except urllib.error.HTTPError as exc:
        message = _error_message(exc)
        raise ClientError(f"{model} at {base}: {message}", hint=_hint_for(message)) from exc
    except urllib.error.URLError as exc:
        raise ClientError(
            f"cannot reach {base}: {exc.reason}",
            hint="start the server with toolkit serve, or fix --url",
        ) from exc
    except http.client.HTTPException as exc:  # bytes that are no HTTP/1.1 status line
        raise not_http(base) from exc
    elapsed = time.perf_counter() - start
    text = payload.get("text_output", "")
    return GenerateResult(text=text, pieces=[text], time_to_first_piece_s=elapsed, total_s=elapsed)


def _error_message(exc: urllib.error.HTTPError) -> str:
    try:
        return json.loads(exc.read()).get("error", str(exc))
    except (ValueError, OSError):
        return str(exc)


HTTP_ON_GRPC = (
    "-p grpc (Triton's gRPC port, 8001 by default), or -u HOST:PORT of its HTTP port (--http-port, 8000 by "
    "default)"
)
GRPC_ON_HTTP = (
    "-p http (Triton's HTTP port, 8000 by default), or -u HOST:PORT of its gRPC port (--grpc-port, 8001 by "
    "default)"
)


def not_http(url: str) -> ClientError:
    """The answer to HTTP bytes from a server that speaks HTTP/2 only (Triton's gRPC port)."""
    return ClientError(
        f"{url} does not answer HTTP/1.1: it is a gRPC port (HTTP/2), as Triton's --grpc-port is",
        hint=HTTP_ON_GRPC,
    )


def _hint_for(message: str) -> str:
    lowered = message.lower()
    if "http1.x server" in lowered:  # gRPC's words for an HTTP/1.1 port
        return GRPC_ON_HTTP
    if "max_tokens" in message:
        return "lower --max-tokens"
    if "max_input_len" in message:
        return "shorten the prompt, or rebuild with a larger --max-input-len"
    if "unavailable" in lowered or "connect" in lowered or "refused" in lowered:
        return "start the server with toolkit serve, or fix --url"
    if "queue" in lowered:
        return "the server is at its queue bound; retry later or rebuild with a larger --max-queue-size"
    return "read the server log (toolkit serve prints where it is), or retry"
