"""Request handling the Python engines share with each other, as the tensorrtllm backend does it.

- `stop`: a request with `stop` = true asks to stop the earlier requests that carry the same Triton
  request id. It is never generated: it gets one empty final response (no outputs, no error), also
  when no such request runs; without a request id it is an error. A stopped request ends with a
  normal final response holding what was generated so far.
- Non-decoupled models (`toolkit build --no-decoupled`) answer each request with exactly one
  response, returned from execute: a `Collector` stands in for the response sender.
- Perf outputs (`return_perf_metrics`): the backend's request timing and KV-block outputs.
- `stream_interval` (a request parameter, ours; TensorRT-LLM's LLM API has the same setting): a streamed
  request gets its first token at once, then one response per `stream_interval` tokens, and the rest
  with the final flag. Fewer, larger responses cost the stack above less CPU per token.
"""

from __future__ import annotations

import json
import threading
import time

import numpy as np

from params import error_response
from textcodec import Refused, unpack_word_list

EMPTY = "empty"  # toolkit.repository.contract.EMPTY: no words, no non-zero values

NO_REQUEST_ID = "Trying to stop a request but request ID is not provided"


class Refusals:
    """The inputs this repository's engine does not honour, from its `refusals` parameter (written by
    toolkit build from the repository's capabilities): input -> (what means off: a value, EMPTY, or
    None for any value sent; the refusal naming the target and what would enable it)."""

    def __init__(self, parameter: str):
        self.table = {
            name: (off, message) for name, (off, message) in json.loads(parameter).items()
        }

    def check(self, pb_utils, request) -> None:
        for name, (off, message) in self.table.items():
            tensor = pb_utils.get_input_tensor_by_name(request, name)
            if tensor is None:
                continue
            array = tensor.as_numpy()
            values = array.reshape(-1)
            if off == EMPTY:
                asked = (
                    bool(unpack_word_list(array)) if name.endswith("_words_list") else values.any()
                )
            else:
                asked = values.size > 0 and (off is None or values[0].item() != off)
            if asked:
                shown = values[0].item() if values.size == 1 else f"[{values.size} values]"
                raise Refused(f"{name}={shown}: {message}", "unsupported_parameter")


STREAM_INTERVAL = "stream_interval"  # toolkit.api.triton.STREAM_INTERVAL
MAX_STREAM_INTERVAL = 1024  # toolkit.settings.MAX_STREAM_INTERVAL


def stream_interval(request) -> int:
    """The request's `stream_interval` parameter (1 when absent); a value that is not a whole number from 1 to
    MAX_STREAM_INTERVAL is refused, naming it."""
    parameters = request.parameters() if hasattr(request, "parameters") else None
    if not parameters or STREAM_INTERVAL not in parameters:
        return 1
    value = json.loads(parameters).get(STREAM_INTERVAL, 1)
    if (
        isinstance(value, bool)
        or not isinstance(value, int)
        or not 1 <= value <= MAX_STREAM_INTERVAL
    ):
        raise Refused(
            f"stream_interval={value!r}: send a whole number of tokens per streamed response, from 1 to "
            f"{MAX_STREAM_INTERVAL}",
            "invalid_value",
        )
    return value


def is_stop_request(pb_utils, request) -> bool:
    tensor = pb_utils.get_input_tensor_by_name(request, "stop")
    return tensor is not None and bool(tensor.as_numpy().reshape(-1)[0])


def take_requests(pb_utils, requests, decoupled: bool, *, stop, admit, refusal) -> list:
    """execute's intake, for both engines: each request gets its sender (its own response sender when
    decoupled, else a Collector). A `stop` request: `stop(triton_id)` stops the requests with its Triton id
    (without one it is refused), then its one empty final response; any other: `admit(request, sender)`.
    An exception either raises is that request's final error with `refusal(exc)` as its
    message (refusal returns None: it is the server's, raised). Returns the senders, in order."""
    senders = []
    for request in requests:
        sender = request.get_response_sender() if decoupled else Collector(pb_utils)
        senders.append(sender)
        try:
            if is_stop_request(pb_utils, request):
                target = request.request_id()
                if not target:
                    raise ValueError(NO_REQUEST_ID)
                stop(target)
                sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
            else:
                admit(request, sender)
        except Exception as exc:  # noqa: BLE001 - refusal decides: this request's error, or raised
            message = refusal(exc)
            if message is None:
                raise
            sender.send(
                error_response(pb_utils, message),
                flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL,
            )
    return senders


def responses(senders: list, decoupled: bool):
    """What execute returns: nothing when decoupled, else each request's one response, in order."""
    if decoupled:
        return None
    return [sender.wait() for sender in senders]


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


def perf_outputs(
    pb_utils, timing: Timing, total_tokens: int, block_size: int, reused_blocks: int = 0
) -> list:
    """The backend's perf outputs, each [1, 1]: KV blocks the request holds, of which `reused_blocks` came
    from the prefix cache (the CPU engine's; the synthetic one computes none), its timestamps, and no
    speculative decoding."""
    blocks = -(-total_tokens // block_size)

    def tensor(name, value, dtype):
        return pb_utils.Tensor(name, np.array([[value]], dtype=dtype))

    return [
        tensor("kv_cache_alloc_new_blocks", blocks - reused_blocks, np.int32),
        tensor("kv_cache_reused_blocks", reused_blocks, np.int32),
        tensor("kv_cache_alloc_total_blocks", blocks, np.int32),
        tensor("arrival_time_ns", timing.arrival, np.int64),
        tensor("first_scheduled_time_ns", timing.scheduled, np.int64),
        tensor("first_token_time_ns", timing.first_token, np.int64),
        tensor("last_token_time_ns", timing.last_token, np.int64),
        tensor("acceptance_rate", 0.0, np.float32),
        tensor("total_accepted_draft_tokens", 0, np.int32),
        tensor("total_draft_tokens", 0, np.int32),
    ]
