"""Synthetic `tensorrt_llm` engine: the engine's tensor contract, tokens without a model.

It exists to measure the serving stack alone (preprocessing, the ensemble's hops, postprocessing,
detokenization, the OpenAI API) on a machine without a GPU, so it must cost as little CPU per
token as the contract allows:
- one generator thread emits one token per active request per step (in-flight batching across
  requests, like the real engine), sleeping to the next step deadline when `step_time_ms` > 0;
- the response tensors are built once: the engine cycles through a fixed list of valid token ids,
  so each streamed response reuses a prebuilt `output_ids` tensor and one `sequence_length` tensor;
- the last token goes out with the final flag (no extra empty response);
- cancellation is polled every `cancel_check_steps` steps, not per token (each poll is an IPC call).

Model parameters (config.pbtxt `parameters`, all strings):
  step_time_ms        time of one decode step in ms (float; 0: as fast as the stack takes tokens)
  token_ids           comma-separated token ids cycled through as output; ids that decode to plain
                      text and are never an end id (the writer picks them from the tokenizer)
  cancel_check_steps  poll request.is_cancelled() every this many steps
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
from params import ModelParams, scalar  # noqa: E402

FINAL = (
    1  # TRITONSERVER_RESPONSE_COMPLETE_FINAL_FLAG; pb_utils only gets its constants after import
)


class _Stream:
    """One request in flight: how many tokens it still owes and where it is in the token cycle."""

    __slots__ = (
        "request",
        "sender",
        "remaining",
        "produced",
        "position",
        "streaming",
        "prefix",
        "count_outputs",
        "input_len",
    )

    def __init__(
        self,
        request,
        remaining: int,
        streaming: bool,
        prefix: np.ndarray | None,
        count_outputs: bool,
        input_len: int,
        position: int,
    ):
        self.request = request
        self.sender = request.get_response_sender()
        self.remaining = remaining
        self.produced = 0
        self.position = position
        self.streaming = streaming
        self.prefix = prefix  # input ids echoed before the output (non-streaming, exclude_input_in_output false)
        self.count_outputs = count_outputs
        self.input_len = input_len


def _scalar(request, name: str, default):
    return scalar(pb_utils, request, name, default)


class TritonPythonModel:
    def initialize(self, args):
        params = ModelParams(args)
        self.step_s = params.number("step_time_ms") / 1000.0
        self.token_ids = np.array(params.ids("token_ids"), dtype=np.int32)
        if not self.token_ids.size:
            raise ValueError(
                "synthetic engine: parameter token_ids is empty; rebuild the repository with toolkit build"
            )
        self.cancel_every = max(1, params.integer("cancel_check_steps"))
        # Prebuilt per-token response tensors, shapes with the batch dim: output_ids [1, beam 1, 1 token].
        self.id_tensors = [
            pb_utils.Tensor("output_ids", np.full((1, 1, 1), t, np.int32)) for t in self.token_ids
        ]
        self.one_length = pb_utils.Tensor("sequence_length", np.ones((1, 1), np.int32))
        self.pending: deque[_Stream] = deque()
        self.wake = threading.Condition()
        self.running = True
        self.next_position = 0
        self.thread = threading.Thread(target=self._generate, name="synthetic-engine", daemon=True)
        self.thread.start()

    # -- requests in ----------------------------------------------------------------------------
    def execute(self, requests):
        streams = []
        for request in requests:
            stream = self._admit(request)
            if stream is not None:
                streams.append(stream)
        if streams:
            with self.wake:
                self.pending.extend(streams)
                self.wake.notify()
        return None

    def _admit(self, request) -> _Stream | None:
        output_len = int(_scalar(request, "request_output_len", 0))
        beams = int(_scalar(request, "beam_width", 1))
        returns = int(_scalar(request, "num_return_sequences", 1))
        if output_len <= 0 or beams != 1 or returns != 1:
            message = (
                f"synthetic engine: request_output_len must be > 0 (got {output_len}); "
                f"beam_width and num_return_sequences must be 1 (got {beams}, {returns})"
            )
            request.get_response_sender().send(
                pb_utils.InferenceResponse(error=pb_utils.TritonError(message)), flags=FINAL
            )
            return None
        streaming = bool(_scalar(request, "streaming", False))
        input_len = int(_scalar(request, "input_lengths", 0))
        prefix = None
        if not streaming and not bool(_scalar(request, "exclude_input_in_output", False)):
            ids = pb_utils.get_input_tensor_by_name(request, "input_ids")
            prefix = (
                ids.as_numpy().reshape(-1)[:input_len].astype(np.int32)
                if ids is not None
                else np.zeros(0, np.int32)
            )
        count_outputs = bool(_scalar(request, "return_num_output_tokens", False))
        position = self.next_position
        self.next_position = (position + 7) % len(
            self.token_ids
        )  # requests start at different tokens
        return _Stream(request, output_len, streaming, prefix, count_outputs, input_len, position)

    # -- tokens out -----------------------------------------------------------------------------
    def _generate(self) -> None:
        active: list[_Stream] = []
        step = 0
        deadline = time.monotonic()
        while True:
            with self.wake:
                while self.running and not active and not self.pending:
                    self.wake.wait()
                    deadline = time.monotonic()
                if not self.running:
                    break
                while self.pending:
                    active.append(self.pending.popleft())
            step += 1
            check_cancel = step % self.cancel_every == 0
            active = [s for s in active if self._step(s, check_cancel)]
            if self.step_s > 0:
                deadline += self.step_s
                delay = deadline - time.monotonic()
                if delay > 0:
                    time.sleep(delay)
                else:
                    deadline = time.monotonic()  # behind: do not try to catch up in a burst
        for stream in active:
            stream.sender.send(flags=FINAL)

    def _step(self, s: _Stream, check_cancel: bool) -> bool:
        """Emit one token for `s`; returns whether it stays active."""
        if check_cancel and s.request.is_cancelled():
            s.sender.send(flags=FINAL)
            return False
        s.remaining -= 1
        s.produced += 1
        last = s.remaining == 0
        if s.streaming:
            outputs = [self.id_tensors[s.position], self.one_length]
            s.position = (s.position + 1) % len(self.id_tensors)
        elif last:
            outputs = self._whole_output(s)
        else:
            return True
        if s.count_outputs:
            outputs.append(pb_utils.Tensor("num_output_tokens", np.array([[s.produced]], np.int32)))
        s.sender.send(
            pb_utils.InferenceResponse(output_tensors=outputs), flags=FINAL if last else 0
        )
        return not last

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
