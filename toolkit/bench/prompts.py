"""Prompts of an exact token length, from the served repository's own tokenizer, as perf_analyzer input.

A prompt is a run of whole-word vocabulary entries (" river", " table", ...). The byte-level and
metaspace pre-tokenizers split text at spaces, so each such word stays one token and a prompt of
N words is N tokens; every prompt is still re-encoded and checked, and adjusted word by word.
"""

from __future__ import annotations

import json
import os
import random
import re
from dataclasses import dataclass
from pathlib import Path

from toolkit.errors import BenchError
from toolkit.repository import contract as c
from toolkit.repository.sources import common_module

_WORD = re.compile(r"^ [a-z]{3,10}$")


@dataclass(frozen=True)
class PromptSet:
    prompts: tuple[str, ...]
    token_ids: tuple[tuple[int, ...], ...]  # as the preprocessing will encode them
    input_tokens: int


def make_prompts(
    tokenizer_json: Path,
    count: int,
    input_tokens: int,
    *,
    add_special_tokens: bool = False,
    bos_id: int | None = None,
    seed: int = 0,
) -> PromptSet:
    """`count` prompts of exactly `input_tokens` tokens as the repository's preprocessing encodes them
    (the same TextCodec.encode_prompt, special tokens and BOS rule included)."""
    if count < 1 or input_tokens < 1:
        raise BenchError(
            f"--prompts={count} and --input-tokens={input_tokens} must be at least 1",
            hint="pass positive numbers",
        )
    codec = common_module("textcodec").TextCodec(tokenizer_json.parent)
    words = _word_pool(codec.tokenizer)
    rng = random.Random(seed)
    encode = lambda text: codec.encode_prompt(text, add_special_tokens, bos_id)  # noqa: E731
    prompts, ids = [], []
    for _ in range(count):
        text, encoded = _exact_prompt(encode, words, input_tokens, rng)
        prompts.append(text)
        ids.append(tuple(encoded))
    return PromptSet(tuple(prompts), tuple(ids), input_tokens)


def _word_pool(tokenizer) -> list[str]:
    words = []
    for token_id in range(tokenizer.get_vocab_size(with_added_tokens=False)):
        text = tokenizer.decode([token_id])
        if _WORD.match(text):
            words.append(text)
    if len(words) < 50:
        raise BenchError(
            "the tokenizer has too few whole-word tokens to build prompts from",
            hint="pass another --tokenizer",
        )
    return words


def _exact_prompt(encode, words: list[str], n: int, rng: random.Random) -> tuple[str, list[int]]:
    chosen = [rng.choice(words) for _ in range(n)]
    for _ in range(4 * n + 20):
        text = "".join(chosen).lstrip()
        ids = encode(text)
        if len(ids) == n:
            return text, ids
        if len(ids) > n and len(chosen) > 1:
            chosen.pop()
        elif len(ids) < n:
            chosen.append(rng.choice(words))
        else:
            chosen[0] = rng.choice(words)  # a single word that is more than n tokens on its own
    raise BenchError(
        f"could not build a prompt of exactly {n} tokens with this tokenizer",
        hint="try another --input-tokens",
    )


def write_input_data(
    path: Path,
    prompts: PromptSet,
    output_tokens: int,
    model: str = c.ENSEMBLE,
    lora_tasks: tuple[int, ...] = (),
) -> Path:
    """perf_analyzer `--input-data` JSON: one entry per prompt, output length forced to `output_tokens`.

    The ensemble and BLS take text; the engine (tensorrt_llm) takes the token ids. min_tokens equal to
    max_tokens makes every request produce exactly `output_tokens` tokens (the end id is ignored).
    With `lora_tasks` (a --lora-mix: LoRA task ids, 0 the base model) each prompt is one entry per task,
    interleaved, so perf_analyzer's round robin over the entries spreads the requests evenly.
    """
    if output_tokens < 1:
        raise BenchError(
            f"--output-tokens={output_tokens} must be at least 1", hint="pass a positive number"
        )
    if model == c.ENGINE:
        data = [_engine_entry(ids, output_tokens) for ids in prompts.token_ids]
    else:
        data = [_text_entry(text, output_tokens) for text in prompts.prompts]
    if lora_tasks:
        data = [{**entry, "lora_task_id": [task]} for entry in data for task in lora_tasks]
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    tmp.write_text(json.dumps({"data": data}))
    os.replace(tmp, path)
    return path


def _text_entry(text: str, output_tokens: int) -> dict:
    return {
        "text_input": [text],
        "max_tokens": [output_tokens],
        "min_tokens": [output_tokens],
        "stream": [True],
        "exclude_input_in_output": [True],
    }


def _engine_entry(ids: tuple[int, ...], output_tokens: int) -> dict:
    return {
        "input_ids": {"content": list(ids), "shape": [len(ids)]},
        "input_lengths": [len(ids)],
        "request_output_len": [output_tokens],
        "min_tokens": [output_tokens],
        "streaming": [True],
        "exclude_input_in_output": [True],
    }
