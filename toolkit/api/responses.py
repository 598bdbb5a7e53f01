"""A Job -> the HTTP response: one JSON body, or a server-sent event stream; engine errors as statuses."""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncGenerator

from fastapi import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from toolkit.api.errors import ApiError, log
from toolkit.api.generation import (
    Coalesced,
    Delta,
    Generation,
    Job,
    SseFormatter,
    combined_usage,
    merged,
)
from toolkit.api.logprobs import chat_logprobs, completion_logprobs
from toolkit.api.reasoning import ReasoningParser, ReasoningStream
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


async def respond(state: ApiState, jobs: Job | list[Job], stream: bool, request: Request):
    """Serve one job (or, completions with a list of prompts, several, concurrently) as JSON or SSE."""
    jobs = [jobs] if isinstance(jobs, Job) else jobs
    generations = [
        Generation(job, state.backend, state.metrics, state.codec.count_generated) for job in jobs
    ]
    render = _logprob_renderer(state, jobs[0])
    reasoning = state.reasoning if jobs[0].kind == "chat" else None
    sources = [g.deltas() for g in generations]
    deltas = merged(sources)
    try:
        if not stream:
            await until_disconnect(request, _drain(deltas))
            return JSONResponse(_whole_body(jobs, generations, render, reasoning))
        # Wait for the engine's first response before answering, so that an engine error is an HTTP status.
        first = await until_disconnect(request, anext(deltas, None))
    except ClientGone:
        await deltas.aclose()
        return Response(status_code=499)
    except TritonUnavailable as exc:
        await deltas.aclose()
        raise ApiError(503, str(exc), type="server_error", code="triton_unavailable") from exc
    except InferenceFailed as exc:
        await deltas.aclose()
        raise engine_error(exc) from exc
    sse = SseFormatter(jobs[0], render, choices=sum(job.n for job in jobs))
    return _EventStream(
        _sse(
            sse,
            generations,
            deltas,
            first,
            reasoning,
            _hold(state.backend.hold(bool(jobs[0].stops)), sse.choices),
        ),
        media_type="text/event-stream",
        headers=SSE_HEADERS,
    )


def _logprob_renderer(state: ApiState, job: Job):
    """(index, token log probs) -> the choice's logprobs object, when the job asked for them."""
    features = job.features
    if features is None or not features.logprobs:
        return None
    texts = state.token_texts
    top = features.top_logprobs
    if job.kind == "chat":
        return lambda index, entries: chat_logprobs(texts, entries, top)
    offsets: dict[int, int] = {}

    def render(index: int, entries) -> dict:
        body = completion_logprobs(texts, entries, top, offsets.get(index, len(job.echo)))
        if body["text_offset"]:
            offsets[index] = body["text_offset"][-1] + len(body["tokens"][-1])
        return body

    return render


class _EventStream(StreamingResponse):
    """A StreamingResponse streamed in the request's own task, that closes its event generator however the
    response ends.

    Streaming stops when the client is gone (a disconnect, or a write past --send-timeout), which can
    leave the generator at a `yield`, to be closed whenever it is collected: closing it here cancels
    the engine request at once. Starlette's own __call__ (below ASGI spec 2.4, as uvicorn's is) runs
    the stream in an anyio task group, two tasks of its own per response; here only the disconnect
    watcher of until_disconnect is a task."""

    def __init__(self, events: AsyncGenerator[bytes, None], **kw):
        super().__init__(events, **kw)
        self.events = events

    async def __call__(self, scope, receive, send) -> None:
        try:
            await until_gone(receive, self.stream_response(send))
        except ClientGone:
            pass  # the client hung up: nothing more goes out, and the events are closed below
        finally:
            await self.events.aclose()


def _hold(interval: int, choices: int) -> int:
    """Engine responses each chunk waits for: `interval` steps of every choice (each answers once a step);
    1 where the engine itself answers every interval (the API then writes whatever has come)."""
    return interval * choices if interval > 1 else 1


async def _drain(deltas: AsyncGenerator[Delta, None]) -> None:
    async for _ in deltas:
        pass


