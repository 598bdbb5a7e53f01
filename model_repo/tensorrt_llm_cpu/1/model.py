"""tensorrt_llm on CPU: the TensorRT-LLM backend's tensor contract over transformers' continuous batching.

Requests join and leave the running batch every step (in-flight batching) and their KV cache
lives in transformers' paged cache; we write no attention or cache code. This model only
translates the contract: it parses the request tensors, hands each request to the manager,
and routes the manager's per-step outputs back to each request's response sender, applying
end_id, min_tokens, stop words, request_output_len, streaming, `stop` requests and cancellation,
as the tensorrtllm backend does (sampling rule and defaults included: see `_sampling`).
Decoupled (streaming) by default; built with --no-decoupled it answers each request with one
response from execute.
"""

from __future__ import annotations

import math
import os
import sys
import threading
import time
from dataclasses import dataclass, field

import numpy as np
import triton_python_backend_utils as pb_utils

sys.path.insert(0, os.path.dirname(__file__))
from engine_metrics import EngineMetrics  # noqa: E402
from engine_requests import (  # noqa: E402
    NO_REQUEST_ID,
    Collector,
    Refusals,
    Timing,
    is_stop_request,
    perf_outputs,
)

from params import ModelParams, final_flag, scalar  # noqa: E402
from textcodec import Refused, unpack_word_list  # noqa: E402
from tracing import EngineTracer  # noqa: E402

RESULT_WAIT_S = 0.02
# Below this a temperature divides logits past float32's range (NaN probabilities); sampling at it
# is greedy decoding in all but name, so it is decoded greedily (TensorRT-LLM scales by 1/(t + 1e-6)).
GREEDY_BELOW_TEMPERATURE = 1e-5


def _final() -> int:
    return final_flag(pb_utils)


def _scalar(request, name: str, default=None):
    return scalar(pb_utils, request, name, default)


def _error(message: str):
    return pb_utils.InferenceResponse(error=pb_utils.TritonError(message))


@dataclass
class Stream:
    """One request in flight: what it asked for and what has been sent back."""

    request_id: str
    triton_id: str  # the client's request id: what a `stop` request names
    request: object
    sender: object
    prompt: list
    max_tokens: int
    end_id: int
    min_tokens: int
    stop_words: list
    streaming: bool
    exclude_input: bool
    want_perf: bool
    timing: Timing = field(default_factory=Timing)
    seen: int = 0
    tokens: list = field(default_factory=list)
    unsent: int = 0  # tokens appended since the last streamed response
    spans: object = None  # tracing.RequestSpans of a traced request, else None


