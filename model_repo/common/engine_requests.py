"""Request handling the Python engines share with each other, as the tensorrtllm backend does it.

- `stop`: a request with `stop` = true asks to stop the earlier requests that carry the same Triton
  request id. It is never generated: it gets one empty final response (no outputs, no error), also
  when no such request runs; without a request id it is an error. A stopped request ends with a
  normal final response holding what was generated so far.
- Non-decoupled models (`toolkit build --no-decoupled`) answer each request with exactly one
  response, returned from execute: a `Collector` stands in for the response sender.
- Perf outputs (`return_perf_metrics`): the backend's request timing and KV-block outputs.
"""

from __future__ import annotations

import threading
import time

import numpy as np

NO_REQUEST_ID = "Trying to stop a request but request ID is not provided"


def is_stop_request(pb_utils, request) -> bool:
    tensor = pb_utils.get_input_tensor_by_name(request, "stop")
    return tensor is not None and bool(tensor.as_numpy().reshape(-1)[0])


class Collector:
    """The response sender of a request to a non-decoupled model: keeps its one response for execute."""

    def __init__(self, pb_utils):
        self.pb_utils = pb_utils
        self.response = None
        self.done = threading.Event()

    def send(self, response=None, flags: int = 0) -> None:
        if response is not None:
            self.response = response
        if flags & self.pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL:
            if self.response is None:
                self.response = self.pb_utils.InferenceResponse(output_tensors=[])
            self.done.set()

    def wait(self):
        self.done.wait()
        return self.response


class Timing:
    """When a request arrived, was first scheduled, got its first and its last token (ns since the epoch)."""

    __slots__ = ("arrival", "scheduled", "first_token", "last_token")

    def __init__(self):
        self.arrival = time.time_ns()
        self.scheduled = self.first_token = self.last_token = 0

    def on_tokens(self) -> None:
        now = time.time_ns()
        self.scheduled = self.scheduled or now
        self.first_token = self.first_token or now
        self.last_token = now


def perf_outputs(pb_utils, timing: Timing, total_tokens: int, block_size: int) -> list:
    """The backend's perf outputs, each [1, 1]: KV blocks the request holds (none reused: the Python
    engines share no prefixes), its timestamps, and no speculative decoding."""
    blocks = -(-total_tokens // block_size)

    def tensor(name, value, dtype):
        return pb_utils.Tensor(name, np.array([[value]], dtype=dtype))

    return [
        tensor("kv_cache_alloc_new_blocks", blocks, np.int32),
        tensor("kv_cache_reused_blocks", 0, np.int32),
        tensor("kv_cache_alloc_total_blocks", blocks, np.int32),
        tensor("arrival_time_ns", timing.arrival, np.int64),
        tensor("first_scheduled_time_ns", timing.scheduled, np.int64),
        tensor("first_token_time_ns", timing.first_token, np.int64),
        tensor("last_token_time_ns", timing.last_token, np.int64),
        tensor("acceptance_rate", 0.0, np.float32),
        tensor("total_accepted_draft_tokens", 0, np.int32),
        tensor("total_draft_tokens", 0, np.int32),
    ]
