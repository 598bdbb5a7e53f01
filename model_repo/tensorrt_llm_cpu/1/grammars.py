"""Guided decoding in the CPU engine: each request's guide compiled once (cached by guide), and for each
of its choices a matcher that follows the tokens generated and gives the tokens allowed next.

A guide is compiled when its request is admitted (in Triton's thread: a guide that does not compile is
refused there, never inside a step, where an error would fail every request of the batch). The decoding
step (sampling.Decoder, in the generation thread) asks `allowed` for each constrained row. The request's
end token is allowed exactly where the output may end, and is the only one allowed once it is complete;
the engine's end_id then ends the request, as for any other.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections import OrderedDict

import torch

from guides import GuideError, grammar_for
from sampling import full_generated

BITS = torch.arange(32, dtype=torch.int32)
CACHE_SIZE = 64  # compiled guides kept (least recently used first out)


class GrammarMasks:
    def __init__(self, tokenizer_json: str, vocab_size: int, end_ids, cache_size: int = CACHE_SIZE):
        import llguidance

        self.tokenizer = llguidance.LLTokenizer(
            tokenizer_json, n_vocab=vocab_size, eos_token=list(end_ids)
        )
        self.vocab_size = vocab_size
        self.words = (vocab_size + 31) // 32  # the mask: one bit per token, in int32 words
        self.end_ids = list(dict.fromkeys(end_ids))
        self.cache_size = cache_size
        self._compiled: OrderedDict[tuple[str, str], object] = OrderedDict()
        self._lock = threading.Lock()
        self._ids = itertools.count(1)
        self._guides: dict[int, object] = {}  # registered guide id -> its fresh matcher
        self._matchers: dict[str, list] = {}  # request (choice) id -> [matcher, tokens consumed]
        self.compiled = self.reused = 0
        self.compile_s = 0.0

    # --- Triton's thread -----------------------------------------------------------------------
    def register(self, guide_type: str, guide: str | None) -> int:
        """A request's guide, compiled or taken from the cache; its id (RequestDecoding.guide). GuideError
        when it does not compile."""
        template = self._template(guide_type, guide or "")
        guide_id = next(self._ids)
        self._guides[guide_id] = template.deep_copy()
        return guide_id

    def unregister(self, guide_id: int) -> None:
        self._guides.pop(guide_id, None)

    def _template(self, guide_type: str, guide: str):
        from llguidance import LLMatcher

        key = (guide_type, guide)
        with self._lock:
            template = self._compiled.get(key)
            if template is not None:
                self._compiled.move_to_end(key)
                self.reused += 1
                return template
        started = time.perf_counter()
        matcher = LLMatcher(self.tokenizer, grammar_for(guide_type, guide), log_level=0)
        if matcher.is_error():
            raise GuideError(f"the {guide_type} guide does not compile: {matcher.get_error()}")
        with self._lock:
            self.compiled += 1
            self.compile_s += time.perf_counter() - started
            self._compiled[key] = matcher
            while len(self._compiled) > self.cache_size:
                self._compiled.popitem(last=False)
        return matcher

    # --- the generation thread -----------------------------------------------------------------
    def allowed(self, state, decoding) -> torch.Tensor:
        """bool [vocab]: the tokens this request (choice) may take next."""
        entry = self._matchers.get(state.request_id)
        if entry is None:
            template = self._guides.get(decoding.guide)
            if template is None:  # released while still in the batch (cancelled): let it end
                return self._only(decoding.end_id)
            entry = self._matchers[state.request_id] = [template.deep_copy(), 0]
        matcher = entry[0]
        generated = full_generated(state)
        for token in generated[entry[1] :]:
            if token != decoding.end_id and token not in self.end_ids:
                matcher.consume_token(token)  # an end token is the engine's: it ends the request
        entry[1] = len(generated)
        if matcher.is_error():  # cannot happen while the mask is applied; never loop on it
            return self._only(decoding.end_id)
        bits = torch.zeros(self.words, dtype=torch.int32)
        matcher.unsafe_compute_mask_ptr(bits.data_ptr(), self.words * 4)
        allowed = ((bits.unsqueeze(-1) >> BITS) & 1).view(-1)[: self.vocab_size].bool()
        may_end = bool(allowed[self.end_ids].any())
        allowed[self.end_ids] = False
        if decoding.end_id >= 0:
            allowed[decoding.end_id] = may_end
        return allowed if allowed.any() else self._only(decoding.end_id)

    def _only(self, end_id: int) -> torch.Tensor:
        allowed = torch.zeros(self.vocab_size, dtype=torch.bool)
        allowed[end_id if end_id >= 0 else self.end_ids[0]] = True
        return allowed

    def forget(self, request_id: str) -> None:
        self._matchers.pop(request_id, None)

    def stats(self) -> dict:
        with self._lock:
            return {"compiled": self.compiled, "reused": self.reused, "compile_s": self.compile_s}
