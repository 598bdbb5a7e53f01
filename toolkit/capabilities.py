"""What a built repository honours: one typed record, decided by its target and build settings.

The target (toolkit.targets) decides the record at build time, the manifest carries it, and the
OpenAI API, `toolkit generate`, `toolkit bench` and the Python engines refuse from it, each refusal
naming the target and the build setting (or target) that would enable the feature. A feature is
never silently ignored.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import Any

# Guided-decoding kinds, by the names the OpenAI API and TensorRT-LLM's guided decoding use.
GUIDE_KINDS = ("json_object", "json_schema", "regex", "ebnf")
MAX_N = 128  # OpenAI's bound on n
MAX_TOP_LOGPROBS = 20  # OpenAI's bound on top_logprobs
# Where top log probs come from: the engine's own outputs (the Python engines' top_logprob_ids and
# top_logprobs), or the generation logits the API reduces itself (a GPU engine built to gather them).
TOP_LOGPROBS_SOURCES = ("engine", "generation_logits")

# Each feature: what a client asks for, in words (the refusal's subject).
FEATURES = {
    "guided_decoding": "structured output (response_format, guided decoding)",
    "logprobs": "log probabilities (logprobs)",
    "top_logprobs": "top log probabilities (top_logprobs)",
    "prompt_logprobs": "prompt log probabilities (echo with logprobs)",
    "n": "several choices per request (n > 1, num_return_sequences)",
    "beam_width": "beam search (beam_width > 1)",
    "penalties": "presence, frequency and repetition penalties",
    "logit_bias": "logit bias (logit_bias, embedding_bias)",
    "bad_words": "bad words",
    "lora": "LoRA adapters",
    "batched_prompts": "several prompts in one engine request",
    "generation_logits": "generation logits (return_generation_logits)",
    "context_logits": "context logits (return_context_logits)",
    "top_p_decay": "top-p decay (runtime_top_p_decay, runtime_top_p_reset_ids)",
    "streaming": "streaming (stream: true)",
}


@dataclass(frozen=True)
class Capabilities:
    """The request features a repository honours. `enable` says, per feature it does not honour (or
    honours only in part), what would: a build setting, or another target."""

    target: str
    guided_decoding: tuple[str, ...] = ()  # GUIDE_KINDS it takes
    logprobs: bool = False  # the log prob of each generated token
    top_logprobs: int = 0  # most alternatives per token (0: none)
    top_logprobs_source: str = ""  # TOP_LOGPROBS_SOURCES ("" when top_logprobs is 0)
    prompt_logprobs: bool = False
    max_n: int = 1  # most choices (return sequences) per request
    max_beam_width: int = 1
    penalties: bool = False
    logit_bias: bool = False
    bad_words: bool = False
    lora: tuple[str, ...] = ()  # adapter names the repository serves
    batched_prompts: bool = False
    generation_logits: bool = False
    context_logits: bool = False
    top_p_decay: bool = False
    streaming: bool = True
    # Whether the engine reports the KV blocks a request took from its prefix cache (kv_cache_reused_blocks),
    # from which the API gives usage.prompt_tokens_details.cached_tokens.
    cached_tokens: bool = False
    # Whether the engine itself answers every N tokens when a request's stream_interval parameter asks
    # (--stream-interval); else the API holds the engine's per-step responses into chunks of N.
    engine_stream_interval: bool = False
    enable: dict[str, str] = field(default_factory=dict)

    def supports(self, feature: str) -> bool:
        value = {
            "n": self.max_n > 1,
            "beam_width": self.max_beam_width > 1,
            "guided_decoding": bool(self.guided_decoding),
            "top_logprobs": self.top_logprobs > 0,
            "lora": bool(self.lora),
        }.get(feature)
        return bool(getattr(self, feature)) if value is None else value

    def refusal(self, feature: str, detail: str = "") -> str:
        """Why `feature` is refused here, naming the target and what would enable it."""
        what = FEATURES[feature]
        how = self.enable.get(feature, "no build setting enables it on this target")
        extra = f" ({detail})" if detail else ""
        return f"{what}{extra} is not supported by this repository (target {self.target}): {how}"

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["guided_decoding"] = list(self.guided_decoding)
        data["lora"] = list(self.lora)
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Capabilities:
        known = {f.name for f in fields(cls)}
        values = {k: v for k, v in data.items() if k in known}
        for name in ("guided_decoding", "lora"):
            values[name] = tuple(values.get(name, ()))
        values["enable"] = dict(values.get("enable", {}))
        return cls(**values)
