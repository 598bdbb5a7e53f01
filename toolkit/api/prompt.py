"""Prompt side of the API: the repository's own tokenizer, chat template and length limits.

The API encodes prompts with the repository's TextCodec (the same code, tokenizer.json and BOS rule
as its preprocessing model), so a prompt that is too long is refused here, with the limit named,
before it reaches Triton, and `usage.prompt_tokens` is exact.

Long prompts cost: tokenizing 10 MB of text takes seconds and ~1.5 GB (the tokenizers library's
per-token offsets and strings), so a prompt longer than `max_input_len` tokens can possibly be, in
characters, is refused before it is tokenized (`most_chars`), and one that may fit is tokenized on a
worker thread by `encode_long`, which lets the event loop run meanwhile (perf/results/api_large_prompt.md).
"""

from __future__ import annotations

import copy
import ctypes
import ctypes.util
import json
import sys

from toolkit.errors import RepositoryError
from toolkit.model.chat_template import ChatTemplate
from toolkit.repository.reader import Repository
from toolkit.repository.sources import common_module

TRIM_AFTER_CHARS = 256_000  # after tokenizing a prompt this long, return the freed heap to the OS
# A normalizer may shorten text before it is split (NFC joins a letter and its accent, NFKC more): the
# character bound of a tokenizer that normalizes is this many times looser.
NORMALIZER_SLACK = 4


class PromptCodec:
    """Render chat messages with the checkpoint's chat template; text <-> token ids as the repository does."""

    def __init__(self, repository: Repository, *, content_as_text: bool = True):
        tokenizer_dir = repository.tokenizer_json.parent
        self.tokens = repository.tokens
        textcodec = common_module("textcodec")
        self.text = textcodec.TextCodec(tokenizer_dir)
        # Message content marked as text (textcodec.plain_text): its special-token text stays text.
        self.mark_content = textcodec.plain_text if content_as_text else None
        self.template = ChatTemplate.from_tokenizer_dir(tokenizer_dir)
        self.max_token_chars = longest_token_chars(self.text.tokenizer)
        # The same codec, encoding through encode_batch, which releases the GIL while it runs (encode
        # holds it throughout: measured, a 2M-character prompt stopped every other thread for 1.8 s).
        self._gil_free = copy.copy(self.text)
        self._gil_free.tokenizer = _BatchEncoder(self.text.tokenizer)

    def encode(self, text: str) -> list[int]:
        return self.text.encode_prompt(text, self.tokens.add_special_tokens, self.tokens.bos_id)

    def encode_long(self, text: str) -> list[int]:
        """`encode`, for a worker thread: other threads (the event loop) run while it tokenizes."""
        ids = self._gil_free.encode_prompt(text, self.tokens.add_special_tokens, self.tokens.bos_id)
        if len(text) > TRIM_AFTER_CHARS:
            release_free_memory()
        return ids

    def most_chars(self, tokens: int) -> int | None:
        """The most characters a text of `tokens` tokens can have; None when this tokenizer has no such
        bound (an unknown-word token stands for a word of any length)."""
        return None if self.max_token_chars is None else tokens * self.max_token_chars

    def count(self, text: str) -> int:
        return len(self.encode(text))

    def count_generated(self, data: bytes) -> int:
        """Tokens of generated text (no special tokens added): the usage count of the text models' answers."""
        return len(self.text.encode(data.decode("utf-8", errors="replace"), False))

    def decode_bytes(self, ids) -> bytes:
        if len(ids) == 1:  # a streamed step's one token (once per token): its bytes from the table
            table, token = self.text.token_bytes, ids[0]
            return table[token] if 0 <= token < len(table) else b""
        return self.text.decode_bytes(ids)

    def render_chat(
        self,
        messages: list[dict],
        tools: list[dict] | None = None,
        *,
        add_generation_prompt: bool = True,
    ) -> str:
        """The prompt text for `messages` (and `tools`), ending with the assistant's generation prompt;
        each message's content marked as text (unless special tokens in messages are trusted)."""
        if self.template is None:
            raise RepositoryError(
                "this model's tokenizer has no chat template", hint="use /v1/completions"
            )
        if self.mark_content is not None:
            messages = [
                {**m, "content": self.mark_content(m["content"])} if m.get("content") else m
                for m in messages
            ]
        return self.template.render(
            messages, tools=tools, add_generation_prompt=add_generation_prompt
        )


def _malloc_trim():
    if not sys.platform.startswith("linux"):
        return None
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    return getattr(libc, "malloc_trim", None)  # glibc's; musl has none


_MALLOC_TRIM = _malloc_trim()


def release_free_memory() -> None:
    """Hand the heap freed by a large tokenization back to the OS. glibc keeps it otherwise: the API's RSS
    stayed at ~1 GB after one 10 MB prompt (measured: 249 -> 38 MB after a 3M-character one, in ~10 ms)."""
    if _MALLOC_TRIM is not None:
        _MALLOC_TRIM(0)  # ctypes releases the GIL for the call


class _BatchEncoder:
    """A Tokenizer whose `encode` goes through `encode_batch` (the one that releases the GIL)."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer

    def encode(self, text: str, add_special_tokens: bool = True):
        return self.tokenizer.encode_batch([text], add_special_tokens=add_special_tokens)[0]


def longest_token_chars(tokenizer) -> int | None:
    """How many characters of text one token can cover at most, from the vocabulary (in characters of
    its own alphabet: one per byte for byte-level BPE, so never fewer than the text's); None when
    an unknown-word token can stand for text of any length (WordLevel, WordPiece, Unigram, fused
    unknowns; byte fallback spells unknown text in byte tokens instead)."""
    model = json.loads(tokenizer.to_str())
    spec = model.get("model") or {}
    unknown = spec.get("unk_token") is not None or spec.get("unk_id") is not None
    fused = spec.get("type") in ("WordLevel", "WordPiece", "Unigram") or spec.get("fuse_unk")
    if unknown and fused and not spec.get("byte_fallback"):
        return None
    longest = max((len(token) for token in tokenizer.get_vocab(with_added_tokens=True)), default=1)
    return longest * (NORMALIZER_SLACK if model.get("normalizer") else 1)
