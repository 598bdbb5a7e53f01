"""The OpenAI-compatible app: `create_app` wires the routes to one Triton backend and one tokenizer."""

from __future__ import annotations

import asyncio
import contextlib
import re
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

from fastapi import FastAPI, Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from toolkit.api.errors import ApiError, install_error_handlers, log
from toolkit.api.gate import ARRIVAL, Gate
from toolkit.api.generation import Coalesced, Generation, Job, SseFormatter
from toolkit.api.metrics import ApiMetrics
from toolkit.api.prompt import PromptCodec
from toolkit.api.schemas import (
    COMPLETION_DEFAULT_MAX_TOKENS,
    ChatCompletion,
    ChatCompletionRequest,
    Completion,
    CompletionRequest,
    ErrorResponse,
    Health,
    Model,
    ModelList,
    lone_surrogate,
    requested_features,
    unsupported_content,
    unsupported_fields,
)
from toolkit.api.triton import (
    ENGINE_MODEL,
    EngineFault,
    EngineStalled,
    InferenceFailed,
    Sampling,
    TritonBackend,
    TritonUnavailable,
)
from toolkit.errors import ToolkitError
from toolkit.repository.reader import Repository, open_repository
from toolkit.settings import ApiLimits

ERRORS = {
    status: {"model": ErrorResponse}
    for status in (400, 401, 404, 405, 408, 413, 429, 500, 502, 503, 504)
}
LONG_PROMPT_CHARS = 32768
# Long prompts tokenized at once: each takes ~150-700 bytes of memory per character while it is encoded,
# so the API's memory is bounded by this count, not by how many clients send long prompts together.
LONG_ENCODES_AT_ONCE = 2
RETRY_AFTER_S = 1
# A refusal of the repository's own models (model_repo/common/textcodec.py Refused): a mark, then the
# reason. The client gets a 400 with the mark's code, whatever the reason's words; any other engine error
# is the engine's failure (502).
REFUSAL = re.compile(r"\[refused:([a-z_]+)\] ")
# The error event's code when a stream ends early: a dead engine, a hung one, anything else.
STREAM_ERROR_CODES = {EngineFault: "engine_unavailable", EngineStalled: "engine_timeout"}
SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


@dataclass(frozen=True)
class ApiSettings:
    """Everything `create_app` needs; the CLI and `toolkit serve --openai-port` build one of these."""

    triton_url: str
    repo: Path
    # tensorrt_llm (token ids; cancellation reaches the engine), or ensemble / tensorrt_llm_bls (text)
    model_name: str = ENGINE_MODEL
    served_model_name: str | None = None  # the id in /v1/models; default: from the repository
    api_keys: tuple[str, ...] = ()
    max_in_flight: int = 64
    retry_after_s: int = 1
    # Header, body and send timeouts; body size and read budget; the engine's stall timeout.
    limits: ApiLimits = ApiLimits()


class ClientGone(Exception):
    """The HTTP client disconnected while we waited for the engine."""


class ApiState:
    def __init__(self, settings: ApiSettings, repository: Repository):
        self.settings = settings
        self.repository = repository
        self.limits = repository.limits
        self.codec = PromptCodec(repository)
        decoder = self.codec if settings.model_name == ENGINE_MODEL else None
        self.capabilities = repository.capabilities
        self.vocab_size = repository.manifest.model.facts.vocab_size
        self.backend = TritonBackend(
            settings.triton_url,
            settings.model_name,
            decoder=decoder,
            tokens=repository.tokens,
            decoupled=repository.decoupled,
            trtllm_version=repository.trtllm_version,
            stall_timeout_s=settings.limits.stall_timeout_s,
            vocab_size=self.vocab_size,
        )
        self.metrics = ApiMetrics()
        self.model_id = settings.served_model_name or repository.served_model_name
        self.created = int(time.time())
        self.long_encodes = asyncio.Semaphore(LONG_ENCODES_AT_ONCE)

    def check_model(self, name: str) -> None:
        if name not in (self.model_id, self.settings.model_name):
            raise ApiError(
                404,
                f"The model `{name}` does not exist; this server serves `{self.model_id}`.",
                param="model",
                code="model_not_found",
            )


