"""Tokenizers made inside the tests with Hugging Face `tokenizers`, and the chat template they carry.

Two kinds: a byte-level BPE trained on a few sentences (every text encodes, ids are not words) and a
word-level one (one id per listed word, "[UNK]" for the rest: counts are easy to read off a prompt).
"""

from __future__ import annotations

import json
from collections.abc import Iterable

# A ChatML template over the BPE's special tokens: each turn is <|im_start|>ROLE\nTEXT<|im_end|>\n.
CHATML_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
CHATML_EOS = "<|im_end|>"
# ids 0, 1, 2 of the byte-level BPE, in this order
BPE_SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", CHATML_EOS]
UNK = "[UNK]"


def byte_level_bpe(corpus: Iterable[str], vocab_size: int = 400):
    """A byte-level BPE (GPT-2 style, no prefix space) trained on five passes over `corpus`."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=BPE_SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tokenizer.train_from_iterator(list(corpus) * 5, trainer)
    return tokenizer


def word_level(words: Iterable[str], pre_tokenizer=None):
    """A word-level tokenizer: UNK is id 0, then `words` in order (ids 1, 2, ...); it splits on
    whitespace and punctuation unless another pre-tokenizer is given."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {UNK: 0, **{word: i + 1 for i, word in enumerate(words)}}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token=UNK))
    tokenizer.pre_tokenizer = pre_tokenizer or pre_tokenizers.Whitespace()
    return tokenizer


def chatml_tokenizer_files(tokenizer) -> dict[str, str]:
    """A checkpoint's tokenizer files (name -> text): `tokenizer`, and a config carrying the ChatML
    template and <|im_end|> as eos_token."""
    config = {"chat_template": CHATML_TEMPLATE, "eos_token": CHATML_EOS}
    return {"tokenizer.json": tokenizer.to_str(), "tokenizer_config.json": json.dumps(config)}