class TritonPythonModel:
    def initialize(self, args):
        import torch
        from transformers import AutoModelForCausalLM, GenerationConfig
        from transformers.generation.configuration_utils import ContinuousBatchingConfig

        from sampling import install_seeded_sampler
        from scheduling import unblock_after_cancellation

        params = ModelParams(args)
        threads = params.integer("num_threads")
        if threads > 0:
            torch.set_num_threads(threads)
        self.decoupled = params.flag("decoupled")
        # What this repository does not honour (its capabilities), refused per request.
        self.refusals = Refusals(params.text("refusals"))
        self.max_seq_len = params.integer("max_seq_len")
        self.max_batch_size = params.max_batch_size
        self.max_queue_size = params.integer("max_queue_size")
        self.block_size = params.integer("kv_block_size")
        self.default_end_id = params.integer("end_id")
        self.default_exclude_input = params.flag("exclude_input_in_output")
        # Same parameter as the tensorrtllm backend: each is_cancelled() is a round trip to the server.
        self.cancel_check_s = params.integer("cancellation_check_period_ms") / 1000
        checkpoint = os.path.join(os.path.dirname(__file__), params.text("checkpoint_dir"))
        model = AutoModelForCausalLM.from_pretrained(
            checkpoint, dtype=torch.float32, attn_implementation="sdpa"
        )
        self.vocab_size = model.config.vocab_size
        # valid input ids: [0, rows)
        self.embedding_rows = model.get_input_embeddings().num_embeddings
        unblock_after_cancellation()
        # Defaults only make transformers create the temperature / top-k / top-p processors;
        # every request overrides all three (greedy is top_k=1).
        generation = GenerationConfig(
            do_sample=True,
            temperature=0.5,
            top_k=self.vocab_size,
            top_p=0.5,
            max_new_tokens=params.integer("max_output_len"),
            eos_token_id=self.default_end_id,
        )
        batching = ContinuousBatchingConfig(
            per_request_processors=True,
            max_batch_tokens=params.integer("max_num_tokens"),
            max_requests_per_batch=self.max_batch_size,
            num_blocks=params.integer("kv_cache_blocks"),
            page_size=self.block_size,
            max_queue_size=0,  # our own bound refuses at once (see _check_queue); transformers' blocks for 10 s
        )
        self.manager = model.init_continuous_batching(
            generation_config=generation, continuous_batching_config=batching
        )
        install_seeded_sampler(self.manager)
        self.manager.start()
        self._streams: dict[str, Stream] = {}
        self._lock = threading.Lock()
        self._counter = 0
        self._unreported_tokens = 0  # metric updates are round trips to the server: sent in batches
        self._running = True
        self._own_metrics()
        self.metrics = EngineMetrics(
            pb_utils,
            model=params.model,
            version="1",
            max_batch_size=self.max_batch_size,
            kv_blocks=params.integer("kv_cache_blocks"),
            tokens_per_block=self.block_size,
        )
        self.tracer = EngineTracer(params.model)
        self._router = threading.Thread(target=self._route, name="cpu-engine-router", daemon=True)
        self._router.start()

    def _own_metrics(self) -> None:
        family = pb_utils.MetricFamily
        labels = {"model": "tensorrt_llm"}
        # Families must outlive their metrics, so both stay on the model.
        self._families = {
            name: family(name=name, description=text, kind=kind)
            for name, text, kind in (
                (
                    "toolkit_engine_requests_cancelled_total",
                    "Requests the CPU engine stopped because the client cancelled them",
                    family.COUNTER,
                ),
                (
                    "toolkit_engine_generated_tokens_total",
                    "Tokens generated by the CPU engine",
                    family.COUNTER,
                ),
                (
                    "toolkit_engine_requests_in_flight",
                    "Requests in the CPU engine's running batch or queue",
                    family.GAUGE,
                ),
            )
        }
        self.cancelled = self._families["toolkit_engine_requests_cancelled_total"].Metric(
            labels=labels
        )
        self.generated = self._families["toolkit_engine_generated_tokens_total"].Metric(
            labels=labels
        )
        self.in_flight = self._families["toolkit_engine_requests_in_flight"].Metric(labels=labels)

    # --- request intake ----------------------------------------------------------------------
    def execute(self, requests):
        senders = []
        for request in requests:
            sender = request.get_response_sender() if self.decoupled else Collector(pb_utils)
            senders.append(sender)
            try:
                if is_stop_request(pb_utils, request):
                    self._stop_by_id(request, sender)
                else:
                    self._admit(request, sender)
            except Exception as exc:  # noqa: BLE001 - every refusal is this request's final error, never the server's
                message = (
                    str(exc)
                    if isinstance(exc, ValueError)
                    else f"the CPU engine could not take this request: {type(exc).__name__}: {exc}"
                )
                sender.send(_error(message), flags=_final())
        if self.decoupled:
            return None
        return [sender.wait() for sender in senders]  # non-decoupled: one response each, in order

    def _stop_by_id(self, request, sender) -> None:
        """Stop every running request with this request's Triton id; answer the stop request itself with nothing."""
        target = request.request_id()
        if not target:
            raise ValueError(NO_REQUEST_ID)
        with self._lock:
            streams = [s for s in self._streams.values() if s.triton_id == target]
        for stream in streams:
            if self._drop(stream.request_id, "stopped"):
                self.manager.cancel_request(stream.request_id)
                # what it generated so far, as a normal final response
                self._respond(stream, final=True)
        sender.send(flags=_final())

    def _admit(self, request, sender) -> None:
        self.refusals.check(pb_utils, request)
        stream, sampling = self._parse(request, sender)
        stream.spans = self.tracer.start(request, len(stream.prompt), self.block_size)
        with self._lock:
            self._check_queue()
            self._streams[stream.request_id] = stream
            self.in_flight.set(len(self._streams))
        # with min_tokens we stop at end_id ourselves
        eos = stream.end_id if stream.min_tokens == 0 else -1
        try:
            added = self.manager.add_request(
                stream.prompt,
                request_id=stream.request_id,
                max_new_tokens=stream.max_tokens,
                streaming=True,
                eos_token_id=eos,
                **sampling,
            )
        except BaseException:
            self._drop(stream.request_id)
            raise
        if added is None:
            if self._drop(stream.request_id):  # else the router already answered it (a restart)
                raise ValueError(
                    "the CPU engine is not accepting requests (restarting its generation loop); retry"
                )
            return
        with self._lock:
            reaped = stream.request_id not in self._streams
        # the client cancelled between registration and add_request: stop it in the engine too
        if reaped:
            self.manager.cancel_request(stream.request_id)

    def _check_queue(self) -> None:
        """Refuse a request that would wait behind max_batch_size running ones and max_queue_size waiting ones."""
        if self.max_queue_size and len(self._streams) >= self.max_batch_size + self.max_queue_size:
            raise ValueError(
                f"Exceeds maximum queue size: {len(self._streams) - self.max_batch_size} requests already wait "
                f"for one of the CPU engine's {self.max_batch_size} batch slots (max_queue_size "
                f"{self.max_queue_size}); retry later"
            )

    def _parse(self, request, sender):
        prompt = self._prompt(request)
        max_tokens = int(_scalar(request, "request_output_len"))
        if max_tokens <= 0:
            raise Refused(f"request_output_len={max_tokens} must be at least 1")
        if len(prompt) + max_tokens > self.max_seq_len:
            raise Refused(
                f"input_lengths {len(prompt)} + request_output_len {max_tokens} exceeds max_seq_len "
                f"{self.max_seq_len}; "
                f"ask for at most {max(self.max_seq_len - len(prompt), 0)} tokens"
            )
        streaming = bool(_scalar(request, "streaming", False))
        if streaming and not self.decoupled:
            raise Refused(
                "streaming is only supported by a decoupled model; this repository was built with "
                "--no-decoupled: send streaming false, or rebuild without --no-decoupled"
            )
        min_tokens = min(int(_scalar(request, "min_tokens", 0) or 0), max_tokens)
        with self._lock:
            self._counter += 1
            request_id = f"r{self._counter}"
        stream = Stream(
            request_id=request_id,
            triton_id=request.request_id(),
            request=request,
            sender=sender,
            prompt=prompt,
            max_tokens=max_tokens,
            end_id=int(_scalar(request, "end_id", self.default_end_id)),
            min_tokens=min_tokens,
            stop_words=_words(request, "stop_words_list"),
            streaming=streaming,
            exclude_input=bool(
                _scalar(request, "exclude_input_in_output", self.default_exclude_input)
            ),
            want_perf=bool(_scalar(request, "return_perf_metrics", False)),
        )
        return stream, self._sampling(request)

    def _prompt(self, request) -> list:
        tensor = pb_utils.get_input_tensor_by_name(request, "input_ids")
        if tensor is None:
            raise Refused("input_ids is missing: send the prompt's token ids as input_ids [1, N]")
        array = tensor.as_numpy()
        if array.ndim == 2 and array.shape[0] != 1:
            raise Refused(
                f"input_ids holds a batch of {array.shape[0]} prompts; the CPU engine takes one prompt per "
                "request: send shape [1, N]"
            )
        ids = array.reshape(-1)
        length = int(_scalar(request, "input_lengths", len(ids)))
        if not 1 <= length <= len(ids):
            raise Refused(
                f"input_lengths {length} must be between 1 and the {len(ids)} ids sent in input_ids"
            )
        prompt_ids = ids[:length]
        low, high = int(prompt_ids.min()), int(prompt_ids.max())
        if low < 0 or high >= self.embedding_rows:
            bad = low if low < 0 else high
            raise Refused(
                f"input_ids holds token id {bad}, outside this model's vocabulary [0, {self.embedding_rows}); "
                "tokenize with the repository's tokenizer"
            )
        return prompt_ids.tolist()

    def _sampling(self, request) -> dict:
        """TensorRT-LLM's rule: with beam width 1, greedy unless runtime_top_k > 1 or runtime_top_p > 0.

        A temperature alone does not sample (the stock end-to-end client sends temperature 1.0 and
        gets greedy text); top_p <= 0 counts as absent; top_k 1 is argmax. An unseeded sampled request
        uses seed 0, TensorRT-LLM's default, so the same request gives the same sample.
        """
        temperature = _scalar(request, "temperature")
        top_k = int(_scalar(request, "runtime_top_k", 0) or 0)
        top_p = float(_scalar(request, "runtime_top_p", 0.0) or 0.0)
        if temperature is not None and not (math.isfinite(temperature) and temperature >= 0):
            raise Refused(f"temperature={temperature} must be a finite number >= 0")
        if top_k < 0 or top_p > 1.0 or not math.isfinite(top_p):
            raise Refused(
                f"runtime_top_k={top_k} must be >= 0 and runtime_top_p={top_p} within (0, 1]"
            )
        sampled = top_k > 1 or top_p > 0.0
        if not sampled or (temperature is not None and temperature < GREEDY_BELOW_TEMPERATURE):
            return {"temperature": 1.0, "top_k": 1, "top_p": 1.0}
        return {
            "temperature": 1.0 if temperature is None else float(temperature),
            "top_k": top_k if top_k > 0 else self.vocab_size,
            "top_p": top_p if top_p > 0 else 1.0,
            "seed": int(_scalar(request, "seed", 0) or 0) & 0x7FFFFFFFFFFFFFFF,
        }

    # --- output routing (one thread) ---------------------------------------------------------
    def _route(self) -> None:
        last_poll = time.monotonic()
        while self._running:
            try:
                result = self.manager.get_result(timeout=RESULT_WAIT_S)
                if result is not None:
                    self._on_result(result)
                elif self.manager.background_thread_status.fatal_error is not None:
                    self._restart_generation_loop()
                now = time.monotonic()
                if now - last_poll >= self.cancel_check_s:
                    last_poll = now
                    self._reap_cancelled()
                    self._report()
            except Exception as exc:  # noqa: BLE001 - this thread answers every request: it must outlive any one of them
                print(
                    f"tensorrt_llm (CPU): routing error, continuing: {type(exc).__name__}: {exc}",
                    file=sys.stderr,
                    flush=True,
                )
                time.sleep(RESULT_WAIT_S)

    def _restart_generation_loop(self) -> None:
        """The manager's generation thread died (a step raised). It has already failed its requests,
        and their errors have been routed above; fail any we still hold, then start a fresh loop so
        one bad step costs the requests in that step, not the server."""
        error = self.manager.background_thread_status.fatal_error
        print(
            f"tensorrt_llm (CPU): a generation step failed ({error}); restarting the generation loop",
            file=sys.stderr,
            flush=True,
        )
        try:
            self.manager.join(time.perf_counter(), timeout=10)
            with self._lock:
                streams = list(self._streams.values())
            message = f"CPU engine: a generation step failed ({error}); the engine restarted, retry the request"
            for stream in streams:
                if self._drop(stream.request_id):
                    # queued after the crash: nobody waits for it now
                    self.manager.cancel_request(stream.request_id)
                    stream.sender.send(_error(message), flags=_final())
        finally:
            self.manager.start()

    def _report(self) -> None:
        """Counters in batches, and the backend's metric families (as its stats thread reports them)."""
        if self._unreported_tokens:
            self.generated.increment(self._unreported_tokens)
            self._unreported_tokens = 0
        with self._lock:
            streams = list(self._streams.values())
        scheduled = [s for s in streams if s.timing.scheduled]
        context = [s for s in scheduled if not s.tokens]
        used = sum(-(-(len(s.prompt) + len(s.tokens)) // self.block_size) for s in scheduled)
        self.metrics.update(
            held=len(streams),  # transformers' manager queues those beyond max_batch_size
            scheduled=len(scheduled),
            context=len(context),
            used_blocks=used,
            context_tokens=sum(len(s.prompt) for s in context),
        )

    def _reap_cancelled(self) -> None:
        with self._lock:
            streams = list(self._streams.values())
        for stream in streams:
            if stream.request.is_cancelled() and self._drop(stream.request_id, "cancelled"):
                self.manager.cancel_request(stream.request_id)
                self.cancelled.increment(1)
                stream.sender.send(flags=_final())

    def _on_result(self, result) -> None:
        with self._lock:
            stream = self._streams.get(result.request_id)
        if stream is None:
            return  # finished or cancelled already
        stream.timing.scheduled = stream.timing.scheduled or time.time_ns()
        if stream.spans is not None:
            stream.spans.scheduled(_wall_ns(result.lifespan[0]))
        if result.error:
            if self._drop(stream.request_id):
                stream.sender.send(_error(f"CPU engine: {result.error}"), flags=_final())
            return
        done = self._take_tokens(stream, result.generated_tokens)
        done = done or result.is_finished()
        if done:
            if not result.is_finished():
                self.manager.cancel_request(stream.request_id)
            if self._drop(stream.request_id):
                self._respond(stream, final=True)
        elif stream.streaming and stream.unsent:
            self._respond(stream, final=False)

    def _take_tokens(self, stream: Stream, generated: list) -> bool:
        """Append the new tokens; True once the request is complete (end_id, stop word or length)."""
        new = generated[stream.seen :]
        stream.seen = len(generated)
        if new:
            stream.timing.on_tokens()
            if stream.spans is not None:
                stream.spans.step(len(new))
        for token in new:
            if token == stream.end_id and len(stream.tokens) >= stream.min_tokens:
                return True
            stream.tokens.append(token)
            stream.unsent += 1
            self._unreported_tokens += 1
            if len(stream.tokens) >= stream.max_tokens or _ends_with_stop(
                stream.tokens, stream.stop_words
            ):
                return True
        return False

    def _respond(self, stream: Stream, final: bool) -> None:
        if final:
            self.metrics.request_finished(len(stream.prompt), len(stream.tokens))
        if stream.streaming:
            tokens = stream.tokens[len(stream.tokens) - stream.unsent :]
        else:
            tokens = stream.tokens if stream.exclude_input else stream.prompt + stream.tokens
        stream.unsent = 0
        if not tokens and final and stream.streaming and not stream.want_perf:
            stream.sender.send(flags=_final())
            return
        outputs = [
            pb_utils.Tensor("output_ids", np.array([[tokens]], dtype=np.int32)),
            pb_utils.Tensor("sequence_length", np.array([[len(tokens)]], dtype=np.int32)),
        ]
        if stream.want_perf:
            outputs += perf_outputs(
                pb_utils, stream.timing, len(stream.prompt) + len(stream.tokens), self.block_size
            )
        stream.sender.send(
            pb_utils.InferenceResponse(output_tensors=outputs), flags=_final() if final else 0
        )

    def _drop(self, request_id: str, reason: str = "finished") -> bool:
        """Forget a request; True only for the one caller that removed it, which alone sends its final response."""
        with self._lock:
            stream = self._streams.pop(request_id, None)
            self.in_flight.set(len(self._streams))
        if stream is not None and stream.spans is not None:
            stream.spans.finish(reason)
        return stream is not None

    def finalize(self):
        self._running = False
        self._router.join(timeout=5)
        self.manager.stop(block=True, timeout=10, hard_stop=True)
        self.tracer.shutdown()
        with self._lock:
            streams = list(self._streams.values())
        for stream in streams:  # whoever still waits gets a final answer, not a hang
            if self._drop(stream.request_id):
                try:
                    stream.sender.send(_error("the CPU engine is shutting down"), flags=_final())
                except Exception:  # noqa: BLE001 - the server may already have released the request
                    pass


def _wall_ns(perf_counter_s: float) -> int | None:
    """A time.perf_counter() stamp (transformers' request lifespan) as ns since the epoch; None when unset."""
    if perf_counter_s <= 0:
        return None
    return time.time_ns() - int((time.perf_counter() - perf_counter_s) * 1e9)


def _words(request, name: str) -> list:
    """Decode TensorRT-LLM's [1, 2, N] word list (ids row, end-offsets row) into token-id lists."""
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    return [] if tensor is None else unpack_word_list(tensor.as_numpy())


def _ends_with_stop(tokens: list, stop_words: list) -> bool:
    return any(len(tokens) >= len(w) and tokens[-len(w) :] == w for w in stop_words)
