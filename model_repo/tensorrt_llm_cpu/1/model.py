"""tensorrt_llm on CPU: the TensorRT-LLM backend's tensor contract over transformers' continuous batching.

Requests join and leave the running batch every step (in-flight batching) and their KV cache
lives in transformers' paged cache; we write no attention or cache code. This model only
translates the contract: it parses the request tensors, hands each request to the manager,
and routes the manager's per-step outputs back to each request's response sender, applying
end_id, min_tokens, stop words, request_output_len, streaming, `stop` requests and cancellation,
as the tensorrtllm backend does. Each step's tokens are picked by sampling.Decoder: TensorRT-LLM's
sampling rule, penalties and embedding_bias, guided decoding (grammars.py), log probs; n > 1
sequences are transformers' forks of the request (streams.py). Decoupled (streaming) by default;
built with --no-decoupled it answers each request with one response from execute.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from dataclasses import replace
from pathlib import Path

import triton_python_backend_utils as pb_utils

sys.path.insert(0, os.path.dirname(__file__))
from engine_metrics import EngineMetrics  # noqa: E402
from engine_requests import Refusals, responses, stream_interval, take_requests  # noqa: E402
from lora_tasks import AdapterTable  # noqa: E402
from params import ModelParams, error_response, final_flag, scalar, start_model  # noqa: E402
from streams import Stream, due, response_tensors, take_tokens  # noqa: E402
from textcodec import Refused, unpack_word_list  # noqa: E402
from tracing import EngineTracer  # noqa: E402

RESULT_WAIT_S = 0.02


def _final() -> int:
    return final_flag(pb_utils)


def _scalar(request, name: str, default=None):
    return scalar(pb_utils, request, name, default)


def _refusal(exc: Exception) -> str:
    """Every exception taking a request is that request's final error, never the server's."""
    if isinstance(exc, ValueError):
        return str(exc)
    return f"the CPU engine could not take this request: {type(exc).__name__}: {exc}"


def _error(message: str):
    return error_response(pb_utils, message)


class TritonPythonModel:
    def initialize(self, args):
        # first: private shared memory, and never outlive tritonserver, before the slow imports
        params = start_model(args)
        import torch
        from transformers import AutoModelForCausalLM, GenerationConfig
        from transformers.generation.configuration_utils import ContinuousBatchingConfig

        from cache_stats import PrefixHits, record_prefix_hits
        from lora import key_prefix_cache_by_adapter, load_adapters, route_adapters
        from request_decoding import DecodingInputs
        from sampling import Decoder, install_decoder
        from scheduling import unblock_after_cancellation

        threads = params.integer("num_threads") or _default_threads()
        torch.set_num_threads(threads)
        print(f"tensorrt_llm (CPU): {threads} torch threads", file=sys.stderr, flush=True)
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
        # The repository's LoRA adapters (task id -> name), served per request in the same batch (lora.py).
        self.adapters = AdapterTable(params.text("lora_adapters"))
        if self.adapters:
            lora_dir = os.path.join(os.path.dirname(__file__), params.text("lora_dir"))
            model = load_adapters(model, Path(lora_dir), self.adapters)
        key_prefix_cache_by_adapter()
        self.vocab_size = model.config.vocab_size
        self.embedding_rows = (
            model.get_input_embeddings().num_embeddings
        )  # valid input ids: [0, rows)
        _check_finite_logits(model, self.default_end_id)
        unblock_after_cancellation()
        self.prefix_hits = PrefixHits(self.block_size)
        record_prefix_hits(self.prefix_hits)
        # Greedy defaults: transformers then builds no sampling processors; the Decoder decides every token.
        generation = GenerationConfig(
            do_sample=False,
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
        self.grammars_missing = ""
        self.grammars = self._grammars(checkpoint, params)
        self.decoder = Decoder(self.vocab_size, self.grammars)
        self.inputs = DecodingInputs(
            pb_utils, self.vocab_size, self.grammars, self.grammars_missing
        )
        install_decoder(self.manager, self.decoder)
        if self.adapters:
            route_adapters(model, self.manager, self.adapters)
        self.manager.start()
        self._streams: dict[str, Stream] = {}
        self._choices: dict[str, tuple] = {}  # the manager's request id -> (stream, choice)
        self._lock = threading.Lock()
        self._add_lock = (
            threading.Lock()
        )  # num_return_sequences is the manager's, set per add_request
        self._counter = 0
        self._unreported_tokens = 0  # metric updates are round trips to the server: sent in batches
        self._running = True
        self._own_metrics()
        self.metrics = EngineMetrics.for_model(pb_utils, params)
        self.tracer = EngineTracer(params.model)
        self._router = threading.Thread(target=self._route, name="cpu-engine-router", daemon=True)
        self._router.start()

    def _grammars(self, checkpoint: str, params: ModelParams):
        """Guided decoding's grammars over the checkpoint's tokenizer, every end id a stop token; None (guided
        requests refused, saying why) for a tokenizer llguidance cannot read."""
        from grammars import GrammarMasks

        tokenizer = os.path.join(checkpoint, "tokenizer.json")
        if not os.path.isfile(tokenizer):
            self.grammars_missing = "the repository has no tokenizer.json"
            return None
        ends = [self.default_end_id, *params.ids("stop_ids")]
        try:
            return GrammarMasks(tokenizer, self.vocab_size, ends)
        except ValueError as exc:  # llguidance's for a tokenizer it cannot map to bytes
            self.grammars_missing = f"llguidance cannot read this model's tokenizer ({exc})"
            print(
                f"tensorrt_llm (CPU): no guided decoding: {self.grammars_missing}", file=sys.stderr
            )
            return None

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
                (
                    "toolkit_engine_guides_compiled_total",
                    "Guided-decoding guides the CPU engine compiled (each distinct guide once while cached)",
                    family.COUNTER,
                ),
                (
                    "toolkit_engine_guides_reused_total",
                    "Guided requests whose guide the CPU engine took from its cache of compiled guides",
                    family.COUNTER,
                ),
                (
                    "toolkit_engine_guide_compile_seconds_total",
                    "Seconds the CPU engine spent compiling guides",
                    family.COUNTER,
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
        self.guide_counters = {
            key: self._families[name].Metric(labels=labels)
            for key, name in (
                ("compiled", "toolkit_engine_guides_compiled_total"),
                ("reused", "toolkit_engine_guides_reused_total"),
                ("compile_s", "toolkit_engine_guide_compile_seconds_total"),
            )
        }
        self._guides_reported = {"compiled": 0, "reused": 0, "compile_s": 0.0}

    # --- request intake ----------------------------------------------------------------------
    def execute(self, requests):
        senders = take_requests(
            pb_utils,
            requests,
            self.decoupled,
            stop=self._stop_by_id,
            admit=self._admit,
            refusal=_refusal,
        )
        return responses(senders, self.decoupled)

    def _stop_by_id(self, target: str) -> None:
        """Stop every running request with this Triton id (a `stop` request's)."""
        with self._lock:
            streams = [s for s in self._streams.values() if s.triton_id == target]
        for stream in streams:
            if self._drop(stream, "stopped"):
                self._cancel(stream)
                self._finish(stream)  # what it generated so far, as normal final responses

    def _admit(self, request, sender) -> None:
        self.refusals.check(pb_utils, request)
        stream, decoding = self._parse(request, sender)
        # The guide is compiled and registered before the router can see the stream: a stream dropped
        # while its guide compiled would otherwise leave the guide registered for good.
        stream.guide = self.inputs.register_guide(request)
        try:
            with self._lock:
                self._check_queue()
                self._register(stream)
        except BaseException:
            if self.grammars is not None and stream.guide:
                self.grammars.unregister(stream.guide)
            raise
        stream.spans = self.tracer.start(request, len(stream.prompt), self.block_size)
        try:
            added = self._add(stream, replace(decoding, guide=stream.guide))
        except BaseException:
            self._drop(stream)
            raise
        if added is None:
            if self._drop(stream):  # else the router already answered it (a restart)
                raise ValueError(
                    "the CPU engine is not accepting requests (restarting its generation loop); retry"
                )
            return
        with self._lock:
            reaped = stream.request_id not in self._streams
        if (
            reaped
        ):  # the client cancelled between registration and add_request: stop it in the engine too
            self._cancel(stream)

    def _add(self, stream: Stream, decoding):
        """Hand the request to the manager, forked into its n choices (transformers reads n from itself).
        transformers forks the choices from the prompt less its last token, so a one-token prompt would
        be prefilled with nothing (a tensor of 0 elements fails the whole generation step, every request
        in it): its choices go in as requests of their own, with the ids (and so the seeds) of forks."""
        # A guided request ends where its grammar does: min_tokens gives way (it would force tokens past
        # the end). Otherwise, with min_tokens we stop at end_id ourselves.
        eos = stream.end_id if stream.min_tokens == 0 else -1
        forked = len(stream.prompt) > 1
        with self._add_lock:
            self.manager.num_return_sequences = stream.n if forked else 1
            try:
                added = [
                    self.manager.add_request(
                        stream.prompt,
                        request_id=choice.request_id,
                        max_new_tokens=stream.max_tokens,
                        streaming=True,
                        eos_token_id=eos,
                        decoding=decoding,
                    )
                    for choice in (stream.choices[:1] if forked else stream.choices)
                ]
            finally:
                self.manager.num_return_sequences = 1
        return None if None in added else added[0]

    def _register(self, stream: Stream) -> None:
        """Under the lock: the stream, and each of its choices by the manager's id."""
        self._streams[stream.request_id] = stream
        for choice in stream.choices:
            self._choices[choice.request_id] = (stream, choice)
        self.in_flight.set(len(self._streams))

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
        end_id = int(_scalar(request, "end_id", self.default_end_id))
        if not -1 <= end_id < self.vocab_size:  # -1: no end token, as in TensorRT-LLM
            raise Refused(
                f"end_id {end_id} is outside this model's vocabulary [0, {self.vocab_size}); "
                "send one of its token ids, or -1 for none"
            )
        decoding = replace(
            self.inputs.decoding(request, end_id),
            adapter=self.adapters.task_of(pb_utils, request),
        )
        guided = self.inputs.guide(request) is not None
        if guided and end_id < 0:  # the grammar ends the output with the end token
            raise Refused(
                "a guided request needs an end id: end_id -1 would run past the grammar's end to "
                "request_output_len; send the model's end id (or none, for the default)"
            )
        min_tokens = 0 if guided else min(int(_scalar(request, "min_tokens", 0) or 0), max_tokens)
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
            end_id=end_id,
            min_tokens=min_tokens,
            stop_words=_words(request, "stop_words_list"),
            streaming=streaming,
            exclude_input=bool(
                _scalar(request, "exclude_input_in_output", self.default_exclude_input)
            ),
            want_perf=bool(_scalar(request, "return_perf_metrics", False)),
            want_logprobs=decoding.logprobs >= 0,
            top_logprobs=max(decoding.logprobs, 0),
            n=self.inputs.return_sequences(request, self.decoupled),
            interval=stream_interval(request),
        )
        return stream, decoding

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
                if self._drop(stream):
                    self._cancel(stream)  # queued after the crash: nobody waits for it now
                    stream.sender.send(_error(message), flags=_final())
        finally:
            self.manager.start()

    def _report(self) -> None:
        """Counters in batches, and the backend's metric families (as its stats thread reports them)."""
        if self._unreported_tokens:
            self.generated.increment(self._unreported_tokens)
            self._unreported_tokens = 0
        if self.grammars is not None:
            for key, value in self.grammars.stats().items():
                new = value - self._guides_reported[key]
                if new:
                    self.guide_counters[key].increment(new)
                    self._guides_reported[key] = value
        with self._lock:
            streams = list(self._streams.values())
        scheduled = [s for s in streams if s.timing.scheduled]
        context = [s for s in scheduled if not s.generated()]
        used = sum(self._blocks(s) for s in scheduled)
        self.metrics.update(
            held=len(streams),  # transformers' manager queues those beyond max_batch_size
            scheduled=len(scheduled),
            context=len(context),
            used_blocks=used,
            context_tokens=sum(len(s.prompt) for s in context),
            reused_blocks=self.prefix_hits.reused_blocks,
        )

    def _blocks(self, stream: Stream) -> int:
        """KV blocks a request holds: its prompt's (shared by its choices), and each choice's own output."""
        size = self.block_size
        return -(-len(stream.prompt) // size) + sum(
            -(-len(c.tokens) // size) for c in stream.choices
        )

    def _reap_cancelled(self) -> None:
        with self._lock:
            streams = list(self._streams.values())
        for stream in streams:
            if stream.request.is_cancelled() and self._drop(stream, "cancelled"):
                self._cancel(stream)
                self.cancelled.increment(1)
                stream.sender.send(flags=_final())

    def _on_result(self, result) -> None:
        with self._lock:
            found = self._choices.get(result.request_id)
        if found is None:
            return  # finished or cancelled already
        stream, choice = found
        if (
            not stream.timing.scheduled
        ):  # its first result: the scheduler has matched its prompt by now
            stream.timing.scheduled = time.time_ns()
            stream.cached_tokens = self.prefix_hits.pop(stream.request_id)
            if stream.spans is not None:
                stream.spans.scheduled(_wall_ns(result.lifespan[0]))
        if result.error:
            if self._drop(stream):
                self._cancel(stream)
                stream.sender.send(_error(f"CPU engine: {result.error}"), flags=_final())
            return
        if choice.done:
            return
        ended, appended = take_tokens(stream, choice, result.generated_tokens, result.logprobs)
        finished = ended or result.is_finished()
        if appended:
            stream.timing.on_tokens()
            self._unreported_tokens += appended
        if stream.spans is not None and (appended or finished):
            stream.spans.step(appended)  # the step that drew the end token gives none, but was one
        if finished:
            if not result.is_finished():
                self.manager.cancel_request(choice.request_id)
            self._choice_done(stream, choice)
        elif stream.streaming and choice.unsent and due(choice, stream.interval):
            self._respond(stream, choice, final=False)

    def _choice_done(self, stream: Stream, choice) -> None:
        """A choice ended: its last response; the request's final one when it was the last choice."""
        choice.done = True
        if not stream.done:
            self._respond(stream, choice, final=False)
        elif self._drop(stream):
            self._respond(stream, choice, final=True)

    def _finish(self, stream: Stream) -> None:
        """A stopped request: every choice's tokens so far, the last response final."""
        for choice in stream.choices:
            choice.done = True
        for i, choice in enumerate(stream.choices):
            self._respond(stream, choice, final=i == len(stream.choices) - 1)

    def _respond(self, stream: Stream, choice, final: bool) -> None:
        if final:
            self.metrics.request_finished(len(stream.prompt), stream.generated())
        outputs = response_tensors(pb_utils, stream, choice, self.block_size)
        if outputs is None:
            if final:
                stream.sender.send(flags=_final())
            return
        stream.sender.send(
            pb_utils.InferenceResponse(output_tensors=outputs), flags=_final() if final else 0
        )

    def _cancel(self, stream: Stream) -> None:
        for choice in stream.choices:
            if not choice.done:
                self.manager.cancel_request(choice.request_id)

    def _drop(self, stream: Stream, reason: str = "finished") -> bool:
        """Forget a request and its choices; True only for the one caller that removed it, which alone sends
        its final response."""
        with self._lock:
            removed = self._streams.pop(stream.request_id, None) is not None
            if removed:
                for choice in stream.choices:
                    self._choices.pop(choice.request_id, None)
            self.in_flight.set(len(self._streams))
        if removed:
            for choice in stream.choices:
                self.decoder.release(choice.request_id)
                self.prefix_hits.pop(choice.request_id)
            if self.grammars is not None and stream.guide:
                self.grammars.unregister(stream.guide)
            if stream.spans is not None:
                stream.spans.finish(reason)
        return removed

    def finalize(self):
        self._running = False
        self._router.join(timeout=5)
        self.manager.stop(block=True, timeout=10, hard_stop=True)
        self.tracer.shutdown()
        with self._lock:
            streams = list(self._streams.values())
        for stream in streams:  # whoever still waits gets a final answer, not a hang
            if self._drop(stream):
                try:
                    stream.sender.send(_error("the CPU engine is shutting down"), flags=_final())
                except Exception:  # noqa: BLE001 - the server may already have released the request
                    pass


def _wall_ns(perf_counter_s: float) -> int | None:
    """A time.perf_counter() stamp (transformers' request lifespan) as ns since the epoch; None when unset."""
    if perf_counter_s <= 0:
        return None
    return time.time_ns() - int((time.perf_counter() - perf_counter_s) * 1e9)


def _default_threads() -> int:
    """All the CPUs this server may use but one (at least 1): the rest of the server (tritonserver,
    pre/postprocessing, BLS, the API) needs one too. torch's own default takes every core, and on a
    busy 2-core host 2 threads decoded several times slower than 1 (and erratically)."""
    return max(1, _usable_cpus() - 1)


def _usable_cpus() -> int:
    """CPUs of this process's affinity, within its cgroup's CPU quota (a pod's limit), if any."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    try:
        with open("/sys/fs/cgroup/cpu.max") as limit:  # cgroup v2: "max 100000" or "400000 100000"
            quota, period = limit.read().split()[:2]
        if quota != "max":
            cpus = min(cpus, max(1, int(int(quota) / int(period))))
    except (OSError, ValueError):
        pass  # no cgroup v2 quota: the affinity is the bound
    return cpus


def _check_finite_logits(model, token: int) -> None:
    """One forward pass of one token as the model loads: weights that give NaN or inf logits (a damaged
    file served with --allow-modified) would fail every request while Triton reported the model ready."""
    import torch

    with torch.no_grad():
        logits = model(torch.tensor([[token]])).logits
    if not torch.isfinite(logits).all():
        raise RuntimeError(
            "tensorrt_llm (CPU): the checkpoint's weights give non-finite logits (NaN or inf) for a probe "
            "token: the weights are damaged; rebuild the repository from an intact checkpoint"
        )


def _words(request, name: str) -> list:
    """Decode TensorRT-LLM's [1, 2, N] word list (ids row, end-offsets row) into token-id lists."""
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    return [] if tensor is None else unpack_word_list(tensor.as_numpy())
