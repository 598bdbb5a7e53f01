"""How the CPU engine picks each token: one continuous-batching logits processor, `Decoder`, that decides
every row of a step itself, as TensorRT-LLM defines each setting.

transformers' continuous batching runs a chain of per-request processors over the step's logits, then
its own argmax. We build the manager without its sampling processors and install this one: it sees the
raw fp32 logits of every request that gets a token this step and, per row, in TensorRT-LLM's order
(penaltyKernels.cu, batchApplyPenalty; samplingTopKKernels / TopP):

1. the raw log probs, if the request asked (`return_log_probs`: log_softmax of the model's logits,
   before anything below, as vLLM's default "raw" logprobs);
2. the grammar's mask (guided decoding), before anything that truncates, so top-k/top-p and the draw
   run over the allowed tokens only;
3. embedding_bias (OpenAI's logit_bias), then 1/temperature, then for every token seen in the prompt or
   the output so far: repetition (divide a positive logit, multiply a negative one), presence (minus
   once) and frequency (minus per occurrence) penalties; TensorRT-LLM counts the prompt too;
4. greedy rows take the argmax; sampled rows keep the top-k, then the top-p share of those, and draw
   with a generator seeded by (the request's seed, its choice, the step): the same seed gives the same
   text under any load, each of n choices its own. The step counts every token generated, also across a
   soft reset (transformers re-queues a request under KV pressure with its output moved into its prompt).

It returns one-hot rows, so the manager's argmax takes exactly the chosen token. Drawing from the top-k
candidates only (instead of a full sort of the vocabulary per processor, as transformers' top-k and top-p
warpers do) is what makes sampled steps cheap (/work/notes/cpu_features.md, section 6).
"""

from __future__ import annotations

import hashlib
import queue
import re
from dataclasses import dataclass

import torch
from transformers.generation.continuous_batching.cb_logits_processors import (
    ContinuousBatchingLogitsProcessor,
)

CHILD = re.compile(r"__child#(\d+)$")  # transformers' id of choice i+1 of a request forked n ways
# A sampled row without top-k draws from this many top candidates when they hold the top-p mass.
TOP_P_PREFIX = 1024
SEED_MASK = 0x7FFFFFFFFFFFFFFF


@dataclass(frozen=True)
class RequestDecoding:
    """What one request asked of the decoding step (the `decoding` kwarg of its add_request)."""

    temperature: float = 1.0
    top_k: int = 1  # 1: greedy; the vocabulary size: no top-k
    top_p: float = 1.0
    seed: int | None = None  # sampled requests always have one (TensorRT-LLM's default is 0)
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logit_bias: tuple[tuple[int, float], ...] = ()  # (token id, bias), the non-zero embedding_bias
    logprobs: int = -1  # -1: none; 0: each token's own log prob; k: and the k most likely tokens'
    guide: int = 0  # the request's grammar (GrammarMasks.register), 0: none
    end_id: int = -1  # the end token the grammar allows where the output may end
    adapter: int = 0  # the LoRA adapter's task id (lora.py routes its tokens), 0: the base model

    @property
    def sampled(self) -> bool:
        return self.top_k > 1

    @property
    def penalized(self) -> bool:
        return (
            self.repetition_penalty != 1.0
            or self.presence_penalty != 0.0
            or self.frequency_penalty != 0.0
        )


GREEDY = RequestDecoding()


def step_seed(seed: int, step: int) -> int:
    """A non-zero 31-bit generator seed for (request seed, decode step)."""
    digest = hashlib.blake2b(f"{seed}:{step}".encode(), digest_size=4).digest()
    return (int.from_bytes(digest, "little") & 0x7FFFFFFF) | 1


def choice_index(request_id: str) -> int:
    """0 for a request, i + 1 for its fork `__child#i` (choice i + 1 of n)."""
    match = CHILD.search(request_id)
    return 0 if match is None else int(match.group(1)) + 1


def choice_seed(seed: int, request_id: str) -> int:
    """The seed of one choice: the request's own for choice 0 (so n = 1 is unchanged), a derived one else."""
    index = choice_index(request_id)
    return seed if index == 0 else (seed * 1_000_003 + index) & SEED_MASK


def full_generated(state) -> list[int]:
    """Every token the request generated, also across a soft reset (which moves them into its prompt)."""
    if state._true_initial_tokens:
        return state.initial_tokens[state._true_initial_tokens :] + state.generated_tokens
    return state.generated_tokens


