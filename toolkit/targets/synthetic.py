"""The `synthetic` target: the engine's contract without a model, to measure the serving stack alone."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import ClassVar

from toolkit.build_settings import BuildSettings
from toolkit.capabilities import Capabilities
from toolkit.model.tokens import TokenFacts
from toolkit.targets.base import HOST_OVERHEAD_BYTES, LORA_HINT, Resources, lora_capability
from toolkit.targets.python import PythonEngine, PythonTarget

# Measured decode steps run slower than planned under load: the drain allows twice the step time.
STEP_MARGIN = 2.0
SYNTHETIC_CPUS = 2
SYNTHETIC_TEXT = (
    " The quick brown fox jumps over the lazy dog while a patient engineer measures every layer of"
    " the serving stack, one streamed token at a time."
)
NO_MODEL = "the synthetic engine has no model, so nothing to compute it from; build for the cpu or a GPU target"


@dataclass(frozen=True)
class SyntheticEngine(PythonEngine):
    """Tokens without a model at a set step time, to measure the serving stack alone."""

    step_time_ms: float = 0.0
    # Cycled through as output: plain words of the tokenizer (filled in by prepared()).
    token_ids: tuple[int, ...] = field(default=())
    # A scripted answer (toolkit build --synthetic-output): every request gets these tokens, then ends.
    synthetic_output: str = ""
    kind: ClassVar[str] = "synthetic"
    source_folder: ClassVar[str] = "tensorrt_llm_synthetic"

    def prepared(self, checkpoint: Path, tokens: TokenFacts) -> SyntheticEngine:
        if self.token_ids:
            return self
        if self.synthetic_output:
            return replace(self, token_ids=tuple(script_ids(checkpoint, self.synthetic_output)))
        return replace(self, token_ids=tuple(plain_word_ids(checkpoint, tokens)))

    def engine_parameters(self) -> dict:
        return {
            "step_time_ms": self.step_time_ms,
            "token_ids": ",".join(str(i) for i in self.token_ids),
            "cancel_check_steps": 64,
            "scripted": bool(self.synthetic_output),
        }

    @classmethod
    def fields_from(cls, parameters: dict) -> dict:
        return {**parameters, "token_ids": tuple(parameters.get("token_ids", ()))}


def script_ids(checkpoint: Path, text: str) -> list[int]:
    """The token ids of a scripted answer; the tokenizer's special tokens written in it are those tokens."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(checkpoint / "tokenizer.json"))
    return tokenizer.encode(text, add_special_tokens=False).ids


def plain_word_ids(checkpoint: Path, tokens: TokenFacts) -> list[int]:
    """Ids of ordinary words for the synthetic engine to emit, so its text looks like text."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(checkpoint / "tokenizer.json"))
    ids = tokenizer.encode(SYNTHETIC_TEXT, add_special_tokens=False).ids
    ends = {tokens.end_id, *tokens.stop_ids}
    # Each id once: a position in the cycle names one token.
    return [i for i in dict.fromkeys(ids) if i not in ends]


class SyntheticTarget(PythonTarget):
    name = "synthetic"
    kind = "synthetic"
    description = "the synthetic engine (tokens without a model, at a set step time)"
    engine_class = SyntheticEngine
    engine_settings = ("step_time_ms", "synthetic_output")

    def capabilities(self, settings: BuildSettings) -> Capabilities:
        return Capabilities(
            target=self.name,
            streaming=bool(settings.decoupled),
            engine_stream_interval=True,
            enable={
                feature: NO_MODEL
                for feature in (
                    "guided_decoding",
                    "logprobs",
                    "top_logprobs",
                    "prompt_logprobs",
                    "n",
                    "beam_width",
                    "penalties",
                    "logit_bias",
                    "bad_words",
                    "batched_prompts",
                    "generation_logits",
                    "context_logits",
                    "top_p_decay",
                )
            }
            | {"streaming": "rebuild without --no-decoupled", "lora": LORA_HINT},
            # Adapter ids are taken (the same tokens for each), so the stack can be measured with them.
            lora=lora_capability(settings),
        )

    def slowest_stream_tokens_per_s(self, repository) -> float:
        engine = self.engine_from_section(repository.manifest.engine)
        step_ms = getattr(engine, "step_time_ms", 0.0)
        return float("inf") if step_ms <= 0 else 1000 / (step_ms * STEP_MARGIN)

    def resources(self, repository, load_bytes: int, world_size: int) -> Resources:
        return Resources(HOST_OVERHEAD_BYTES, SYNTHETIC_CPUS)