async def _sse(
    sse: SseFormatter,
    generations: list[Generation],
    deltas: AsyncGenerator[Delta, None],
    first: Delta | None,
    reasoning: ReasoningParser | None = None,
    hold: int = 1,
) -> AsyncGenerator[bytes, None]:
    """The event stream; cancelled (client gone) at an await, which closes `deltas` and cancels Triton.
    `hold`: engine responses (all choices') that each chunk after the first waits for (--stream-interval)."""
    job = generations[0].job
    splits: dict[int, ReasoningStream] = {}  # a reasoning model's choices, each split on its own
    pieces = None
    trace, counted = job.trace, 0
    try:
        opening = sse.first()
        if opening:
            yield opening
        for generation in generations:
            job_ = generation.job
            if job_.echo:  # completions' echo: the prompt first, in each of its n choices
                for index in range(job_.first_index, job_.first_index + job_.n):
                    yield sse.delta(Delta(index, job_.echo))
        if first and (chunk := _events(sse, reasoning, splits, first)):
            yield chunk
            if trace is not None:  # the chunk has been written: the stream pulls the next one
                counted = _wrote(trace, generations, counted)
        # What arrives while a chunk is being written goes out together in the next.
        pieces = Coalesced(deltas, hold)
        async for batch in pieces:
            # a reasoning model's piece may be held back: a tag cut in two
            if len(batch) == 1:
                chunk = _events(sse, reasoning, splits, batch[0])
            else:
                chunk = b"".join(_events(sse, reasoning, splits, delta) for delta in batch)
            if chunk:
                yield chunk
                if trace is not None:
                    counted = _wrote(trace, generations, counted)
        for index, split in splits.items():
            for field, text in split.flush():
                yield _part(sse, index, field, text)
        yield sse.end(generations, combined_usage(generations))
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
        await (pieces.aclose() if pieces is not None else deltas.aclose())


def _wrote(trace, generations: list[Generation], counted: int) -> int:
    """Stamp a written chunk with the tokens it carried (all choices); the count written so far."""
    total = sum(g.completion_tokens for g in generations)
    trace.wrote(total - counted)
    return total


def _events(
    sse: SseFormatter,
    reasoning: ReasoningParser | None,
    splits: dict[int, ReasoningStream],
    delta: Delta,
) -> bytes:
    """The events of one delta: as it is, or (reasoning models) its reasoning and content parts."""
    if reasoning is None:
        return sse.delta(delta)
    split = splits.setdefault(delta.index, reasoning.stream())
    parts = split.feed(delta.text) if delta.text else []
    events = [_part(sse, delta.index, field, text) for field, text in parts]
    if delta.logprobs or delta.tool_calls:  # what is not text goes with an empty content delta
        events.append(sse.delta(Delta(delta.index, "", delta.logprobs, delta.tool_calls)))
    return b"".join(events)


def _part(sse: SseFormatter, index: int, field: str, text: str) -> bytes:
    if field == "content":
        return sse.delta(Delta(index, text))
    return sse.reasoning(index, text)


def _whole_body(
    jobs: list[Job], generations: list[Generation], render, reasoning: ReasoningParser | None = None
) -> dict:
    job = jobs[0]
    choices = []
    for generation in generations:
        for choice in generation.choices:
            choices.append(_choice(generation.job, choice, render, reasoning))
    return {
        "id": job.id,
        "object": "chat.completion" if job.kind == "chat" else "text_completion",
        "created": job.created,
        "model": job.model,
        "choices": choices,
        "usage": combined_usage(generations),
        "system_fingerprint": None,
    }


def _choice(job: Job, choice, render, reasoning: ReasoningParser | None = None) -> dict:
    index = choice.index + job.first_index
    text = "".join(choice.shown)
    logprobs = render(index, choice.logprobs) if render is not None else None
    if job.kind != "chat":
        return {
            "index": index,
            "text": job.echo + text,
            "logprobs": logprobs,
            "finish_reason": choice.finish_reason,
        }
    message: dict = {"role": "assistant", "content": text, "refusal": None}
    if reasoning is not None:  # vLLM's field for the <think> part (toolkit.api.reasoning)
        message["reasoning_content"], message["content"] = reasoning.split(text)
    if choice.tool_calls:  # the content besides the calls (its reasoning already split off)
        message["content"] = message["content"] or None
        message["tool_calls"] = [call.to_dict() for call in choice.tool_calls]
    return {
        "index": index,
        "message": message,
        "logprobs": logprobs,
        "finish_reason": choice.finish_reason,
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
    """Await `awaitable` in this task unless the client disconnects first; then cancel it and raise ClientGone."""
    return await until_gone(request.receive, awaitable)


async def until_gone(receive, awaitable):
    """until_disconnect with the request's ASGI `receive`.

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

    watch = asyncio.ensure_future(_disconnected(receive))
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


async def _disconnected(receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass
