"""A request's decoding inputs (the engine contract's tensors) -> sampling.RequestDecoding, as TensorRT-LLM
reads them: its sampling rule and defaults, penalties, embedding_bias, log probs, n and guided decoding.
Every value out of range is refused naming the input (textcodec.Refused: the client's error)."""

from __future__ import annotations

import math

import numpy as np

from guides import GuideError
from params import scalar
from sampling import RequestDecoding
from textcodec import Refused

# Below this a temperature divides logits past float32's range (NaN probabilities); sampling at it
# is greedy decoding in all but name, so it is decoded greedily (TensorRT-LLM scales by 1/(t + 1e-6)).
GREEDY_BELOW_TEMPERATURE = 1e-5
MAX_TOP_LOGPROBS = 20  # alternatives per token (OpenAI's bound on top_logprobs)
MAX_RETURN_SEQUENCES = 128  # OpenAI's bound on n


class DecodingInputs:
    """Reads one request's decoding inputs for an engine with this vocabulary (and grammars, when it has)."""

    def __init__(self, pb_utils, vocab_size: int, grammars=None, no_grammars: str = ""):
        self.pb_utils = pb_utils
        self.vocab_size = vocab_size
        self.grammars = grammars
        self.no_grammars = no_grammars  # why there are none

    def _scalar(self, request, name: str, default=None):
        return scalar(self.pb_utils, request, name, default)

    def decoding(self, request, end_id: int) -> RequestDecoding:
        """Everything but the guide (see guide()), which is registered last: nothing to undo on a refusal."""
        logprobs = self.logprobs(request)
        return RequestDecoding(
            **self.sampling(request),
            **self.penalties(request),
            logit_bias=self.logit_bias(request),
            logprobs=logprobs,
            end_id=end_id,
        )

    def sampling(self, request) -> dict:
        """TensorRT-LLM's rule: with beam width 1, greedy unless runtime_top_k > 1 or runtime_top_p > 0.

        A temperature alone does not sample (the stock end-to-end client sends temperature 1.0 and
        gets greedy text); top_p <= 0 counts as absent; top_k 1 is argmax. An unseeded sampled request
        uses seed 0, TensorRT-LLM's default, so the same request gives the same sample.
        """
        temperature = self._scalar(request, "temperature")
        top_k = int(self._scalar(request, "runtime_top_k", 0) or 0)
        top_p = float(self._scalar(request, "runtime_top_p", 0.0) or 0.0)
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
            "seed": int(self._scalar(request, "seed", 0) or 0) & 0x7FFFFFFFFFFFFFFF,
        }

    def penalties(self, request) -> dict:
        values = {
            "repetition_penalty": float(self._scalar(request, "repetition_penalty", 1.0)),
            "presence_penalty": float(self._scalar(request, "presence_penalty", 0.0)),
            "frequency_penalty": float(self._scalar(request, "frequency_penalty", 0.0)),
        }
        for name, value in values.items():
            if not math.isfinite(value):
                raise Refused(f"{name}={value} must be a finite number")
        if values["repetition_penalty"] <= 0:
            raise Refused(
                f"repetition_penalty={values['repetition_penalty']} must be > 0 (1: no penalty)"
            )
        return values

    def logit_bias(self, request) -> tuple[tuple[int, float], ...]:
        """embedding_bias: one FP32 per logit (the engine's vocabulary size), added before the temperature;
        empty means none (the stock preprocessing sends [0] when no words are biased)."""
        tensor = self.pb_utils.get_input_tensor_by_name(request, "embedding_bias")
        if tensor is None:
            return ()
        bias = tensor.as_numpy().reshape(-1)
        if bias.size == 0 or not bias.any():
            return ()
        if bias.size != self.vocab_size:
            raise Refused(
                f"embedding_bias holds {bias.size} values; it takes one per token of the vocabulary "
                f"({self.vocab_size}), as TensorRT-LLM does"
            )
        if not np.isfinite(bias).all():
            raise Refused("embedding_bias holds a value that is not a finite number")
        ids = np.flatnonzero(bias)
        return tuple(zip(ids.tolist(), bias[ids].astype(float).tolist(), strict=True))

    def logprobs(self, request) -> int:
        """-1: no log probs; else how many alternatives per token besides the token's own."""
        if not bool(self._scalar(request, "return_log_probs", False)):
            if int(self._scalar(request, "num_top_logprobs", 0) or 0):
                raise Refused("num_top_logprobs needs return_log_probs true")
            return -1
        top = int(self._scalar(request, "num_top_logprobs", 0) or 0)
        if not 0 <= top <= MAX_TOP_LOGPROBS:
            raise Refused(f"num_top_logprobs={top} must be between 0 and {MAX_TOP_LOGPROBS}")
        return top

    def return_sequences(self, request, decoupled: bool) -> int:
        n = int(self._scalar(request, "num_return_sequences", 1) or 1)
        if not 1 <= n <= MAX_RETURN_SEQUENCES:
            raise Refused(f"num_return_sequences={n} must be between 1 and {MAX_RETURN_SEQUENCES}")
        if n > 1 and not decoupled:
            raise Refused(
                "num_return_sequences > 1 answers each sequence with its own response, which only a "
                "decoupled model can: rebuild without --no-decoupled"
            )
        return n

    def guide(self, request) -> tuple[str, str | None] | None:
        """(guide type, guide) when the request is guided; None when not."""
        kind = self._text(request, "guided_decoding_guide_type")
        guide = self._text(request, "guided_decoding_guide")
        if kind is None:
            if guide is not None:
                raise Refused("guided_decoding_guide needs guided_decoding_guide_type")
            return None
        return kind, guide

    def register_guide(self, request) -> int:
        """The request's grammar registered with the engine's grammars (0: none)."""
        found = self.guide(request)
        if found is None:
            return 0
        if self.grammars is None:
            raise Refused(
                f"guided decoding is not available on this CPU engine: {self.no_grammars}",
                "unsupported_parameter",
            )
        try:
            return self.grammars.register(*found)
        except GuideError as exc:
            raise Refused(str(exc), "invalid_guide") from None

    def _text(self, request, name: str) -> str | None:
        tensor = self.pb_utils.get_input_tensor_by_name(request, name)
        if tensor is None:
            return None
        values = tensor.as_numpy().reshape(-1)
        if values.size != 1:
            raise Refused(f"{name} holds {values.size} strings; send exactly one")
        value = values[0]
        try:
            return value.decode("utf-8") if isinstance(value, bytes) else str(value)
        except UnicodeDecodeError:
            raise Refused(f"{name} is not valid UTF-8") from None