def create_app(settings: ApiSettings) -> FastAPI:
    """The ASGI app, wrapped in the gate (API keys, in-flight bound); its lifespan opens the gRPC channel."""
    state = ApiState(settings, open_repository(Path(settings.repo)))

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        await state.backend.start()
        try:
            yield
        finally:
            await state.backend.close()

    app = FastAPI(title="toolkit OpenAI-compatible API", version="1", lifespan=lifespan)
    app.state.api = state
    install_error_handlers(app)
    _add_routes(app, state)
    app.add_middleware(
        Gate,
        api_keys=tuple(settings.api_keys),
        max_in_flight=settings.max_in_flight,
        retry_after_s=settings.retry_after_s,
        metrics=state.metrics,
        limits=settings.limits,
    )
    return app


def _add_routes(app: FastAPI, state: ApiState) -> None:
    @app.post("/v1/chat/completions", response_model=ChatCompletion, responses=ERRORS)
    async def chat_completions(body: ChatCompletionRequest, request: Request):
        state.check_model(body.model)
        _refuse_unsupported(state, body)
        found = unsupported_content(body)
        if found:
            raise ApiError(400, found[1], param=found[0], code="unsupported_content")
        messages = [
            {"role": "system" if m.role == "developer" else m.role, "content": m.text()}
            for m in body.messages
        ]
        try:
            prompt = await _render_chat(state, messages)
        except ToolkitError as exc:  # no template at all: one sentence, not the CLI's "fix:" line
            fix = f"; {exc.hint}" if exc.hint else ""
            raise ApiError(
                400,
                f"This server cannot render chat messages: {exc.message}{fix}.",
                param="messages",
            ) from exc
        except Exception as exc:  # noqa: BLE001 - a template's own error (jinja2 or raise_exception) is the client's 400
            reason = " ".join(str(exc).split()) or type(exc).__name__
            raise ApiError(
                400, f"The chat template refused these messages: {reason}", param="messages"
            ) from exc
        job = await _plan(
            state, "chat", body, prompt, body.requested_max_tokens(), "messages", _arrival(request)
        )
        return await _respond(state, job, bool(body.stream), request)

    @app.post("/v1/completions", response_model=Completion, responses=ERRORS)
    async def completions(body: CompletionRequest, request: Request):
        state.check_model(body.model)
        _refuse_unsupported(state, body)
        job = await _plan(
            state,
            "completion",
            body,
            body.prompt_text(),
            body.max_tokens,
            "prompt",
            _arrival(request),
        )
        return await _respond(state, job, bool(body.stream), request)

    @app.get("/v1/models", response_model=ModelList, responses=ERRORS)
    async def list_models():
        return ModelList(data=[_model(state)])

    @app.get("/v1/models/{model}", response_model=Model, responses=ERRORS)
    async def retrieve_model(model: str):
        state.check_model(model)
        return _model(state)

    @app.get("/health", response_model=Health, responses={503: {"model": ErrorResponse}})
    async def health():
        problem = await state.backend.health()
        if problem is None:
            return Health(status="ok", model=state.model_id)
        raise ApiError(503, problem, type="server_error", code="not_ready")

    @app.get("/metrics", response_class=Response)
    async def metrics():
        return Response(
            state.metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8"
        )


def _model(state: ApiState) -> Model:
    return Model(id=state.model_id, created=state.created, owned_by="toolkit")


