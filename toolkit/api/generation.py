"""One generation: Triton pieces in, stop-checked text out, with usage, finish reason and latency metrics."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncGenerator
from dataclasses import dataclass, field
from typing import Any

from toolkit.api.metrics import ApiMetrics
from toolkit.api.stops import StopScanner
from toolkit.api.tracing import RequestTrace
from toolkit.api.triton import Sampling, TritonBackend

# The text models (ensemble, BLS): a re-tokenized count under this share of max_tokens is an early end.
RETOKENIZED_MARGIN = 0.9


@dataclass(frozen=True)
class Job:
    """A validated request, ready for the engine."""

    id: str
    kind: str  # "chat" or "completion"
    model: str
    prompt: str
    prompt_ids: list[int]
    prompt_tokens: int
    max_tokens: int
    sampling: Sampling
    stops: tuple[str, ...]
    include_usage: bool = False
    created: int = field(default_factory=lambda: int(time.time()))
    arrival: float = field(default_factory=time.perf_counter)
    trace: RequestTrace | None = field(default=None, compare=False, repr=False)


class Generation:
    """Iterate `texts()` for the text to send; afterwards `completion_tokens` and `finish_reason` hold."""

    def __init__(self, job: Job, backend: TritonBackend, metrics: ApiMetrics, count_tokens=None):
        self.job = job
        self.backend = backend
        self.metrics = metrics
        # The text models (ensemble, BLS) of the pinned release return no token count: their text is
        # counted with the repository's tokenizer when it ends (bytes -> tokens), an estimate: the engine's
        # own tokens need not be how the tokenizer splits their text.
        self.count_tokens = None if backend.engine else count_tokens
        self.received: list[bytes] = []
        self.completion_tokens = 0
        self.finish_reason = "length"
        self.done = False

    async def texts(self) -> AsyncGenerator[str, None]:
        """Text pieces (possibly empty) in order; one per engine response, then the held-back tail."""
        job, metrics = self.job, self.metrics
        scanner = StopScanner(list(job.stops))
        trace = job.trace
        # a traced request's context goes on to Triton, and the backend times its detokenizing
        traced: dict[str, Any] = {}
        if trace is not None:
            traced = {"traceparent": trace.call(self.backend.model_name), "timing": trace}
        sent = time.perf_counter()
        metrics.admission.observe(sent - job.arrival)
        pieces = self.backend.generate(
            job.prompt, job.prompt_ids, job.max_tokens, job.sampling, **traced
        )
        last = None
        failed = False
        try:
            async for piece in pieces:
                now = time.perf_counter()
                before = self.completion_tokens
                if piece.output_tokens is not None:
                    self.completion_tokens = max(before, piece.output_tokens)
                elif piece.data:
                    self.completion_tokens = before + 1
                new = self.completion_tokens - before
                if new and trace is not None:
                    trace.response(time.time_ns())
                if new:
                    if last is None:
                        metrics.ttft.observe(now - job.arrival)
                        metrics.engine_first.observe(now - sent)
                    else:
                        gap = (now - last) / new
                        for _ in range(new):
                            metrics.itl.observe(gap)
                    last = now
                if self.count_tokens is not None:
                    self.received.append(piece.data)
                text = scanner.feed(piece.data)
                if scanner.stopped:
                    yield text
                    break
                yield text
            else:
                yield scanner.flush()
            self._finish(scanner.stopped)
        except Exception:
            failed = True  # the engine or Triton failed it: not a cancellation
            metrics.failed.inc()
            raise
        finally:
            await pieces.aclose()  # cancels the Triton request if it is still running
            if not self.done and not failed:
                metrics.cancelled.inc()

    def _finish(self, stopped: bool) -> None:
        self.done = True
        text = b"".join(self.received)  # the text models' answer (nothing is kept for the engine's)
        if self.count_tokens is not None:
            self.completion_tokens = self.count_tokens(text)
        if stopped or self._ended_early(text):
            self.finish_reason = "stop"
        self.metrics.finished.labels(self.finish_reason).inc()
        if self.job.trace is not None:
            self.job.trace.usage(self.job.prompt_tokens, self.completion_tokens, self.finish_reason)
        self.metrics.prompt_tokens.inc(self.job.prompt_tokens)
        self.metrics.completion_tokens.inc(self.completion_tokens)

    def _ended_early(self, text: bytes) -> bool:
        """Whether the engine ended before max_tokens (an end token or stop word).

        The engine contract counts the engine's own tokens: fewer than max_tokens is an early end. The text
        contract gives bytes only. A text of fewer bytes than max_tokens proves an early end (every token
        but a special one, which the text leaves out, is at least one byte). Otherwise the re-tokenized
        count is an estimate of the engine's (a sampled answer may split differently, by a few percent):
        clearly under max_tokens (RETOKENIZED_MARGIN) is taken as an early end, near or over it as a cut."""
        if self.count_tokens is None:
            return self.completion_tokens < self.job.max_tokens
        return (
            len(text) < self.job.max_tokens
            or self.completion_tokens < RETOKENIZED_MARGIN * self.job.max_tokens
        )

    def usage(self) -> dict:
        return {
            "prompt_tokens": self.job.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "total_tokens": self.job.prompt_tokens + self.completion_tokens,
        }


class Coalesced:
    """Iterate text pieces as they arrive, joined: each item is everything that came since the last one.

    A task reads `source` (the engine's pieces, via Generation.texts) while the consumer writes the
    previous item to the client. When the client side is behind (a busy event loop, a slow socket),
    several pieces wait in the buffer and go out as one SSE chunk: one JSON encode, one trip down the
    ASGI send chain and one socket write for all of them. Pieces still concatenate to the full text.
    """

    def __init__(self, source: AsyncGenerator[str, None]):
        self.source = source
        self.buffer: list[str] = []
        self.done = False
        self.error: BaseException | None = None
        self.waiter: asyncio.Future | None = None
        self.task = asyncio.ensure_future(self._pump())

    async def _pump(self) -> None:
        try:
            async for text in self.source:
                if text:
                    self.buffer.append(text)
                    self._wake()
        except Exception as exc:  # noqa: BLE001 - handed to the consumer, which raises it after the text before it
            self.error = exc
        finally:
            self.done = True
            self._wake()

    def _wake(self) -> None:
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_result(None)

    def __aiter__(self):
        return self

    async def __anext__(self) -> str:
        while not self.buffer:
            if self.done:
                if self.error is not None:
                    raise self.error
                raise StopAsyncIteration
            self.waiter = asyncio.get_running_loop().create_future()
            await self.waiter
            # one more turn of the loop: pieces already on their way join this chunk
            await asyncio.sleep(0)
        text = self.buffer[0] if len(self.buffer) == 1 else "".join(self.buffer)
        self.buffer.clear()
        return text

    async def aclose(self) -> None:
        """Stop reading (the source's own cleanup cancels the Triton request) and close the source."""
        if not self.task.done():
            self.task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self.task
        await self.source.aclose()


class SseFormatter:
    """Server-sent events in OpenAI's chunk format; the constant part of each chunk is built once."""

    def __init__(self, job: Job):
        self.job = job
        head = {"id": job.id, "created": job.created, "model": job.model}
        if job.kind == "chat":
            head["object"] = "chat.completion.chunk"
            self._text_prefix = _json_prefix(head) + ',"choices":[{"index":0,"delta":{"content":'
            self._text_suffix = '},"logprobs":null,"finish_reason":null}]'
        else:
            head["object"] = "text_completion"
            self._text_prefix = _json_prefix(head) + ',"choices":[{"index":0,"text":'
            self._text_suffix = ',"logprobs":null,"finish_reason":null}]'
        self._head = head
        self._usage_null = ',"usage":null}' if job.include_usage else "}"

    def first(self) -> bytes | None:
        """Chat streams open with the assistant role, as OpenAI's do."""
        if self.job.kind != "chat":
            return None
        choice = {
            "index": 0,
            "delta": {"role": "assistant", "content": ""},
            "logprobs": None,
            "finish_reason": None,
        }
        return self._event({**self._head, "choices": [choice], **self._usage_field()})

    def text(self, text: str) -> bytes:
        piece = json.dumps(text, ensure_ascii=False)
        return f"data: {self._text_prefix}{piece}{self._text_suffix}{self._usage_null}\n\n".encode()

    def end(self, generation: Generation) -> bytes:
        if self.job.kind == "chat":
            choice = {
                "index": 0,
                "delta": {},
                "logprobs": None,
                "finish_reason": generation.finish_reason,
            }
        else:
            choice = {
                "index": 0,
                "text": "",
                "logprobs": None,
                "finish_reason": generation.finish_reason,
            }
        out = self._event({**self._head, "choices": [choice], **self._usage_field()})
        if self.job.include_usage:
            out += self._event({**self._head, "choices": [], "usage": generation.usage()})
        return out + b"data: [DONE]\n\n"

    def error(self, body: dict) -> bytes:
        return self._event(body) + b"data: [DONE]\n\n"

    def _usage_field(self) -> dict:
        return {"usage": None} if self.job.include_usage else {}

    @staticmethod
    def _event(payload: dict) -> bytes:
        return (
            f"data: {json.dumps(payload, ensure_ascii=False, separators=(',', ':'))}\n\n".encode()
        )


def _json_prefix(head: dict) -> str:
    """'{"id":...,"model":...' without the closing brace, so more fields can follow."""
    return json.dumps(head, ensure_ascii=False, separators=(",", ":"))[:-1]
