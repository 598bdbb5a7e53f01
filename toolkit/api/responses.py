"""A Job -> the HTTP response: one JSON body, or a server-sent event stream; engine errors as statuses."""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncGenerator

from fastapi import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from toolkit.api.errors import ApiError, log
from toolkit.api.generation import Coalesced, Generation, Job, SseFormatter
from toolkit.api.state import ApiState
from toolkit.api.triton import (
    EngineFault,
    EngineStalled,
    InferenceFailed,
    TritonUnavailable,
)

RETRY_AFTER_S = 1
# A refusal of the repository's own models (model_repo/common/textcodec.py Refused): a mark, then the
# reason. The client gets a 400 with the mark's code, whatever the reason's words; any other engine error
# is the engine's failure (502).
REFUSAL = re.compile(r"\[refused:([a-z_]+)\] ")
# The error event's code when a stream ends early: a dead engine, a hung one, anything else.
STREAM_ERROR_CODES: dict[type[Exception], str] = {
    EngineFault: "engine_unavailable",
    EngineStalled: "engine_timeout",
}
SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


class ClientGone(Exception):
    """The HTTP client disconnected while we waited for the engine."""


async def respond(state: ApiState, job: Job, stream: bool, request: Request):
    generation = Generation(job, state.backend, state.metrics, state.codec.count_generated)
    texts = generation.texts()
    try:
        if not stream:
            text = await until_disconnect(request, _collect(texts))
            return JSONResponse(_whole_body(job, text, generation))
        # Wait for the engine's first response before answering, so that an engine error is an HTTP status.
        first = await until_disconnect(request, anext(texts, None))
    except ClientGone:
        await texts.aclose()
        return Response(status_code=499)
    except TritonUnavailable as exc:
        await texts.aclose()
        raise ApiError(503, str(exc), type="server_error", code="triton_unavailable") from exc
    except InferenceFailed as exc:
        await texts.aclose()
        raise engine_error(exc) from exc
    return _EventStream(
        _sse(job, generation, texts, first), media_type="text/event-stream", headers=SSE_HEADERS
    )


class _EventStream(StreamingResponse):
    """A StreamingResponse that closes its event generator however the response ends. Starlette stops
    iterating when the client is gone (a disconnect, or a write past --send-timeout) but may leave the
    generator at a `yield`, to be closed whenever it is collected: closing it here cancels the engine
    request at once."""

    def __init__(self, events: AsyncGenerator[bytes, None], **kw):
        super().__init__(events, **kw)
        self.events = events

    async def __call__(self, scope, receive, send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            await self.events.aclose()


async def _collect(texts: AsyncGenerator[str, None]) -> str:
    return "".join([text async for text in texts])


async def _sse(
    job: Job, generation: Generation, texts: AsyncGenerator[str, None], first: str | None
) -> AsyncGenerator[bytes, None]:
    """The event stream; cancelled (client gone) at an await, which closes `texts` and cancels Triton."""
    sse = SseFormatter(job)
    pieces = None
    trace, counted = job.trace, 0
    try:
        opening = sse.first()
        if opening:
            yield opening
        if first:
            yield sse.text(first)
            if trace is not None:  # the chunk has been written: the stream pulls the next one
                trace.wrote(generation.completion_tokens)
                counted = generation.completion_tokens
        # what arrives while a chunk is being written goes out together in the next
        pieces = Coalesced(texts)
        async for text in pieces:
            yield sse.text(text)
            if trace is not None:
                trace.wrote(generation.completion_tokens - counted)
                counted = generation.completion_tokens
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


def engine_error(exc: InferenceFailed) -> ApiError:
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


async def until_disconnect(request: Request, awaitable):
    """Await `awaitable` in this task unless the client disconnects first; then cancel it and raise ClientGone.

    The work stays in the request's own task and only the disconnect watcher is a task of its own:
    on a loaded event loop every hop to another task waits a whole turn of the loop (every other
    stream's relay work): in a trace at 16 streams the two hops this used to take cost 1.0 and
    0.6 ms (p50) of time-to-first-token (perf/results/api_overhead.md).
    """
    current = asyncio.current_task()
    if current is None:  # only ever awaited inside the request's task
        raise RuntimeError("until_disconnect runs outside a task")
    task: asyncio.Task = current
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
