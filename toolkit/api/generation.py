"""One generation: Triton pieces in, stop-checked text out, per choice, with usage, finish reasons, log probs,
tool calls and latency metrics."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncGenerator, Callable
from dataclasses import dataclass, field, replace
from json.encoder import encode_basestring  # json.dumps(text, ensure_ascii=False) of one str, in C
from typing import Any

from toolkit.api.features import Features, TokenLogprob
from toolkit.api.metrics import ApiMetrics
from toolkit.api.stops import StopScanner
from toolkit.api.tool_parsers import ParsedCall, ToolCallParser, new_call_id
from toolkit.api.tracing import RequestTrace
from toolkit.api.triton import Piece, Sampling, TritonBackend

# The text models (ensemble, BLS): a re-tokenized count under this share of max_tokens is an early end.
RETOKENIZED_MARGIN = 0.9


@dataclass(frozen=True)
class ToolSetup:
    """How a job's output becomes tool calls: `parse` (the family's parser, tool_choice auto), `required` (a
    guided JSON list of {"name", "parameters"}), or `named` (guided arguments of the one function)."""

    mode: str
    names: frozenset[str]
    parser: Callable[[], ToolCallParser] | None = None  # parse mode: a fresh parser per choice
    function: str | None = None  # named mode


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
    features: Features | None = None  # None: plain text (no log probs, one choice)
    tools: ToolSetup | None = None
    echo: str = ""  # completions' echo: the prompt text, before the answer
    first_index: int = 0  # completions with a list of prompts: this prompt's first choice index
    block_size: int = 0  # KV tokens per block (cached tokens = reused blocks x this)

    @property
    def n(self) -> int:
        return self.features.n if self.features is not None else 1


@dataclass
class Delta:
    """What one choice gets in one chunk: text, its tokens' log probs, and at its end its tool calls."""

    index: int
    text: str = ""
    logprobs: list[TokenLogprob] = field(default_factory=list)
    tool_calls: list[ParsedCall] | None = None

    def merged(self, other: Delta) -> Delta:
        return Delta(
            self.index, self.text + other.text, self.logprobs + other.logprobs, other.tool_calls
        )

    def __bool__(self) -> bool:
        return bool(self.text or self.logprobs or self.tool_calls)


class ChoiceOutput:
    """One choice's text as it is generated: stop strings, tool calls, token count, finish reason."""

    def __init__(self, job: Job, index: int):
        self.job = job
        self.index = index
        self.scanner = StopScanner(list(job.stops))
        tools = job.tools
        make_parser = tools.parser if tools is not None and tools.mode == "parse" else None
        self.parser = make_parser() if make_parser is not None else None
        # Guided tool calls (required, named) come back whole at the end: nothing streams before.
        self.holds = tools is not None and tools.mode != "parse"
        self.held: list[str] = []
        self.completion_tokens = 0
        self.finish_reason = "length"
        self.shown: list[str] = []  # what the client got, for a whole body
        self.logprobs: list[TokenLogprob] = []
        self.tool_calls: list[ParsedCall] | None = None
        self.done = False

    def feed(self, piece: Piece) -> Delta:
        if self.done or self.scanner.stopped:
            return Delta(self.index)
        text = self.scanner.feed(piece.data)
        if self.parser is not None:
            text = self.parser.feed(piece.tokens, text)
        if self.holds:
            self.held.append(text)
            text = ""
        if not piece.logprobs:  # the common piece: text only (once per streamed token)
            self.shown.append(text)
            return Delta(self.index, text)
        return self._kept(Delta(self.index, text, list(piece.logprobs)))

    def finish(self, max_tokens: int) -> Delta:
        """The held-back text and the tool calls at the end of the output."""
        self.done = True
        text = self.scanner.flush()
        calls: list[ParsedCall] = []
        if self.parser is not None:
            text = self.parser.feed((), text) if text else ""
            held, calls = self.parser.finish()
            text += held
        elif self.holds and self.job.tools is not None:
            whole = "".join(self.held) + text
            calls = guided_calls(self.job.tools, whole)
            text = "" if calls else whole
        if self.scanner.stopped or self.completion_tokens < max_tokens:
            self.finish_reason = "stop"
        if calls:
            self.finish_reason = "tool_calls"
            self.tool_calls = calls
        return self._kept(Delta(self.index, text, [], calls or None))

    def _kept(self, delta: Delta) -> Delta:
        self.shown.append(delta.text)
        self.logprobs += delta.logprobs
        return delta