def prompt_of(state) -> list[int]:
    """The request's own prompt, also after a soft reset."""
    if state._true_initial_tokens:
        return state.initial_tokens[: state._true_initial_tokens]
    return state.initial_tokens


def row_seed(state, decoding: RequestDecoding) -> int:
    """The generator seed of this request's next draw."""
    seed = choice_seed(decoding.seed or 0, state.request_id)
    return step_seed(seed, len(full_generated(state)))


@dataclass
class _Row:
    state: object
    decoding: RequestDecoding
    seed: int


class PenaltyCounts:
    """Per request: how often each token occurs in its prompt and output so far (TensorRT-LLM counts both)."""

    def __init__(self, vocab_size: int):
        self.vocab_size = vocab_size
        self.entries: dict[
            str, list
        ] = {}  # request id -> [counts int32 [V], seen ids tensor, tokens counted]

    def seen(self, state) -> tuple[torch.Tensor, torch.Tensor]:
        """(ids seen so far, their counts) for this request, brought up to date."""
        entry = self.entries.get(state.request_id)
        generated = full_generated(state)
        if entry is None:
            tokens = torch.tensor(
                [t for t in prompt_of(state) if t < self.vocab_size], dtype=torch.long
            )
            entry = [torch.bincount(tokens, minlength=self.vocab_size).to(torch.int32), None, 0]
            self.entries[state.request_id] = entry
        counts = entry[0]
        new = [t for t in generated[entry[2] :] if 0 <= t < self.vocab_size]
        if new or entry[1] is None:
            counts.index_add_(
                0, torch.tensor(new, dtype=torch.long), torch.ones(len(new), dtype=torch.int32)
            )
            entry[1] = counts.nonzero().flatten()
        entry[2] = len(generated)
        return entry[1], counts[entry[1]]

    def forget(self, request_id: str) -> None:
        self.entries.pop(request_id, None)


