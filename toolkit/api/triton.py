"""Generation over Triton's gRPC streaming API, with one long-lived asyncio channel for the streams.

Each request opens its own bidirectional `ModelStreamInfer` call on the shared channel, so it
can be cancelled alone: closing the `generate` iterator before the final response cancels the
gRPC call, Triton marks the request cancelled, and the engine stops generating for it.

The streams are read straight from the generated gRPC stub (one `write` of the request, then a
`read` per response) rather than through tritonclient's `stream_infer`: that wraps every response
(one per streamed token) in two more iterator layers and an InferResult, and every request in a
task of its own that feeds its request iterator. tritonclient's client stays for health checks.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import secrets
import time
from collections.abc import AsyncGenerator
from dataclasses import dataclass
from typing import Any

import grpc
import numpy as np
import tritonclient.grpc.aio as grpcclient
from tritonclient.grpc import InferResult, service_pb2_grpc
from tritonclient.utils import InferenceServerException

from toolkit.api.engine_http import HttpEngineError, HttpEnginePool, request_body
from toolkit.api.features import Features, TokenLogprob, token_logprobs
from toolkit.api.wire import output_array, request_message
from toolkit.errors import ClientError
from toolkit.model.tokens import TokenFacts
from toolkit.repository import contract as c
from toolkit.repository.sources import common_module
from toolkit.settings import ApiLimits

pack_word_lists = common_module("textcodec").pack_word_lists
log = logging.getLogger("toolkit.api")

FINAL_FLAG = "triton_final_response"
TRACEPARENT = "traceparent"  # W3C trace context: gRPC metadata key and request parameter name
# Sent right after `traceparent` on a gRPC call. tritonserver reads a metadata value as a C string
# (GrpcServerCarrier::Get returns the value's data(), which is not NUL-terminated): whatever follows
# the value joins it, the W3C length check fails and Triton traces nothing of the request (3.0 % of
# traced gRPC requests, perf/results/grpc_trace_context.md). With another entry next, what follows is
# mostly that entry's first byte, 0x00 (0.33 %). Triton's propagators never read this key.
TRACEPARENT_GUARD = ("toolkit-traceparent-end", "1")
# Tokens per streamed response after the first: a request parameter the Python engines honour
# (model_repo/common/engine_requests.py; capabilities.engine_stream_interval).
STREAM_INTERVAL = "stream_interval"
ENGINE_MODEL = c.ENGINE  # the engine contract: token ids in, token ids out
# Triton's words for a model that can serve nothing at all (not one request refused): its Python-backend
# stub died ("Stub process 'tensorrt_llm_0_0' is not healthy."), or the model was unloaded.
FATAL_ERRORS = ("is not healthy", "Request for unknown model", "has no available versions")
STALL_S = 5.0  # a stream without a response this long makes the backend check that its engine still answers
PROBE_TIMEOUT_S = (
    5.0  # how long /health waits for a check (which itself may run to the stall timeout)
)
PROBE_INTERVAL_S = 5.0  # at most one check this often, however many streams or health calls ask
WATCH_INTERVAL_S = 1.0
# tritonclient's channel options: messages of any size it can frame (a long prompt's ids, log prob outputs).
MAX_MESSAGE_BYTES = 2**31 - 1
CHANNEL_OPTIONS = (
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
)
# Nothing from the engine, on any request or check, this long while a request waits: the engine does not
# respond (a hung GPU step, a deadlocked backend stub). Meant to be far above the slowest normal wait for a
# token: the CPU engine spreads a long prompt's prefill over steps of at most max_num_tokens (256) tokens,
# which serve the checks too; a GPU engine prefills a long prompt in under a second to tens of seconds. (A
# busy engine keeps answering its other streams or the one-token checks: a slow request alone is no stall.)
# `toolkit api/serve --stall-timeout` (toolkit.settings.ApiLimits).
STALL_TIMEOUT_S = ApiLimits().stall_timeout_s


class TritonUnavailable(ClientError):
    """Triton cannot be reached, or refused the call as a whole."""


class InferenceFailed(ClientError):
    """Triton answered the request with an error (the message is the model's own)."""


class EngineFault(InferenceFailed):
    """The engine can serve nothing (its stub died, its model is gone): every open stream ends with this."""


class EngineStalled(InferenceFailed):
    """The engine answered nothing for the stall timeout while this request waited: it does not respond."""


@dataclass(eq=False)
class _Stream:
    """One open generation, as the watchdog sees it."""

    call: Any  # the gRPC stream call
    last: float  # loop time of its last response (or of its start)
    # Set, and the call cancelled, when the engine is found dead (EngineFault) or hung (EngineStalled).
    failure: InferenceFailed | None = None


@dataclass(frozen=True)
class Sampling:
    """Sampling settings in OpenAI's terms; `tensors` turns them into Triton inputs."""

    temperature: float | None = None
    top_p: float | None = None
    seed: int | None = None
    min_tokens: int | None = None  # extension: no end token before this many generated tokens
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    repetition_penalty: float | None = None  # extension (TensorRT-LLM's and vLLM's)
    # (token id, bias) pairs added to the logits (the engine contract's embedding_bias)
    logit_bias: tuple[tuple[int, float], ...] = ()

    @property
    def greedy(self) -> bool:
        return self.temperature == 0 or self.top_p == 0

    def tensors(
        self, engine: bool, names: dict[str, str] | None = None
    ) -> list[tuple[str, np.ndarray, str]]:
        """Inputs for the engine contract (runtime_top_k, ...) or the text contract (top_k, ...).

        OpenAI samples unless told temperature 0; TensorRT-LLM decodes greedily unless top_k > 1 or
        top_p > 0 and gives every unseeded request seed 0. So a sampled request always carries a top_p
        (1.0: the whole distribution) and a seed (a random one when the client gives none, so that two
        identical requests do not return the same sample). `names` renames the inputs an older
        engine release reads under other names (min_tokens -> min_length, seed -> random_seed).
        """
        names = names or {}
        top_k, top_p = ("runtime_top_k", "runtime_top_p") if engine else ("top_k", "top_p")
        out = [
            (name, np.array([[value]], np.float32), "FP32")
            for name, value in (
                ("presence_penalty", self.presence_penalty),
                ("frequency_penalty", self.frequency_penalty),
            )
            if value
        ]
        if self.repetition_penalty is not None and self.repetition_penalty != 1.0:
            out.append(
                ("repetition_penalty", np.array([[self.repetition_penalty]], np.float32), "FP32")
            )
        if self.min_tokens:
            out.append(
                (
                    names.get("min_tokens", "min_tokens"),
                    np.array([[self.min_tokens]], np.int32),
                    "INT32",
                )
            )
        if self.greedy:
            # top_k 1: TensorRT-LLM's greedy
            return [*out, (top_k, np.array([[1]], np.int32), "INT32")]
        # OpenAI's seed is signed 64-bit; the engine's UINT64 takes a negative one as its two's complement.
        seed = secrets.randbits(63) if self.seed is None else self.seed % 2**64
        temperature = 1.0 if self.temperature is None else self.temperature
        return [
            *out,
            ("temperature", np.array([[temperature]], np.float32), "FP32"),
            (top_p, np.array([[1.0 if self.top_p is None else self.top_p]], np.float32), "FP32"),
            (names.get("seed", "seed"), np.array([[seed]], np.uint64), "UINT64"),
        ]


# Not frozen: one is made per streamed token, and a frozen dataclass sets each field through
# object.__setattr__ (several times the cost of a plain one). Nothing changes a piece once made.
@dataclass(slots=True)
class Piece:
    """One streamed response: the exact UTF-8 bytes of its new tokens, and the engine's running count."""

    data: bytes
    output_tokens: int | None  # cumulative generated tokens, when the engine reports them
    final: bool
    tokens: tuple[int, ...] = ()  # the new tokens' ids (the engine contract)
    index: int = 0  # the choice (sequence_index) they belong to
    logprobs: tuple[TokenLogprob, ...] = ()  # theirs, when asked
    reused_blocks: int | None = None  # KV blocks the prefix cache gave the request, when reported


class TritonBackend:
    """The gRPC client of one Triton server and one model.

    Two contracts: the engine's (`tensorrt_llm`: token ids in and out; the API tokenizes and
    detokenizes) or the text one (`ensemble`, `tensorrt_llm_bls`: text in, text bytes out).
    Only the engine contract lets a cancellation reach the engine: Triton (up to 2.51 at least)
    checks an ensemble's cancellation only between its steps, and its Python backend cannot
    cancel a BLS sub-request, so an engine step already running keeps generating.

    A dead engine is not left to hang its streams or to look healthy: Triton keeps answering
    model-ready after a Python-backend stub is killed, and the requests already sent to it never
    get another response. So a fatal error (FATAL_ERRORS) on any request, or a one-token check
    that fails so (sent when a stream has been silent STALL_S), records `fault` and ends every
    open stream with EngineFault; `health()` reports the fault until a request succeeds again.

    Nor is a hung one (Triton ready, the engine silent: a deadlocked stub, a hung GPU step): when
    nothing at all has come from the engine, on any request or check, for `stall_timeout_s`, each
    stream that has waited that long ends with EngineStalled and `health()` reports `stalled`
    until any response comes again. A decoupled engine answers every step, so only a hung one is
    that silent; a --no-decoupled one answers once, at the end, so it is never judged so.
    """

    def __init__(
        self,
        url: str,
        model_name: str = ENGINE_MODEL,
        *,
        decoder=None,
        tokens: TokenFacts | None = None,
        decoupled: bool = True,
        trtllm_version: str | None = None,
        stall_timeout_s: float = STALL_TIMEOUT_S,
        vocab_size: int = 0,
        stream_interval: int = 1,
        engine_stream_interval: bool = False,
        engine_http_url: str | None = None,
        shared_fault=None,
    ):
        self.url = url
        # The engine's fault as any API worker found it (toolkit.api.workers.SharedFault; None: one process).
        self.shared_fault = shared_fault
        self._probe_answered = False  # whether the last one-token check got its answer
        self.vocab_size = vocab_size  # logits per step (embedding_bias is one bias per logit)
        self.model_name = model_name
        self.engine = model_name == ENGINE_MODEL
        if self.engine and (decoder is None or tokens is None):
            raise ClientError(
                f"the `{model_name}` model takes token ids: a token decoder and the end tokens are needed",
                hint="pass the repository's PromptCodec and TokenFacts",
            )
        self.decoder = decoder
        self.tokens = tokens
        self.decoupled = decoupled  # a --no-decoupled repository answers once: no streaming flag
        self.names = c.engine_renames(trtllm_version) if self.engine else {}
        # --stream-interval: an engine that honours it answers every `stream_interval` tokens itself (fewer
        # gRPC messages); else the API holds that many responses per chunk (`hold`: fewer writes only).
        self.stream_interval = stream_interval
        self.by_engine = self.engine and engine_stream_interval and stream_interval > 1
        # --engine-transport http: engine-contract streams over Triton's HTTP generate_stream (engine_http).
        self._http = HttpEnginePool(engine_http_url) if engine_http_url and self.engine else None
        self._client: grpcclient.InferenceServerClient | None = None
        self._channel: grpc.aio.Channel | None = None  # the streams' channel
        self._stub: service_pb2_grpc.GRPCInferenceServiceStub | None = None
        self._ids = itertools.count(1)
        self.fault: str | None = None  # why the engine cannot serve, as Triton said it
        self.stall_timeout_s = stall_timeout_s
        # Why the engine is taken not to respond; cleared by any response from it.
        self.stalled: str | None = None
        self._answered_at = float("-inf")  # loop time of the engine's last response, on any call
        self._streams: set[_Stream] = set()
        self._closing: set[asyncio.Future] = set()  # half-closes of finished calls, under way
        self._watchdog: asyncio.Task | None = None
        self._probe: asyncio.Task | None = None
        self._probed_at = float("-inf")
        # The checks come well within the stall timeout, so that a live engine answers one in time.
        self._probe_after_s = min(STALL_S, stall_timeout_s / 4)
        self._probe_every_s = min(PROBE_INTERVAL_S, stall_timeout_s / 4)
        self._watch_every_s = min(WATCH_INTERVAL_S, stall_timeout_s / 8)

    async def start(self) -> None:
        """Open the channel and start the stream watchdog; call inside the event loop that will use it."""
        self._client = grpcclient.InferenceServerClient(self.url)
        self._channel = grpc.aio.insecure_channel(self.url, options=CHANNEL_OPTIONS)
        self._stub = service_pb2_grpc.GRPCInferenceServiceStub(self._channel)
        self._watchdog = asyncio.ensure_future(self._watch_streams())

    async def close(self) -> None:
        for task in (self._watchdog, self._probe):
            if task is not None:
                task.cancel()
        if self._client is not None:
            await self._client.close()
            self._client = None
        if self._channel is not None:
            await self._channel.close()
            self._channel = self._stub = None
        if self._http is not None:
            await self._http.close()

    def _stream_call(self, metadata: tuple[tuple[str, str], ...] | None):
        """A new bidirectional ModelStreamInfer call on the streams' channel (requests written by the caller)."""
        if self._stub is None:
            raise TritonUnavailable(
                "the Triton client is not started", hint="use the app inside its lifespan"
            )
        return self._stub.ModelStreamInfer(metadata=metadata)

    @property
    def client(self) -> grpcclient.InferenceServerClient:
        if self._client is None:
            raise TritonUnavailable(
                "the Triton client is not started", hint="use the app inside its lifespan"
            )
        return self._client

    async def health(self, timeout_s: float = 2.0) -> str | None:
        """None when Triton, the model and its engine can serve; else why not."""
        try:
            if not await self.client.is_server_ready(client_timeout=timeout_s):
                return f"Triton at {self.url} is not ready."
            if not await self.client.is_model_ready(self.model_name, client_timeout=timeout_s):
                return f"Triton at {self.url} has no ready model `{self.model_name}`."
        except (InferenceServerException, grpc.RpcError, asyncio.TimeoutError) as exc:
            return f"Triton at {self.url} does not answer ({_first_line(exc)})."
        if self._http is not None and (problem := await self._http.ready(timeout_s)):
            return (
                f"Triton's HTTP port {self._http.url}, which the engine's streams are read over, "
                f"{problem}."
            )
        if self.fault is not None or self.stalled is not None:
            await self.check_engine()  # has it come back?
        elif self.shared_fault is not None and self.shared_fault.raised:
            # another worker found a fault: check the engine from here too (one-token check)
            if await self.check_engine():
                self.shared_fault.clear()  # it answered: it serves
            elif self.fault is None and self.stalled is None:
                return (
                    f"The engine of `{self.model_name}` cannot serve: {self.shared_fault.get()} (as "
                    "another API worker found; this one's check had no answer in time)"
                )
        if self.fault is not None:
            return f"The engine of `{self.model_name}` cannot serve: {self.fault}"
        if self.stalled is not None:
            return f"The engine of `{self.model_name}` does not respond: {self.stalled}"
        return None

    async def check_engine(self) -> bool:
        """Send a one-token request (one at a time, at most every PROBE_INTERVAL_S): a fatal error records the
        fault and ends every open stream, an answer clears the fault and the stall, no answer in time (busy)
        changes nothing. Waits for the check at most PROBE_TIMEOUT_S (it goes on in the background).
        Whether the check (this one, or the last one when it ran too recently) got its answer."""
        probe = self._start_probe()
        if probe is not None:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(asyncio.shield(probe), PROBE_TIMEOUT_S)
            if not probe.done():
                return False
        return self._probe_answered

    def _start_probe(self) -> asyncio.Task | None:
        """The check running now, or a new one; None when the last one ended too recently."""
        loop = asyncio.get_running_loop()
        if self._probe is None or self._probe.done():
            if loop.time() - self._probed_at < self._probe_every_s:
                return None
            self._probed_at = loop.time()
            self._probe = asyncio.ensure_future(self._run_probe())
        return self._probe

    @property
    def _tokens(self) -> TokenFacts:
        """The end tokens the engine contract needs (checked present at construction)."""
        if self.tokens is None:
            raise ClientError(
                "the engine contract needs the repository's end tokens", hint="pass tokens="
            )
        return self.tokens

    async def _run_probe(self) -> None:
        tokens = self._tokens if self.engine else None
        ids = [tokens.end_id if tokens.bos_id is None else tokens.bos_id] if tokens else []
        self._probe_answered = False
        try:
            await asyncio.wait_for(
                self._consume(self.generate("a", ids, 1, _GREEDY, watched=False)),
                # A check waits behind the step in progress and answers when the next one ends: with
                # slow steps (a big model on the CPU engine: seconds each) that takes long, and an
                # unanswered check is no evidence of a hang. So it stays out as long as the stall
                # timeout; a caller that must not wait that long (/health) waits PROBE_TIMEOUT_S.
                self.stall_timeout_s,
            )
            self._probe_answered = True
        except (asyncio.TimeoutError, InferenceFailed, TritonUnavailable):
            pass  # a fatal error has been recorded by generate; anything else says nothing of the engine
        except Exception:  # noqa: BLE001 - no check may end the watchdog's work; the error goes to the log
            log.exception("checking the engine of %s failed", self.model_name)

    @staticmethod
    async def _consume(pieces: AsyncGenerator[Piece, None]) -> None:
        async for _ in pieces:
            pass

    async def _watch_streams(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(self._watch_every_s)
            now = loop.time()
            try:
                self._end_stalled_streams(now)
                if any(now - stream.last > self._probe_after_s for stream in self._streams):
                    self._start_probe()  # not awaited: the stall rule keeps its pace while a check waits
            except Exception:  # noqa: BLE001 - the watchdog outlives any one round; the error goes to the log
                log.exception("watching the streams of %s failed", self.model_name)

    def _end_stalled_streams(self, now: float) -> None:
        """When the engine has answered nothing, on any call, for the stall timeout: end every stream that
        has waited that long (a younger one gets its own full wait) and record the stall."""
        timeout = self.stall_timeout_s
        if not self.decoupled or now - self._answered_at < timeout:
            return
        silent = [s for s in self._streams if s.failure is None and now - s.last >= timeout]
        if not silent:
            return
        if self.stalled is None:
            log.warning(
                "the engine of %s answered nothing for %g s while %d request(s) waited: ending them",
                self.model_name,
                timeout,
                len(silent),
            )
        self.stalled = (
            f"it answered nothing for {timeout:g} s (the stall timeout) while requests waited, not even a "
            "one-token check: a hung engine step or a deadlocked backend"
        )
        if self.shared_fault is not None:
            self.shared_fault.set(f"it does not respond: {self.stalled}")
        for stream in silent:
            stream.failure = EngineStalled(
                f"The engine of `{self.model_name}` stalled: it answered nothing for {timeout:g} s while this "
                "request waited (a hung engine step or a deadlocked backend); retry later."
            )
            stream.call.cancel()

    def _answered(self, now: float) -> None:
        self._answered_at = now
        if self.stalled is not None:
            log.info("the engine of %s answers again", self.model_name)
            self.stalled = None

    def _serves_again(self) -> None:
        """The engine answered a whole request: no fault, here or in the other workers' shared record."""
        self.fault = None
        if self.shared_fault is not None and self.shared_fault.raised:
            self.shared_fault.clear()

    def _engine_failed(self, message: str) -> None:
        """Record the fault (for the other workers too) and end every open stream with it."""
        self.fault = message
        if self.shared_fault is not None:
            self.shared_fault.set(message)
        for stream in list(self._streams):
            if stream.failure is None:
                stream.failure = EngineFault(message)
                stream.call.cancel()

    def engine_interval(self, stops: bool) -> int:
        """The stream_interval a request asks the engine for: 1 (every step) unless the engine honours it and
        the request has no stop strings (the API cuts those between tokens, so their tokens come one by one)."""
        return self.stream_interval if self.by_engine and not stops else 1

    def hold(self, stops: bool) -> int:
        """Engine responses per chunk the API holds itself: the interval where the engine does not keep it."""
        return 1 if self.engine_interval(stops) > 1 else self.stream_interval

    def generate(
        self,
        prompt: str,
        prompt_ids: list[int],
        max_tokens: int,
        sampling: Sampling,
        *,
        features: Features | None = None,
        watched: bool = True,
        traceparent: str | None = None,
        timing=None,
        stops: bool = False,
    ) -> AsyncGenerator[Piece, None]:
        """Stream the pieces of one generation; closing the iterator early cancels the request.

        `watched`: the watchdog checks the engine when this stream stalls (not for its own check).
        `traceparent`: the W3C trace context of the caller's span, sent as gRPC metadata or an HTTP header
        (Triton's spans) and as a request parameter (the engines', and an ensemble passes it to its steps).
        `timing`: has `detokenize_ns` summed into it (toolkit.api.tracing.RequestTrace).
        `stops`: the request has stop strings (the engine then answers every step: engine_interval).

        Over Triton's HTTP generate_stream (--engine-transport http) when the engine contract is served
        that way and the request needs none of what its JSON cannot carry cheaply (log prob arrays, a
        vocabulary-long logit bias); over gRPC otherwise."""
        features = features or Features(cached_tokens=False)
        if (
            self._http is not None
            and self.decoupled
            and not features.logprobs
            and not sampling.logit_bias
        ):
            return self._generate_http(
                prompt_ids, max_tokens, sampling, features, watched, traceparent, timing, stops
            )
        return self._generate_grpc(
            prompt, prompt_ids, max_tokens, sampling, features, watched, traceparent, timing, stops
        )

    @property
    def http_engine(self) -> bool:
        """Whether engine streams go over Triton's HTTP generate_stream (--engine-transport http)."""
        return self._http is not None

    async def _generate_http(
        self,
        prompt_ids: list[int],
        max_tokens: int,
        sampling: Sampling,
        features: Features,
        watched: bool,
        traceparent: str | None,
        timing,
        stops: bool,
    ) -> AsyncGenerator[Piece, None]:
        """generate() over Triton's HTTP generate_stream: one SSE event per engine response; the end of
        the HTTP response is the final one; closing the connection before it cancels the request."""
        assert self._http is not None
        tensors, _ = self._engine_tensors(prompt_ids, max_tokens, sampling, features)
        parameters: dict = {}
        if (interval := self.engine_interval(stops)) > 1:
            parameters[STREAM_INTERVAL] = interval
        if traceparent is not None:
            parameters[TRACEPARENT] = traceparent
        call = self._http.stream(self.model_name, request_body(tensors, parameters), traceparent)
        loop = asyncio.get_running_loop()
        stream = _Stream(call, loop.time())
        if watched:
            self._streams.add(stream)
        total = 0
        try:
            async with contextlib.aclosing(call.events()) as events:
                async for event in events:
                    stream.last = loop.time()
                    self._answered(stream.last)
                    if "error" in event:
                        raise self._failure(str(event["error"]))
                    piece = self._json_piece(event, total, timing)
                    total = piece.output_tokens or total
                    yield piece
            self._serves_again()
            yield Piece(b"", total, True)
        except asyncio.CancelledError:
            if stream.failure is None or _cancel_requested():
                raise
            raise stream.failure from None  # only the watchdog cancelled the call
        except HttpEngineError as exc:
            if stream.failure is not None:
                raise stream.failure from exc
            raise TritonUnavailable(f"Triton at {self._http.url}: {exc}") from exc
        finally:
            self._streams.discard(stream)
            if not call.finished:
                call.cancel()

    def _json_piece(self, event: dict, total: int, timing=None) -> Piece:
        """One generate_stream event of the engine contract: a one-element output is a bare number."""
        ids, length = event.get("output_ids"), _first(event.get("sequence_length"))
        index = _first(event.get("sequence_index")) or 0
        reused_blocks = _first(event.get("kv_cache_reused_blocks"))
        if ids is None or not length:
            return Piece(b"", total, False, (), index, (), reused_blocks)
        tokens = (ids,) if isinstance(ids, int) else tuple(_flat(ids)[:length])
        data = self._decode(tokens, timing)
        return Piece(data, total + len(tokens), False, tokens, index, (), reused_blocks)

    def _decode(self, tokens: tuple[int, ...], timing=None) -> bytes:
        """The tokens' bytes; `timing`: the time it took summed into its detokenize_ns."""
        if timing is None:
            return self.decoder.decode_bytes(tokens)
        started = time.perf_counter_ns()
        data = self.decoder.decode_bytes(tokens)
        timing.detokenize_ns += time.perf_counter_ns() - started
        return data

    async def _generate_grpc(
        self,
        prompt: str,
        prompt_ids: list[int],
        max_tokens: int,
        sampling: Sampling,
        features: Features,
        watched: bool,
        traceparent: str | None,
        timing,
        stops: bool,
    ) -> AsyncGenerator[Piece, None]:
        """generate() over gRPC: one ModelStreamInfer call, a message per engine response."""
        request = (
            self._engine_request(prompt_ids, max_tokens, sampling, features)
            if self.engine
            else self._text_request(prompt, max_tokens, sampling, features)
        )
        if (interval := self.engine_interval(stops)) > 1:
            request.parameters[STREAM_INTERVAL].int64_param = interval
        metadata = None
        if traceparent is not None:
            request.parameters[TRACEPARENT].string_param = traceparent
            metadata = ((TRACEPARENT, traceparent), TRACEPARENT_GUARD)
        call = self._stream_call(metadata)
        loop = asyncio.get_running_loop()
        stream = _Stream(call, loop.time())
        if watched:
            self._streams.add(stream)
        finished = False
        total = 0
        try:
            await call.write(request)
            while (response := await call.read()) is not grpc.aio.EOF:
                stream.last = loop.time()
                self._answered(stream.last)
                if response.error_message:
                    raise self._failure(response.error_message)
                piece = (
                    self._engine_piece(response.infer_response, total, features, timing)
                    if self.engine
                    else _text_piece(InferResult(response.infer_response))
                )
                total = piece.output_tokens if piece.output_tokens is not None else total
                finished = piece.final
                if finished:
                    self._serves_again()
                yield piece
                if finished:
                    break
            else:
                finished = True  # the stream ended without a final flag: nothing more will come
        except asyncio.CancelledError:
            if stream.failure is None or _cancel_requested():
                raise  # the client went away (or the app shuts down), even as the watchdog failed the call
            raise stream.failure from None  # only the watchdog cancelled the call
        except grpc.aio.AioRpcError as exc:
            if stream.failure is not None:
                raise stream.failure from exc
            # Our own cancellations surface as asyncio.CancelledError; a CANCELLED status here came from the server.
            raise TritonUnavailable(
                f"Triton at {self.url}: {exc.code().name}: {exc.details()}"
            ) from exc
        finally:
            self._streams.discard(stream)
            if finished:
                self._close_sending(call)
            else:
                call.cancel()

    def _close_sending(self, call) -> None:
        """Half-close a finished call, in the background: Triton ends a stream only once the client's side
        is closed (it waits for more requests on it), and the response need not wait for that."""
        closing = asyncio.ensure_future(call.done_writing())
        self._closing.add(closing)
        closing.add_done_callback(self._closing.discard)
        closing.add_done_callback(_closed)

    def _failure(self, message: str) -> InferenceFailed:
        if any(marker in message for marker in FATAL_ERRORS):
            self._engine_failed(message)
            return EngineFault(message)
        return InferenceFailed(message)

    def _engine_request(
        self, prompt_ids: list[int], max_tokens: int, sampling: Sampling, features: Features
    ):
        return self._request(*self._engine_tensors(prompt_ids, max_tokens, sampling, features))

    def _engine_tensors(
        self, prompt_ids: list[int], max_tokens: int, sampling: Sampling, features: Features
    ) -> tuple[list[tuple[str, np.ndarray, str]], list[str]]:
        """The engine contract's inputs for one request, and the outputs it asks for."""
        tensors = [
            ("input_ids", np.array([prompt_ids], np.int32), "INT32"),
            ("input_lengths", np.array([[len(prompt_ids)]], np.int32), "INT32"),
            ("request_output_len", np.array([[max_tokens]], np.int32), "INT32"),
            ("end_id", np.array([[self._tokens.end_id]], np.int32), "INT32"),
            ("pad_id", np.array([[self._tokens.pad_id]], np.int32), "INT32"),
            ("streaming", np.array([[self.decoupled]], bool), "BOOL"),
            ("exclude_input_in_output", np.array([[True]], bool), "BOOL"),
            *sampling.tensors(engine=True, names=self.names),
            *features.tensors(self.names),
        ]
        if sampling.logit_bias:
            tensors.append(("embedding_bias", self._embedding_bias(sampling.logit_bias), "FP32"))
        # The model's other end tokens, as preprocessing adds them.
        stop_ids = self._tokens.stop_ids
        if stop_ids and not sampling.min_tokens:
            tensors.append(("stop_words_list", pack_word_lists([[[i] for i in stop_ids]]), "INT32"))
        return tensors, ["output_ids", "sequence_length", *features.outputs()]

    def _embedding_bias(self, biases: tuple[tuple[int, float], ...]) -> np.ndarray:
        """[1, vocab] FP32: each biased token's bias, 0 elsewhere (added to the logits before sampling)."""
        bias = np.zeros((1, self.vocab_size), np.float32)
        for token, value in biases:
            bias[0, token] = value
        return bias

    def _text_request(self, prompt: str, max_tokens: int, sampling: Sampling, features: Features):
        tensors = [
            ("text_input", np.array([[prompt.encode("utf-8")]], dtype=object), "BYTES"),
            ("max_tokens", np.array([[max_tokens]], np.int32), "INT32"),
            ("stream", np.array([[self.decoupled]], bool), "BOOL"),
            ("exclude_input_in_output", np.array([[True]], bool), "BOOL"),
            *sampling.tensors(engine=False),
            # Only guides and the LoRA adapter pass the text models.
            *Features(
                guide=features.guide, cached_tokens=False, lora_task_id=features.lora_task_id
            ).tensors({}),
        ]
        return self._request(tensors, None)

    def _request(self, tensors, outputs: list[str] | None):
        return request_message(self.model_name, f"api-{next(self._ids)}", tensors, outputs)

    def _engine_piece(self, response, total: int, features: Features, timing=None) -> Piece:
        """Read the raw INT32 outputs straight from the ModelInferResponse protobuf (one per streamed token:
        kept cheap, by index rather than by iterating its repeated fields); the outputs of the features
        asked for, when any, as arrays. `timing`: detokenize_ns summed into it."""
        parameters = response.parameters
        final = FINAL_FLAG in parameters and parameters[FINAL_FLAG].bool_param
        outputs, raws = response.outputs, response.raw_output_contents
        ids = length = None
        extras: dict[str, np.ndarray] = {}
        for i in range(min(len(outputs), len(raws))):
            output = outputs[i]
            name = output.name
            if name == "output_ids":  # [batch 1, beam 1, new tokens], INT32 little-endian
                ids = raws[i]
            elif name == "sequence_length":
                length = int.from_bytes(raws[i][:4], "little", signed=True)
            else:
                extras[name] = output_array(output, raws[i])
        index, reused_blocks = 0, None
        if extras:
            if "sequence_index" in extras:
                index = int(extras["sequence_index"].reshape(-1)[0])
            if "kv_cache_reused_blocks" in extras:
                reused_blocks = int(extras["kv_cache_reused_blocks"].reshape(-1)[0])
        if ids is None or not length:
            return Piece(b"", total, final, (), index, (), reused_blocks)
        if length == 1:
            tokens: tuple[int, ...] = (int.from_bytes(ids[:4], "little", signed=True),)
        else:
            tokens = tuple(np.frombuffer(ids, "<i4")[:length].tolist())
        logprobs = token_logprobs(extras, list(tokens), features.top_logprobs) if extras else ()
        data = self._decode(tokens, timing)
        return Piece(data, total + len(tokens), final, tokens, index, logprobs, reused_blocks)


_GREEDY = Sampling(temperature=0)


def _closed(closing: asyncio.Future) -> None:
    """A half-close has ended: an error there (the call ended meanwhile) says nothing about the request."""
    if not closing.cancelled():
        closing.exception()


def _cancel_requested() -> bool:
    """Whether this task was cancelled (Task.cancel), not only the gRPC call it awaited (call.cancel, the
    watchdog's). Python 3.10 cannot tell them apart: there, a stream the watchdog failed ends with the
    fault even when its client went away at the same moment."""
    task = asyncio.current_task()
    cancelling = getattr(task, "cancelling", None)  # Python 3.11+
    return cancelling is not None and cancelling() > 0


def _first(value):
    """A one-element output of a generate_stream event: a bare number, or the first of a list."""
    while isinstance(value, list):
        value = value[0] if value else None
    return value


def _flat(value) -> list[int]:
    """The token ids of a generate_stream output_ids, however nested."""
    if not isinstance(value, list):
        return [value]
    return [i for v in value for i in _flat(v)]


def _first_line(exc: BaseException) -> str:
    text = exc.details() if isinstance(exc, grpc.RpcError) and hasattr(exc, "details") else str(exc)
    return (str(text or type(exc).__name__).splitlines() or [""])[0]


def _text_piece(result) -> Piece:
    """The text bytes of one response; the pinned release returns no token count (Generation counts the text)."""
    response = result.get_response()
    final = FINAL_FLAG in response.parameters and response.parameters[FINAL_FLAG].bool_param
    data = b""
    if any(output.name == "text_output" for output in response.outputs):
        text = result.as_numpy("text_output")
        if text is not None and text.size:
            data = b"".join(
                item if isinstance(item, bytes) else str(item).encode() for item in text.reshape(-1)
            )
    return Piece(data, None, final)