def guided_calls(tools: ToolSetup, text: str) -> list[ParsedCall]:
    """The calls of a guided output: the named function's arguments, or a list of {"name", "parameters"};
    none when it does not parse as such (the text is then the content)."""
    try:
        value = json.loads(text)
    except ValueError:
        return []
    if tools.mode == "named":
        if not isinstance(value, dict):
            return []
        name = tools.function or ""
        return [ParsedCall(name, json.dumps(value, ensure_ascii=False), new_call_id())]
    if not isinstance(value, list):
        return []
    calls = []
    for item in value:
        if not isinstance(item, dict) or item.get("name") not in tools.names:
            return []
        arguments = json.dumps(item.get("parameters", {}), ensure_ascii=False)
        calls.append(ParsedCall(item["name"], arguments, new_call_id()))
    return calls


class Generation:
    """Iterate `deltas()` (or, one choice, `texts()`) for what to send; afterwards each choice's
    `completion_tokens` and `finish_reason` hold."""

    def __init__(self, job: Job, backend: TritonBackend, metrics: ApiMetrics, count_tokens=None):
        self.job = job
        self.backend = backend
        self.metrics = metrics
        # The text models (ensemble, BLS) of the pinned release return no token count: their text is
        # counted with the repository's tokenizer when it ends (bytes -> tokens), an estimate: the engine's
        # own tokens need not be how the tokenizer splits their text.
        self.count_tokens = None if backend.engine else count_tokens
        self.received: list[bytes] = []
        self.choices = [ChoiceOutput(job, i) for i in range(job.n)]
        self.reused_blocks: int | None = None
        self.done = False

    # one choice (the common case), as callers read it
    @property
    def completion_tokens(self) -> int:
        return sum(choice.completion_tokens for choice in self.choices)

    @completion_tokens.setter
    def completion_tokens(self, value: int) -> None:
        self.choices[0].completion_tokens = value

    @property
    def finish_reason(self) -> str:
        return self.choices[0].finish_reason

    @finish_reason.setter
    def finish_reason(self, value: str) -> None:
        self.choices[0].finish_reason = value

    async def texts(self) -> AsyncGenerator[str, None]:
        """Text pieces (possibly empty) of choice 0, in order: one per engine response, then the tail."""
        async for delta in self.deltas():
            yield delta.text

    async def deltas(self) -> AsyncGenerator[Delta, None]:
        """Each choice's deltas (possibly empty) in order: one per engine response, then each one's tail."""
        job, metrics = self.job, self.metrics
        trace = job.trace
        # A traced request's context goes on to Triton, and the backend times its detokenizing.
        options: dict[str, Any] = {}
        if trace is not None:
            options = {"traceparent": trace.call(self.backend.model_name), "timing": trace}
        if job.features is not None:
            options["features"] = job.features
        if job.stops:
            options["stops"] = True
        self._sent = sent = time.perf_counter()
        metrics.admission.observe(sent - job.arrival)
        pieces = self.backend.generate(
            job.prompt, job.prompt_ids, job.max_tokens, job.sampling, **options
        )
        failed = False
        self._last: float | None = None
        try:
            async for piece in pieces:
                choice = self.choices[piece.index] if piece.index < len(self.choices) else None
                if piece.reused_blocks is not None:
                    self.reused_blocks = piece.reused_blocks
                if choice is None:
                    continue
                self._count(choice, piece)
                if self.count_tokens is not None:
                    self.received.append(piece.data)
                delta = choice.feed(piece)
                yield self._shown(choice, delta)
                if choice.scanner.stopped and all(c.scanner.stopped for c in self.choices):
                    break
            for choice in self.choices:
                yield self._shown(choice, self._finish(choice))
            self._record()
        except Exception:
            failed = True  # the engine or Triton failed it: not a cancellation
            metrics.failed.inc()
            raise
        finally:
            await pieces.aclose()  # cancels the Triton request if it is still running
            if not self.done and not failed:
                metrics.cancelled.inc()

    def _shown(self, choice: ChoiceOutput, delta: Delta) -> Delta:
        """The delta under its index in the response (completions with a list of prompts offset it)."""
        return (
            replace(delta, index=delta.index + self.job.first_index)
            if self.job.first_index
            else delta
        )

    def _count(self, choice: ChoiceOutput, piece: Piece) -> None:
        """Token counts and the latency metrics. The engine contract gives each response's tokens; a fake or
        older engine may give the running count of a one-choice request instead; the text contract
        neither (a piece counts one, until the text is counted at the end)."""
        now = time.perf_counter()
        if self.job.trace is not None:  # every response, the last one (no token: the end) too
            self.job.trace.response(time.time_ns())
        before = choice.completion_tokens
        if piece.tokens:
            choice.completion_tokens = before + len(piece.tokens)
        elif piece.output_tokens is not None and self.job.n == 1:
            choice.completion_tokens = max(before, piece.output_tokens)
        elif piece.data:
            choice.completion_tokens = before + 1
        new = choice.completion_tokens - before
        if not new:
            return
        if self._last is None:
            self.metrics.ttft.observe(now - self.job.arrival)
            self.metrics.engine_first.observe(now - self._sent)
        else:
            gap = (now - self._last) / new
            for _ in range(new):
                self.metrics.itl.observe(gap)
        self._last = now

    def _finish(self, choice: ChoiceOutput) -> Delta:
        if self.count_tokens is not None and choice.index == 0:
            text = b"".join(self.received)
            choice.completion_tokens = self.count_tokens(text)
            delta = choice.finish(self.job.max_tokens)
            if not choice.tool_calls:
                early = choice.scanner.stopped or self._ended_early(text)
                choice.finish_reason = "stop" if early else "length"
            return delta
        return choice.finish(self.job.max_tokens)

    def _record(self) -> None:
        self.done = True
        for choice in self.choices:
            self.metrics.finished.labels(choice.finish_reason).inc()
        if self.job.trace is not None:
            self.job.trace.usage(self.job.prompt_tokens, self.completion_tokens, self.finish_reason)
        self.metrics.prompt_tokens.inc(self.job.prompt_tokens)
        self.metrics.completion_tokens.inc(self.completion_tokens)

    def _ended_early(self, text: bytes) -> bool:
        """Whether the text model's engine ended before max_tokens (an end token or stop word).

        The text contract gives bytes only. A text of fewer bytes than max_tokens proves an early end (every
        token but a special one, which the text leaves out, is at least one byte). Otherwise the re-tokenized
        count is an estimate of the engine's (a sampled answer may split differently, by a few percent):
        clearly under max_tokens (RETOKENIZED_MARGIN) is taken as an early end, near or over it as a cut."""
        return (
            len(text) < self.job.max_tokens
            or self.choices[0].completion_tokens < RETOKENIZED_MARGIN * self.job.max_tokens
        )

    def usage(self) -> dict:
        usage: dict[str, Any] = {
            "prompt_tokens": self.job.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "total_tokens": self.job.prompt_tokens + self.completion_tokens,
        }
        if self.reused_blocks is not None and self.job.block_size:
            cached = min(self.reused_blocks * self.job.block_size, self.job.prompt_tokens)
            usage["prompt_tokens_details"] = {"cached_tokens": cached}
        return usage