class Decoder(ContinuousBatchingLogitsProcessor):
    """The only processor of the CPU engine's manager: it decides every row's token (module docstring)."""

    supported_kwargs = {"decoding": RequestDecoding}
    ignored_kwargs = ()

    def __init__(self, vocab_size: int, grammars=None):
        self.vocab_size = vocab_size
        self.grammars = grammars  # GrammarMasks, or None when the engine has no tokenizer for them
        self.penalties = PenaltyCounts(vocab_size)
        self.rows: list[_Row] = []
        self.masks: dict[int, torch.Tensor] = {}  # row -> allowed tokens (bool [V]) this step
        self._released: queue.SimpleQueue = queue.SimpleQueue()
        # Released while still in a step's batch (the router ends a request before the manager has
        # taken it out): forgotten at the first step without it, never re-created after.
        self._ending: set[str] = set()

    def release(self, request_id: str) -> None:
        """Forget a request's state (thread-safe: the engine's router calls it when a request ends)."""
        self._released.put(request_id)

    def fill_defaults(self, int32_tensor: torch.Tensor) -> None:
        int32_tensor.fill_(0)

    def prepare_tensor_args(self, requests_with_new_token) -> torch.Tensor:
        """Runs in the generation thread before the step's forward: every row's settings and state."""
        self.rows = []
        for future in requests_with_new_token:
            state = future.state
            decoding = state.logit_processor_kwargs.get("decoding", GREEDY)
            self.rows.append(_Row(state, decoding, row_seed(state, decoding)))
        self._forget_finished({row.state.request_id for row in self.rows})
        self.masks = {}
        if self.grammars is not None:
            for index, row in enumerate(self.rows):
                if row.decoding.guide:
                    self.masks[index] = self.grammars.allowed(row.state, row.decoding)
        return torch.zeros(len(self.rows), dtype=torch.int32)

    def _forget_finished(self, in_batch: set[str]) -> None:
        while not self._released.empty():
            self._ending.add(self._released.get())
        for request_id in self._ending - in_batch:
            self.penalties.forget(request_id)
            if self.grammars is not None:
                self.grammars.forget(request_id)
        self._ending &= in_batch

    def __call__(self, scores: torch.Tensor, tensor_arg: torch.Tensor) -> torch.Tensor:
        # One row per request in the batch; only the first len(self.rows) get a token this step (the rest
        # are split prefills, whose rows are padding): they get any finite value.
        n = len(self.rows)
        chosen = torch.full_like(scores, float("-inf"))
        chosen[n:, 0] = 0.0
        if n == 0:
            return chosen
        raw = scores[:n]
        logprobs = self._raw_logprobs(raw)
        shaped = self._shaped(raw)
        tokens = shaped.argmax(dim=-1)
        for index, row in enumerate(self.rows):
            if row.decoding.sampled:
                tokens[index] = self._draw(shaped[index], row)
        chosen[torch.arange(n), tokens] = 0.0
        if logprobs:
            self._record(logprobs, tokens)
        return chosen

    def _raw_logprobs(self, raw: torch.Tensor) -> dict[int, torch.Tensor]:
        wanted = [i for i, row in enumerate(self.rows) if row.decoding.logprobs >= 0]
        if not wanted:
            return {}
        values = torch.log_softmax(raw[wanted], dim=-1)
        return {row: values[j] for j, row in enumerate(wanted)}

    def _shaped(self, raw: torch.Tensor) -> torch.Tensor:
        """The logits each row draws from: masked, biased, divided by the temperature, penalized."""
        shaped = raw.clone()  # never write into the raw logits
        for index, allowed in self.masks.items():
            shaped[index].masked_fill_(~allowed, float("-inf"))
        for index, row in enumerate(self.rows):
            decoding = row.decoding
            if decoding.logit_bias:
                ids, biases = zip(*decoding.logit_bias, strict=True)
                shaped[index].index_add_(0, torch.tensor(ids), torch.tensor(biases))
            if decoding.sampled and decoding.temperature != 1.0:
                shaped[index] /= decoding.temperature
            if decoding.penalized:
                self._penalize(shaped[index], row)
        return shaped

    def _penalize(self, logits: torch.Tensor, row: _Row) -> None:
        ids, counts = self.penalties.seen(row.state)
        if ids.numel() == 0:
            return
        decoding = row.decoding
        x = logits[ids]
        rep = decoding.repetition_penalty
        x = torch.where(x < 0, x * rep, x / rep)
        x = x - decoding.presence_penalty - decoding.frequency_penalty * counts.to(x.dtype)
        logits[ids] = x

    def _draw(self, logits: torch.Tensor, row: _Row) -> int:
        decoding = row.decoding
        top_k, top_p = min(decoding.top_k, self.vocab_size), decoding.top_p
        if top_k < self.vocab_size:
            values, ids = torch.topk(logits, top_k)
        elif top_p < 1.0:
            values, ids = torch.topk(logits, min(TOP_P_PREFIX, self.vocab_size))
            if (
                torch.softmax(logits, -1)[ids].sum() < top_p
            ):  # the prefix misses some of the top-p mass
                values, ids = torch.sort(logits, descending=True)
        else:
            values, ids = logits, None
        probs = torch.softmax(values, dim=-1)
        if top_p < 1.0:
            above = torch.cumsum(probs, -1) - probs  # the mass of the candidates before each one
            probs = torch.where(above < top_p, probs, torch.zeros_like(probs))
        if not (torch.isfinite(probs).all() and probs.sum() > 0):
            # NaN or infinite logits: a broken checkpoint (temperatures that would overflow them are decoded
            # greedily upstream). Failing the step fails the requests in it and the engine restarts its loop;
            # a made-up token would be a silent wrong answer.
            raise ValueError(
                "the model produced nan or infinite logits; the sampling step cannot draw a token"
            )
        generator = torch.Generator().manual_seed(row.seed)
        pick = int(torch.multinomial(probs, 1, generator=generator))
        return pick if ids is None else int(ids[pick])

    def _record(self, logprobs: dict[int, torch.Tensor], tokens: torch.Tensor) -> None:
        """Each asking row's (log prob of its token, (top ids), (top log probs)), appended to its state's
        logprobs: transformers copies those into every result of the request, streamed or final."""
        for index, values in logprobs.items():
            row = self.rows[index]
            token = int(tokens[index])
            top = row.decoding.logprobs
            if top > 0:
                best, ids = torch.topk(values, top)
                alternatives = (tuple(ids.tolist()), tuple(best.tolist()))
            else:
                alternatives = ((), ())
            row.state.logprobs.append((float(values[token]), *alternatives))


def install_decoder(manager, decoder: Decoder) -> None:
    """Make `decoder` the manager's only processor, its own step an argmax; call before manager.start()."""
    processors = manager.logit_processor
    processors.logits_processor.clear()
    processors.logits_processor.append(decoder)
    processors.tensors_required = 1
    processors._retrieve_processors_kwargs()
    processors.do_processing = True
    manager.generation_config.do_sample = False