def _refuse_unsupported(state: ApiState, body) -> None:
    """Refuse what this server never honours, then what this repository does not (its capabilities)."""
    found = unsupported_fields(body)
    if found:
        name, reason = found[0]
        raise ApiError(400, reason, param=name, code="unsupported_parameter")
    capabilities = state.capabilities
    for param, feature in requested_features(body):
        if not capabilities.supports(feature):
            raise ApiError(
                400, capabilities.refusal(feature) + ".", param=param, code="unsupported_parameter"
            )
    if body.logit_bias and not state.backend.engine:
        raise ApiError(
            400,
            f"logit_bias takes token ids, and `{state.settings.model_name}` takes text: serve the API on "
            "the tensorrt_llm model (--model-name tensorrt_llm) for it.",
            param="logit_bias",
            code="unsupported_parameter",
        )


def _logit_bias(state: ApiState, body) -> tuple[tuple[int, float], ...]:
    """OpenAI's logit_bias ({"token id": bias}) as (id, bias) pairs, each id checked against the vocabulary."""
    pairs = []
    for key, bias in (body.logit_bias or {}).items():
        token = int(key) if key.strip().isdigit() else -1
        if not 0 <= token < state.vocab_size:
            raise ApiError(
                400,
                f"logit_bias key {key[:20]!r} is not a token id of this model (0 to {state.vocab_size - 1}).",
                param="logit_bias",
                code="invalid_value",
            )
        pairs.append((token, float(bias)))
    return tuple(pairs)


def _arrival(request: Request) -> float:
    """When the request came through the gate (before body parsing and validation), for TTFT."""
    return request.scope.get("state", {}).get(ARRIVAL) or time.perf_counter()


async def _render_chat(state: ApiState, messages: list[dict]) -> str:
    """The chat prompt; rendering megabytes of messages (pure Python, jinja2) runs on a worker thread."""
    if sum(len(m["content"]) for m in messages) > LONG_PROMPT_CHARS:
        return await asyncio.to_thread(state.codec.render_chat, messages)
    return state.codec.render_chat(messages)


async def _encode(state: ApiState, prompt: str, param: str) -> list[int]:
    """The prompt's token ids; a prompt that cannot fit max_input_len is refused before it is tokenized,
    and a long one is tokenized off the event loop, without holding the GIL."""
    if lone_surrogate(prompt):  # a chat template may join what it was given into one
        raise ApiError(
            400,
            "The prompt is not valid Unicode (it holds a lone surrogate).",
            param=param,
            code="invalid_value",
        )
    max_input_len = state.limits.max_input_len
    most = state.codec.most_chars(max_input_len)
    if most is not None and len(prompt) > most:
        raise ApiError(
            400,
            f"The prompt is {len(prompt)} characters: more than any text of this model's maximum input "
            f"length of {max_input_len} tokens can hold ({most} characters with this tokenizer); shorten it.",
            param=param,
            code="context_length_exceeded",
        )
    if len(prompt) > LONG_PROMPT_CHARS:
        async with state.long_encodes:
            return await asyncio.to_thread(state.codec.encode_long, prompt)
    return state.codec.encode(prompt)