def combined_usage(generations: list[Generation]) -> dict:
    """The usage of several generations (completions with a list of prompts) as one."""
    total: dict[str, Any] = {}
    for generation in generations:
        for key, value in generation.usage().items():
            if isinstance(value, dict):
                inner = total.setdefault(key, {})
                for name, count in value.items():
                    inner[name] = inner.get(name, 0) + count
            else:
                total[key] = total.get(key, 0) + value
    return total


class Coalesced:
    """Iterate pieces as they arrive, joined: each item is everything that came since the last one.

    A task reads `source` (the engine's pieces, via Generation.texts or .deltas) while the consumer writes
    the previous item to the client. When the client side is behind (a busy event loop, a slow socket),
    several pieces wait in the buffer and go out as one SSE chunk: one JSON encode, one trip down the
    ASGI send chain and one socket write for all of them. Text pieces are joined into one string (they
    still concatenate to the full text); deltas into one per choice, in the order the choices came.

    `hold`: each item waits for at least this many pieces (or the source's end): the API's side of
    --stream-interval where the engine answers every step (toolkit.api.triton.TritonBackend.hold).
    """

    def __init__(self, source: AsyncGenerator, hold: int = 1):
        self.source = source
        self.hold = max(1, hold)
        self.buffer: list = []
        self.done = False
        self.error: BaseException | None = None
        self.waiter: asyncio.Future | None = None
        self.task = asyncio.ensure_future(self._pump())

    async def _pump(self) -> None:
        try:
            async for item in self.source:
                if item:
                    self.buffer.append(item)
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

    async def __anext__(self):
        while len(self.buffer) < self.hold:
            if self.done:
                if self.buffer:
                    break  # what came before the end (or an error) goes first
                if self.error is not None:
                    raise self.error
                raise StopAsyncIteration
            self.waiter = asyncio.get_running_loop().create_future()
            await self.waiter
            # one more turn of the loop: pieces already on their way join this chunk
            await asyncio.sleep(0)
        items = self.buffer
        self.buffer = []
        return _joined(items)

    async def aclose(self) -> None:
        """Stop reading (the source's own cleanup cancels the Triton request) and close the source."""
        if not self.task.done():
            self.task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self.task
        await self.source.aclose()


def _joined(items: list):
    """Text pieces as one string; deltas as one list, one per choice (in the order the choices came)."""
    if isinstance(items[0], str):
        return items[0] if len(items) == 1 else "".join(items)
    if len(items) == 1:
        return items
    by_index: dict[int, Delta] = {}
    for delta in items:
        by_index[delta.index] = (
            by_index[delta.index].merged(delta) if delta.index in by_index else delta
        )
    return list(by_index.values())


def merged(sources: list[AsyncGenerator]) -> AsyncGenerator:
    """The items of several iterators as they come (completions with a list of prompts, streamed); one
    source is itself (no layer between it and its reader, once per streamed token): closing it cancels
    Triton at once, as closing the merge of several does."""
    return sources[0] if len(sources) == 1 else _interleaved(sources)


async def _interleaved(sources: list[AsyncGenerator]) -> AsyncGenerator:
    queue: asyncio.Queue = asyncio.Queue()
    end = object()

    async def pump(source):
        try:
            async for item in source:
                await queue.put(item)
        except Exception as exc:  # noqa: BLE001 - raised in the consumer
            await queue.put(exc)
        finally:
            await queue.put(end)

    tasks = [asyncio.ensure_future(pump(source)) for source in sources]
    running = len(tasks)
    try:
        while running:
            item = await queue.get()
            if item is end:
                running -= 1
            elif isinstance(item, Exception):
                raise item
            else:
                yield item
    finally:
        for task in tasks:
            task.cancel()
        for source in sources:
            with contextlib.suppress(Exception):
                await source.aclose()


class SseFormatter:
    """Server-sent events in OpenAI's chunk format; the constant part of each chunk is built once.

    `logprobs`: a function (index, token log probs) -> the choice's `logprobs` object, when the request
    asked for them."""

    def __init__(self, job: Job, logprobs: Callable | None = None, choices: int | None = None):
        self.job = job
        self.logprobs = logprobs
        self.choices = choices or job.n
        self.indexes = range(job.first_index, job.first_index + self.choices)
        head = {"id": job.id, "created": job.created, "model": job.model}
        head["object"] = "chat.completion.chunk" if job.kind == "chat" else "text_completion"
        self._head = head
        # A text chunk is these bytes around the JSON string of its text (built once per choice index).
        self._templates: dict[int, tuple[bytes, bytes]] = {}

    def first(self) -> bytes | None:
        """Chat streams open with the assistant role, as OpenAI's do (one chunk per choice)."""
        if self.job.kind != "chat":
            return None
        return b"".join(
            self._event(
                {
                    **self._head,
                    "choices": [
                        {
                            "index": index,
                            "delta": {"role": "assistant", "content": ""},
                            "logprobs": None,
                            "finish_reason": None,
                        }
                    ],
                    **self._usage_field(),
                }
            )
            for index in self.indexes
        )

    def text(self, text: str, index: int = 0) -> bytes:
        """A chunk of choice `index`'s text, nothing else: the common chunk, once per streamed token or
        batch of them, so only the text itself is encoded."""
        template = self._templates.get(index)
        if template is None:
            template = self._templates[index] = self._text_template(index)
        head, tail = template
        return b"".join((head, encode_basestring(text).encode(), tail))

    def _text_template(self, index: int) -> tuple[bytes, bytes]:
        """The bytes before and after the text's JSON string, split from a whole chunk so that they are
        exactly the JSON of the general path."""
        mark = "\x00"  # no text's JSON holds a raw NUL: it is escaped as \u0000
        if self.job.kind == "chat":
            choice = {"index": index, "delta": {"content": mark}}
        else:
            choice = {"index": index, "text": mark}
        choice.update({"logprobs": None, "finish_reason": None})
        whole = self._event({**self._head, "choices": [choice], **self._usage_field()})
        head, _, tail = whole.rpartition(json.dumps(mark).encode())
        return head, tail

    def reasoning(self, index: int, text: str) -> bytes:
        """A chat chunk of a reasoning model's <think> part (toolkit.api.reasoning), as reasoning_content."""
        choice = {
            "index": index,
            "delta": {"reasoning_content": text},
            "logprobs": None,
            "finish_reason": None,
        }
        return self._event({**self._head, "choices": [choice], **self._usage_field()})

    def delta(self, delta: Delta) -> bytes:
        if not delta.logprobs and not delta.tool_calls:
            return self.text(
                delta.text, delta.index
            )  # the common chunk, from its prebuilt template
        choice: dict = {"index": delta.index}
        if self.job.kind == "chat":
            body: dict = {"content": delta.text} if delta.text or not delta.tool_calls else {}
            if delta.tool_calls:
                body["tool_calls"] = [
                    {"index": i, **call.to_dict()} for i, call in enumerate(delta.tool_calls)
                ]
            choice["delta"] = body
        else:
            choice["text"] = delta.text
        choice["logprobs"] = (
            self.logprobs(delta.index, delta.logprobs)
            if self.logprobs is not None and delta.logprobs
            else None
        )
        choice["finish_reason"] = None
        return self._event({**self._head, "choices": [choice], **self._usage_field()})

    def end(self, generation: Generation | list[Generation], usage: dict | None = None) -> bytes:
        generations = generation if isinstance(generation, list) else [generation]
        out = b""
        for gen in generations:
            for choice in gen.choices:
                index = choice.index + gen.job.first_index
                if self.job.kind == "chat":
                    last = {"index": index, "delta": {}}
                else:
                    last = {"index": index, "text": ""}
                last.update({"logprobs": None, "finish_reason": choice.finish_reason})
                out += self._event({**self._head, "choices": [last], **self._usage_field()})
        if self.job.include_usage:
            usage = usage if usage is not None else generations[0].usage()
            out += self._event({**self._head, "choices": [], "usage": usage})
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
