"""One request in flight on the CPU engine, its choices, and the responses they get, as the backend sends them.

A request asking for n > 1 sequences (num_return_sequences) is forked n ways by transformers: choice 0
keeps the request's id, choice i + 1 is `<id>__child#i`. As in the tensorrtllm backend, each response
carries one choice's tokens and, when n > 1, its `sequence_index`; only the last response of the
request is final. With return_log_probs a response carries its tokens' log probs (`output_log_probs`,
[1, 1, tokens]) and the choice's running sum (`cum_log_probs`); with num_top_logprobs (ours) the
alternatives too (`top_logprob_ids`, `top_logprobs`, [1, tokens, k]).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from engine_requests import Timing, perf_outputs


@dataclass
class Choice:
    """One of a request's n sequences."""

    request_id: str  # the manager's id for it
    index: int  # its sequence_index
    seen: int = 0  # the manager's generated tokens taken so far
    tokens: list = field(default_factory=list)
    logprobs: list = field(default_factory=list)  # per token: (log prob, top ids, top log probs)
    unsent: int = 0  # tokens appended since the last streamed response
    done: bool = False


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
    want_logprobs: bool = False
    top_logprobs: int = 0
    n: int = 1
    guide: int = 0  # its registered grammar (grammars.GrammarMasks), 0: none
    choices: list = field(default_factory=list)
    timing: Timing = field(default_factory=Timing)
    cached_tokens: int = 0  # prompt tokens the prefix cache gave it
    spans: object = None  # tracing.RequestSpans of a traced request, else None
    # streamed tokens per response after the first (the stream_interval parameter)
    interval: int = 1

    def __post_init__(self):
        if not self.choices:
            self.choices = [
                Choice(self.request_id if i == 0 else f"{self.request_id}__child#{i - 1}", i)
                for i in range(self.n)
            ]

    @property
    def done(self) -> bool:
        return all(choice.done for choice in self.choices)

    def choice(self, request_id: str) -> Choice | None:
        for choice in self.choices:
            if choice.request_id == request_id:
                return choice
        return None

    def generated(self) -> int:
        return sum(len(choice.tokens) for choice in self.choices)


def take_tokens(
    stream: Stream, choice: Choice, generated: list, logprobs: list
) -> tuple[bool, int]:
    """Append the choice's new tokens (and their log prob records); (complete: end_id, stop word or length,
    tokens appended)."""
    start = choice.seen
    new = generated[start:]
    choice.seen = len(generated)
    appended = 0
    for offset, token in enumerate(new):
        if token == stream.end_id and len(choice.tokens) >= stream.min_tokens:
            return True, appended
        choice.tokens.append(token)
        if stream.want_logprobs:
            position = start + offset
            choice.logprobs.append(
                logprobs[position] if position < len(logprobs) else (0.0, (), ())
            )
        choice.unsent += 1
        appended += 1
        if len(choice.tokens) >= stream.max_tokens or _ends_with_stop(
            choice.tokens, stream.stop_words
        ):
            return True, appended
    return False, appended


def due(choice: Choice, interval: int) -> bool:
    """Whether a streamed choice with unsent tokens gets a response now: its first, or its tokens have reached
    the next multiple of `interval` (TensorRT-LLM's stream_interval: responses at token 1, N, 2N, ...; the
    rest goes with the choice's last response)."""
    sent = len(choice.tokens) - choice.unsent
    return sent == 0 or len(choice.tokens) // interval > sent // interval


def _ends_with_stop(tokens: list, stop_words: list) -> bool:
    return any(len(tokens) >= len(w) and tokens[-len(w) :] == w for w in stop_words)


def response_tensors(pb_utils, stream: Stream, choice: Choice, block_size: int) -> list | None:
    """The outputs of the choice's next response (its unsent tokens when streaming, all of them otherwise);
    None when a streamed response would carry nothing."""
    if stream.streaming:
        first = len(choice.tokens) - choice.unsent
        tokens = choice.tokens[first:]
    else:
        first = 0
        tokens = choice.tokens if stream.exclude_input else stream.prompt + choice.tokens
    choice.unsent = 0
    if not tokens and stream.streaming and not stream.want_perf:
        return None

    def tensor(name, value, dtype):
        return pb_utils.Tensor(name, np.asarray(value, dtype=dtype))

    outputs = [
        tensor("output_ids", [[tokens]], np.int32),
        tensor("sequence_length", [[len(tokens)]], np.int32),
    ]
    if stream.n > 1:
        outputs.append(tensor("sequence_index", [[choice.index]], np.int32))
    if stream.want_logprobs:
        outputs += _logprob_tensors(tensor, stream, choice, first)
    if stream.want_perf:
        total = len(stream.prompt) + len(choice.tokens)
        reused = stream.cached_tokens // block_size
        outputs += perf_outputs(pb_utils, stream.timing, total, block_size, reused_blocks=reused)
    return outputs


def _logprob_tensors(tensor, stream: Stream, choice: Choice, first: int) -> list:
    records = choice.logprobs[first:] if stream.streaming else choice.logprobs
    outputs = [
        tensor("output_log_probs", [[[r[0] for r in records]]], np.float32),
        tensor("cum_log_probs", [[sum(r[0] for r in choice.logprobs)]], np.float32),
    ]
    k = stream.top_logprobs
    if k:
        ids = [list(r[1]) + [-1] * (k - len(r[1])) for r in records]
        values = [list(r[2]) + [float("-inf")] * (k - len(r[2])) for r in records]
        outputs += [
            tensor(
                "top_logprob_ids", np.array(ids, np.int32).reshape(1, len(records), k), np.int32
            ),
            tensor(
                "top_logprobs", np.array(values, np.float32).reshape(1, len(records), k), np.float32
            ),
        ]
    return outputs