async def _plan(
    state: ApiState, kind: str, body, prompt: str, requested: int | None, param: str, arrival: float
) -> Job:
    """Check the prompt and max_tokens against the engine's limits; a request over them is a 400 naming the limit."""
    limits = state.limits
    prompt_ids = await _encode(state, prompt, param)
    prompt_tokens = len(prompt_ids)
    if prompt_tokens == 0:
        raise ApiError(
            400,
            "The prompt is empty: it must hold at least one token.",
            param=param,
            code="invalid_value",
        )
    if prompt_tokens > limits.max_input_len:
        raise ApiError(
            400,
            f"The prompt is {prompt_tokens} tokens, over this model's maximum input length of "
            f"{limits.max_input_len} tokens; shorten it.",
            param=param,
            code="context_length_exceeded",
        )
    limit = limits.output_limit(prompt_tokens)
    if limit < 1:
        raise ApiError(
            400,
            f"The prompt is {prompt_tokens} tokens and leaves no room to generate within this model's maximum "
            f"sequence length of {limits.max_seq_len} tokens.",
            param=param,
            code="context_length_exceeded",
        )
    if kind == "completion" and (requested is None or "max_tokens" not in body.model_fields_set):
        max_tokens = min(
            requested or COMPLETION_DEFAULT_MAX_TOKENS, limit
        )  # OpenAI's default (16), also for an explicit null
    else:
        max_tokens = requested if requested is not None else limit
    if max_tokens > limit:
        name = (
            "max_completion_tokens"
            if getattr(body, "max_completion_tokens", None) is not None
            else "max_tokens"
        )
        raise ApiError(
            400,
            f"{name}={max_tokens} is over this model's limit of {limit} tokens for a {prompt_tokens}-token prompt "
            f"(max_output_len {limits.max_output_len}, max_seq_len {limits.max_seq_len}).",
            param=name,
            code="context_length_exceeded",
        )
    if body.min_tokens is not None and body.min_tokens > max_tokens:
        raise ApiError(
            400,
            f"min_tokens={body.min_tokens} is over max_tokens={max_tokens}: ask for at most as many tokens as may "
            "be generated.",
            param="min_tokens",
            code="invalid_value",
        )
    if body.stream_options is not None and not body.stream:
        raise ApiError(
            400,
            "stream_options is only allowed when stream is true.",
            param="stream_options",
            code="invalid_value",
        )
    sampling = Sampling(
        temperature=body.temperature,
        top_p=body.top_p,
        seed=body.seed,
        min_tokens=body.min_tokens,
        presence_penalty=body.presence_penalty,
        frequency_penalty=body.frequency_penalty,
        logit_bias=_logit_bias(state, body),
    )
    include_usage = bool(body.stream and body.stream_options and body.stream_options.include_usage)
    prefix = "chatcmpl" if kind == "chat" else "cmpl"
    return Job(
        f"{prefix}-{uuid.uuid4().hex}",
        kind,
        body.model,
        prompt,
        prompt_ids,
        prompt_tokens,
        max_tokens,
        sampling,
        tuple(body.stop_list()),
        include_usage,
        arrival=arrival,
    )


async def _respond(state: ApiState, job: Job, stream: bool, request: Request):
    generation = Generation(job, state.backend, state.metrics, state.codec.count_generated)
    texts = generation.texts()
    try:
        if not stream:
            text = await _until_disconnect(request, _collect(texts))
            return JSONResponse(_whole_body(job, text, generation))
        # Wait for the engine's first response before answering, so that an engine error is an HTTP status.
        first = await _until_disconnect(request, anext(texts, None))
    except ClientGone:
        await texts.aclose()
        return Response(status_code=499)
    except TritonUnavailable as exc:
        await texts.aclose()
        raise ApiError(503, str(exc), type="server_error", code="triton_unavailable") from exc
    except InferenceFailed as exc:
        await texts.aclose()
        raise _engine_error(exc) from exc
    return _EventStream(
        _sse(job, generation, texts, first), media_type="text/event-stream", headers=SSE_HEADERS
    )


