"""Synthetic `tensorrt_llm` engine: the engine's tensor contract, tokens without a model.

It exists to measure the serving stack alone (preprocessing, the ensemble's hops, postprocessing,
detokenization, the OpenAI API) on a machine without a GPU, so it must cost as little CPU per
token as the contract allows:
- one generator thread emits one token per running request per step (in-flight batching across
  requests, like the real engine): at most max_batch_size run, the rest wait in arrival order for
  a batch slot, as in TensorRT-LLM's executor queue; it sleeps to the next step deadline when
  `step_time_ms` > 0;
- the response tensors are built once: the engine cycles through a fixed list of valid token ids,
  so each streamed response reuses a prebuilt `output_ids` tensor and one `sequence_length` tensor;
- the last token goes out with the final flag (no extra empty response);
- a request's `stream_interval` parameter (common/engine_requests.py) makes it one response per that many
  tokens after the first, as TensorRT-LLM's LLM API does: responses at token 1 and at each multiple;
- cancellation is polled every `cancel_check_steps` steps, not per token (each poll is an IPC call);
- `stop` requests, the queue bound, non-decoupled builds and the backend's metric families behave as
  in the CPU engine (model_repo/common/engine_requests.py, engine_metrics.py). Sampling and stop words
  have no meaning without a model and are ignored; what the repository's capabilities do not
  honour (penalties, logprobs, n, ...) and perf outputs are refused.

Model parameters (config.pbtxt `parameters`, all strings):
  step_time_ms        time of one decode step in ms (float; 0: as fast as the stack takes tokens)
  token_ids           comma-separated token ids cycled through as output; ids that decode to plain
                      text and are never an end id (the writer picks them from the tokenizer)
  cancel_check_steps  poll request.is_cancelled() every this many steps
  scripted            true: token_ids are a scripted answer (toolkit build --synthetic-output): every
                      request gets them from the first, and ends after the last (as at an end token)
  lora_adapters       JSON {"<task id>": "<adapter name>"} of the repository's adapters: lora_task_id
                      picks one (an unknown id is refused naming the known ones)
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections import deque

import numpy as np
import triton_python_backend_utils as pb_utils

sys.path.insert(0, os.path.dirname(__file__))
from engine_metrics import EngineMetrics  # noqa: E402
from engine_requests import Refusals, responses, stream_interval, take_requests  # noqa: E402
from lora_tasks import AdapterTable  # noqa: E402
from params import scalar, start_model  # noqa: E402
from textcodec import Refused  # noqa: E402
from tracing import EngineTracer  # noqa: E402

FINAL = (
    1  # TRITONSERVER_RESPONSE_COMPLETE_FINAL_FLAG; pb_utils only gets its constants after import
)
METRICS_EVERY_S = 0.1  # the backend's stats_check_period_ms


class _Stream:
    """One request in flight: how many tokens it still owes and where it is in the token cycle."""

    __slots__ = (
        "request",
        "sender",
        "triton_id",
        "remaining",
        "produced",
        "position",
        "streaming",
        "interval",
        "sent",
        "prefix",
        "input_len",
        "spans",
    )

    def __init__(
        self,
        request,
        sender,
        remaining: int,
        streaming: bool,
        prefix: np.ndarray | None,
        input_len: int,
        position: int,
        spans=None,
        interval: int = 1,
    ):
        self.request = request
        self.sender = sender
        self.triton_id = request.request_id()
        self.remaining = remaining
        self.produced = 0
        self.position = position
        self.streaming = streaming
        self.interval = interval  # streamed tokens per response after the first
        self.sent = 0  # tokens streamed so far (counted only when interval > 1)
        self.prefix = prefix  # input ids echoed before the output (non-streaming, exclude_input_in_output false)
        self.input_len = input_len
        self.spans = spans  # tracing.RequestSpans of a traced request, else None


def _ended_if_cancelled(s: _Stream) -> bool:
    """Whether the client cancelled `s` (an IPC call); if so it ends here: a final flag, nothing more."""
    if not s.request.is_cancelled():
        return False
    s.sender.send(flags=FINAL)
    if s.spans is not None:
        s.spans.finish("cancelled")
    return True


class TritonPythonModel:
    def initialize(self, args):
        params = start_model(args)
        self.decoupled = params.flag("decoupled")
        # What this repository does not honour (its capabilities), refused per request.
        self.refusals = Refusals(params.text("refusals"))
        # The repository's LoRA adapters: a known task id is accepted (its tokens are synthetic as the base's).
        self.adapters = AdapterTable(params.text("lora_adapters"))
        self.step_s = params.number("step_time_ms") / 1000.0
        self.token_ids = np.array(params.ids("token_ids"), dtype=np.int32)
        if not self.token_ids.size:
            raise ValueError(
                "synthetic engine: parameter token_ids is empty; rebuild the repository with toolkit build"
            )
        self.cancel_every = max(1, params.integer("cancel_check_steps"))
        self.scripted = params.flag("scripted")
        self.max_batch_size = params.max_batch_size
        self.max_queue_size = params.integer("max_queue_size")
        self.block_size = params.integer("kv_block_size")
        self.metrics = EngineMetrics.for_model(pb_utils, params)
        # Prebuilt per-token response tensors, shapes with the batch dim: output_ids [1, beam 1, 1 token].
        self.id_tensors = [
            pb_utils.Tensor("output_ids", np.full((1, 1, 1), t, np.int32)) for t in self.token_ids
        ]
        self.one_length = pb_utils.Tensor("sequence_length", np.ones((1, 1), np.int32))
        # The token cycle twice over: any run of up to len(token_ids) tokens is one slice of it.
        self.cycle_twice = np.concatenate([self.token_ids, self.token_ids])
        self.tracer = EngineTracer(params.model)
        self.pending: deque[_Stream] = deque()
        # The generator thread's, in arrival order: the first max_batch_size run, the rest wait for a
        # slot. Other threads only read its length.
        self.active: list[_Stream] = []
        self.stops: deque[str] = deque()  # Triton request ids to stop, for the generator thread
        self.wake = threading.Condition()
        self.running = True
        self.next_position = 0
        self.reported_steps = 0  # engine steps already counted in the iteration counter
        self.thread = threading.Thread(target=self._generate, name="synthetic-engine", daemon=True)
        self.thread.start()

    # -- requests in ----------------------------------------------------------------------------
    def execute(self, requests):
        streams = []
        senders = take_requests(
            pb_utils,
            requests,
            self.decoupled,
            stop=self._stop_by_id,
            admit=lambda request, sender: streams.append(
                self._admit(request, sender, len(streams))
            ),
            refusal=lambda exc: f"synthetic engine: {exc}" if isinstance(exc, ValueError) else None,
        )
        if streams:
            with self.wake:
                self.pending.extend(streams)
                self.wake.notify()
        return responses(senders, self.decoupled)

    def _stop_by_id(self, target: str) -> None:
        with self.wake:
            self.stops.append(target)
            self.wake.notify()

    def _admit(self, request, sender, batch_so_far: int) -> _Stream:
        self.refusals.check(pb_utils, request)
        self.adapters.task_of(pb_utils, request)
        output_len = int(scalar(pb_utils, request, "request_output_len", 0))
        if output_len <= 0:
            raise Refused(f"request_output_len must be > 0 (got {output_len})")
        if scalar(pb_utils, request, "return_perf_metrics", False):
            raise Refused(
                "return_perf_metrics: the synthetic engine has no model, so no perf metrics",
                "unsupported_parameter",
            )
        streaming = bool(scalar(pb_utils, request, "streaming", False))
        interval = stream_interval(request)
        if streaming and not self.decoupled:
            raise Refused(
                "streaming is only supported by a decoupled model; this repository was built with --no-decoupled"
            )
        waiting = len(self.active) + len(self.pending) + batch_so_far
        if self.max_queue_size and waiting >= self.max_batch_size + self.max_queue_size:
            raise ValueError(
                f"Exceeds maximum queue size: {waiting - self.max_batch_size} requests already wait for a "
                f"batch slot (max_queue_size {self.max_queue_size}); retry later"
            )
        input_len = int(scalar(pb_utils, request, "input_lengths", 0))
        prefix = None
        if not streaming and not bool(scalar(pb_utils, request, "exclude_input_in_output", False)):
            ids = pb_utils.get_input_tensor_by_name(request, "input_ids")
            prefix = (
                ids.as_numpy().reshape(-1)[:input_len].astype(np.int32)
                if ids is not None
                else np.zeros(0, np.int32)
            )
        if self.scripted:  # the whole script from its start, then the end
            return _Stream(
                request,
                sender,
                min(output_len, self.token_ids.size),
                streaming,
                prefix,
                input_len,
                0,
                interval=interval,
            )
        position = self.next_position
        # requests start at different tokens
        self.next_position = (position + 7) % len(self.token_ids)
        spans = self.tracer.start(request, input_len, self.block_size)
        return _Stream(
            request, sender, output_len, streaming, prefix, input_len, position, spans, interval
        )

    # -- tokens out -----------------------------------------------------------------------------
    def _generate(self) -> None:
        step = 0
        deadline = reported = time.monotonic()
        while True:
            with self.wake:
                while self.running and not self.active and not self.pending and not self.stops:
                    self._report(step)
                    self.wake.wait(timeout=1.0)
                    deadline = time.monotonic()
                if not self.running:
                    break
                while self.pending:
                    self.active.append(self.pending.popleft())
                stops = set(self.stops)
                self.stops.clear()
            step += 1
            check_cancel = step % self.cancel_every == 0
            running = self.active[: self.max_batch_size]
            queued = self.active[self.max_batch_size :]
            self.active = [s for s in running if self._step(s, check_cancel, stops)] + [
                s for s in queued if self._still_queued(s, check_cancel, stops)
            ]
            if time.monotonic() - reported >= METRICS_EVERY_S:
                reported = time.monotonic()
                self._report(step)
            if self.step_s > 0:
                deadline += self.step_s
                delay = deadline - time.monotonic()
                if delay > 0:
                    time.sleep(delay)
                else:
                    deadline = time.monotonic()  # behind: do not try to catch up in a burst
        for stream in self.active:
            stream.sender.send(flags=FINAL)

    def _report(self, steps: int) -> None:
        """The backend's metric families; `steps`: engine steps so far (the iteration counter)."""
        running = self.active[: self.max_batch_size]
        used = sum(-(-(s.input_len + s.produced) // self.block_size) for s in running)
        self.metrics.update(
            held=len(self.active),
            scheduled=len(running),
            context=0,
            used_blocks=used,
            context_tokens=0,
            iterations=steps - self.reported_steps,
        )
        self.reported_steps = steps

    def _still_queued(self, s: _Stream, check_cancel: bool, stops: set) -> bool:
        """Whether `s`, waiting for a batch slot, still waits: a cancelled or stopped one ends now,
        with what it has (nothing)."""
        if check_cancel and _ended_if_cancelled(s):
            return False
        if s.triton_id in stops:
            if s.spans is not None:
                s.spans.finish("stopped")
            if s.streaming:
                s.sender.send(flags=FINAL)
            else:
                s.sender.send(
                    pb_utils.InferenceResponse(output_tensors=self._whole_output(s)), flags=FINAL
                )
            self.metrics.request_finished(s.input_len, 0)
            return False
        return True

    def _step(self, s: _Stream, check_cancel: bool, stops: set) -> bool:
        """Emit one token for `s`; returns whether it stays active."""
        if check_cancel and _ended_if_cancelled(s):
            return False
        # stopped by a `stop` request: a normal final response with what it has
        if s.triton_id in stops:
            s.remaining = 1
        s.remaining -= 1
        s.produced += 1
        last = s.remaining == 0
        if s.spans is not None:
            s.spans.step(1)
            if last:
                s.spans.finish("length")
        if s.streaming and s.interval == 1:
            outputs = [self.id_tensors[s.position], self.one_length]
            s.position = (s.position + 1) % len(self.id_tensors)
        elif s.streaming:
            if not (last or s.produced == 1 or s.produced % s.interval == 0):
                return True
            outputs = self._unsent(s)
        elif last:
            outputs = self._whole_output(s)
        else:
            return True
        s.sender.send(
            pb_utils.InferenceResponse(output_tensors=outputs), flags=FINAL if last else 0
        )
        if last:
            self.metrics.request_finished(s.input_len, s.produced)
        return not last

    def _unsent(self, s: _Stream) -> list:
        """The response tensors of the tokens `s` produced since its last response; `s` moves past them."""
        count = s.produced - s.sent
        size = len(self.token_ids)
        if count <= size:
            tokens = self.cycle_twice[s.position : s.position + count]
        else:
            tokens = np.resize(np.roll(self.token_ids, -s.position), count)
        s.position = (s.position + count) % size
        s.sent = s.produced
        return [
            pb_utils.Tensor("output_ids", tokens.reshape(1, 1, count)),
            pb_utils.Tensor("sequence_length", np.array([[count]], np.int32)),
        ]

    def _whole_output(self, s: _Stream) -> list:
        cycle = np.resize(np.roll(self.token_ids, -s.position), s.produced)
        tokens = cycle if s.prefix is None else np.concatenate([s.prefix, cycle])
        return [
            pb_utils.Tensor("output_ids", tokens.reshape(1, 1, -1).astype(np.int32)),
            pb_utils.Tensor("sequence_length", np.array([[tokens.size]], np.int32)),
        ]

    def finalize(self):
        with self.wake:
            self.running = False
            self.wake.notify()
        self.thread.join(timeout=5)
        self.tracer.shutdown()