class _EventStream(StreamingResponse):
    """A StreamingResponse that closes its event generator however the response ends. Starlette stops
    iterating when the client is gone (a disconnect, or a write past --send-timeout) but may leave the
    generator at a `yield`, to be closed whenever it is collected: closing it here cancels the engine
    request at once."""

    async def __call__(self, scope, receive, send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            await self.body_iterator.aclose()


async def _collect(texts: AsyncIterator[str]) -> str:
    return "".join([text async for text in texts])


async def _sse(
    job: Job, generation: Generation, texts: AsyncIterator[str], first: str | None
) -> AsyncIterator[bytes]:
    """The event stream; cancelled (client gone) at an await, which closes `texts` and cancels Triton."""
    sse = SseFormatter(job)
    pieces = None
    try:
        opening = sse.first()
        if opening:
            yield opening
        if first:
            yield sse.text(first)
        pieces = Coalesced(
            texts
        )  # what arrives while a chunk is being written goes out together in the next
        async for text in pieces:
            yield sse.text(text)
        yield sse.end(generation)
    except (TritonUnavailable, InferenceFailed) as exc:
        code = STREAM_ERROR_CODES.get(type(exc), "engine_error")
        yield sse.error(
            {"error": {"message": str(exc), "type": "server_error", "param": None, "code": code}}
        )
    except Exception:  # noqa: BLE001 - headers are gone: the client still gets an error event and [DONE], not a cut stream
        log.exception("unhandled error while streaming %s", job.id)
        yield sse.error(
            {
                "error": {
                    "message": "The server had an error while streaming this response.",
                    "type": "server_error",
                    "param": None,
                    "code": "internal_error",
                }
            }
        )
    finally:
        await (pieces.aclose() if pieces is not None else texts.aclose())


def _whole_body(job: Job, text: str, generation: Generation) -> dict:
    if job.kind == "chat":
        choice = {
            "index": 0,
            "message": {"role": "assistant", "content": text, "refusal": None},
            "logprobs": None,
            "finish_reason": generation.finish_reason,
        }
        kind = "chat.completion"
    else:
        choice = {
            "index": 0,
            "text": text,
            "logprobs": None,
            "finish_reason": generation.finish_reason,
        }
        kind = "text_completion"
    return {
        "id": job.id,
        "object": kind,
        "created": job.created,
        "model": job.model,
        "choices": [choice],
        "usage": generation.usage(),
        "system_fingerprint": None,
    }


def _engine_error(exc: InferenceFailed) -> ApiError:
    message = str(exc)
    if isinstance(exc, EngineFault):
        return ApiError(
            503,
            f"The engine cannot serve: {message}",
            type="server_error",
            code="engine_unavailable",
        )
    if isinstance(exc, EngineStalled):
        return ApiError(504, message, type="server_error", code="engine_timeout")
    refused = REFUSAL.search(message)
    if refused:
        return ApiError(400, REFUSAL.sub("", message, count=1), code=refused.group(1))
    if "Exceeds maximum queue size" in message:  # the engine's queue bound (Triton's own wording)
        return ApiError(
            429,
            f"The engine's queue is full; retry after {RETRY_AFTER_S} s. ({message})",
            type="rate_limit_error",
            code="engine_queue_full",
            headers={"Retry-After": str(RETRY_AFTER_S)},
        )
    return ApiError(
        502, f"The engine failed this request: {message}", type="server_error", code="engine_error"
    )


async def _until_disconnect(request: Request, awaitable):
    """Await `awaitable` in this task unless the client disconnects first; then cancel it and raise ClientGone.

    The work stays in the request's own task and only the disconnect watcher is a task of its own:
    on a loaded event loop every hop to another task waits a whole turn of the loop (every other
    stream's relay work): in a trace at 16 streams the two hops this used to take cost 1.0 and
    0.6 ms (p50) of time-to-first-token (perf/results/api_overhead.md).
    """
    task = asyncio.current_task()
    gone = False
    waiting = True

    def on_watch_done(watch: asyncio.Future) -> None:
        nonlocal gone
        if watch.cancelled():
            return
        watch.exception()  # retrieved: a receive error counts as the client gone
        if not waiting:
            return
        gone = True
        task.cancel()

    watch = asyncio.ensure_future(_disconnected(request))
    watch.add_done_callback(on_watch_done)
    try:
        return await awaitable
    except asyncio.CancelledError:
        if not gone:
            raise
        if hasattr(task, "uncancel"):  # Python 3.11+: the cancel was ours, spent here
            task.uncancel()
        raise ClientGone() from None
    finally:
        waiting = False
        watch.remove_done_callback(on_watch_done)
        watch.cancel()


async def _disconnected(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass
