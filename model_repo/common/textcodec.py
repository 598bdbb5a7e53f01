"""Token ids <-> text for the repository's Python models, using only `tokenizers`.

Detokenization maps every token id to its exact bytes once, at load time. A streamed piece is
then the bytes of its tokens, so the pieces of a stream always concatenate to the bytes of the
full decode: spaces are never dropped (NVIDIA's stock postprocessing decodes each piece on its
own and loses them), and a multi-byte character split across pieces is rejoined by the client's
incremental UTF-8 decoder instead of becoming U+FFFD.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
from tokenizers import Encoding, Tokenizer

_BYTE_TOKEN = re.compile(r"^<0x([0-9A-Fa-f]{2})>$")

# Plain-text marks: text between them is encoded as text even where it spells a special token
# (`<|im_start|>` becomes "<", "|", "im", ...), as OpenAI encodes message content. The OpenAI API wraps
# each message's content in them before the chat template renders it, so a user cannot write a turn of
# another role; the template's own special tokens stay outside. Unicode noncharacters (reserved for a
# program's internal use, never text): never encoded themselves, and dropped from the wrapped text.
TEXT_OPEN, TEXT_CLOSE = "\ufdd0", "\ufdd1"
_MARKS = re.compile(f"([{TEXT_OPEN}{TEXT_CLOSE}])")


def plain_text(text: str) -> str:
    """`text` marked to be encoded as text, whatever special tokens it spells."""
    return TEXT_OPEN + text.replace(TEXT_OPEN, "").replace(TEXT_CLOSE, "") + TEXT_CLOSE


def _byte_level_alphabet() -> dict[str, int]:
    """The GPT-2 byte-level alphabet, inverted: printable stand-in character -> byte value."""
    printable = (
        list(range(ord("!"), ord("~") + 1))
        + list(range(ord("¡"), ord("¬") + 1))
        + list(range(ord("®"), ord("ÿ") + 1))
    )
    chars = {b: b for b in printable}
    extra = 0
    for b in range(256):
        if b not in chars:
            chars[b] = 256 + extra
            extra += 1
    return {chr(c): b for b, c in chars.items()}


def codec_beside(model_file: str, params, skip_special_tokens: bool = True) -> TextCodec:
    """The TextCodec of the tokenizer folder a model's `tokenizer_dir` parameter names, relative to the
    model's version folder (where model_file, the model's __file__, lies)."""
    return TextCodec(Path(model_file).parent / params.text("tokenizer_dir"), skip_special_tokens)


class TextCodec:
    """Encode text to ids and map ids to bytes, as the checkpoint's tokenizer.json defines them."""

    def __init__(self, tokenizer_dir: Path | str, skip_special_tokens: bool = True):
        path = Path(tokenizer_dir) / "tokenizer.json"
        self.tokenizer = Tokenizer.from_file(str(path))
        spec = json.loads(path.read_text(encoding="utf-8"))
        self.special_ids = (
            {t["id"] for t in spec.get("added_tokens", []) if t.get("special")}
            if skip_special_tokens
            else set()
        )
        self.vocab_size = self.tokenizer.get_vocab_size(with_added_tokens=True)
        self.token_bytes = self._build_table(spec.get("decoder") or {})
        self.special = self.tokenizer
        self._plain: Tokenizer | None = None

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=add_special_tokens).ids

    def encode_prompt(self, text: str, add_special_tokens: bool, bos_id: int | None) -> list[int]:
        """A prompt's ids: raw text gets the tokenizer's special tokens (its BOS, as NVIDIA's stock
        preprocessing adds them), unless the text already starts with the BOS (a chat template that
        writes it itself), so a prompt never carries two. Marked spans (`plain_text`) are text."""
        if TEXT_OPEN in text or TEXT_CLOSE in text:
            ids = self._encode_marked(text, add_special_tokens)
        else:
            ids = self.tokenizer.encode(text, add_special_tokens=add_special_tokens).ids
        if (
            add_special_tokens
            and bos_id is not None
            and len(ids) >= 2
            and ids[0] == ids[1] == bos_id
        ):
            return ids[1:]
        return ids

    @property
    def plain(self) -> Tokenizer:
        """The same tokenizer with special-token text split like any other (for marked text); made on
        first use: a copy of a large vocabulary costs memory every model that never needs it would pay."""
        if self._plain is None:
            plain = Tokenizer.from_str(self.special.to_str())
            plain.encode_special_tokens = True
            self._plain = plain
        return self._plain

    def _encode_marked(self, text: str, add_special_tokens: bool) -> list[int]:
        """Each span encoded by its kind (special-token text read as such outside the marks, as text
        inside), joined, and the tokenizer's special tokens (BOS) added once to the whole. encode_batch
        releases the GIL, as the API's long prompts need."""
        template, plain, order, inside = [], [], [], False
        for piece in _MARKS.split(text):
            if piece in (TEXT_OPEN, TEXT_CLOSE):
                inside = piece == TEXT_OPEN
            elif piece:
                (plain if inside else template).append(piece)
                order.append(inside)
        encoded = {
            False: iter(self.special.encode_batch(template, add_special_tokens=False)),
            True: iter(self.plain.encode_batch(plain, add_special_tokens=False)),
        }
        spans = [next(encoded[kind]) for kind in order]
        whole = (
            Encoding.merge(spans) if spans else self.special.encode("", add_special_tokens=False)
        )
        return self.special.post_process(whole, add_special_tokens=add_special_tokens).ids

    def decode_bytes(self, ids) -> bytes:
        table = self.token_bytes
        size = len(table)
        return b"".join(table[i] if 0 <= i < size else b"" for i in ids)

    def decode(self, ids) -> str:
        return self.decode_bytes(ids).decode("utf-8", errors="replace")

    def _build_table(self, decoder: dict) -> list[bytes]:
        kinds = _decoder_kinds(decoder)
        vocab = self.tokenizer.get_vocab(with_added_tokens=True)
        table = [b""] * (max(vocab.values()) + 1 if vocab else 0)
        alphabet = _byte_level_alphabet() if "ByteLevel" in kinds else None
        for token, idx in vocab.items():
            if idx in self.special_ids:
                continue  # skip_special_tokens, as the stock postprocessing does by default
            table[idx] = self._token_to_bytes(token, idx, alphabet, kinds)
        return table

    def _token_to_bytes(self, token: str, idx: int, alphabet, kinds: set[str]) -> bytes:
        if alphabet is not None and all(ch in alphabet for ch in token):
            return bytes(alphabet[ch] for ch in token)
        if "ByteFallback" in kinds and (m := _BYTE_TOKEN.match(token)):
            return bytes([int(m.group(1), 16)])
        if "Metaspace" in kinds or "Replace" in kinds:
            return token.replace("\u2581", " ").encode("utf-8")
        return self.tokenizer.decode([idx], skip_special_tokens=False).encode("utf-8")


def _decoder_kinds(decoder: dict) -> set[str]:
    if decoder.get("type") == "Sequence":
        return {d.get("type") for d in decoder.get("decoders", [])}
    return {decoder.get("type")}


def pack_word_lists(rows: list[list[list[int]]]) -> np.ndarray:
    """Word lists in TensorRT-LLM's [batch, 2, N] INT32 layout: row 0 the concatenated ids of a request's
    words, row 1 the offset where each word ends, both padded with -1. A request without words has
    ids [0, -1, ...] and offsets all -1, as NVIDIA's stock preprocessing writes it."""
    flat = [[i for word in words for i in word] for words in rows]
    width = max([1] + [len(ids) for ids in flat])
    out = np.full((len(rows), 2, width), -1, dtype=np.int32)
    for row, (words, ids) in enumerate(zip(rows, flat, strict=True)):
        if not ids:
            out[row, 0, 0] = 0
            continue
        out[row, 0, : len(ids)] = ids
        ends = np.cumsum([len(word) for word in words if word])
        out[row, 1, : len(ends)] = ends
    return out


def unpack_word_list(array: np.ndarray) -> list[list[int]]:
    """One request's [2, N] (or [1, 2, N]) word list back into its words' token ids."""
    data = np.asarray(array).reshape(2, -1)
    ids, words, start = data[0].tolist(), [], 0
    for end in (o for o in data[1].tolist() if o > 0):
        words.append(ids[start:end])
        start = end
    return [w for w in words if w]


class Refused(ValueError):
    """A request a model refuses (the client's error, not the model's). Its message starts with a mark,
    `[refused:CODE] `, that the OpenAI API answers as a 400 with that error code (toolkit.api.errors),
    whatever the words after it."""

    def __init__(self, message: str, code: str = "invalid_value"):
        super().__init__(f"[refused:{code}] {message}")


def check_request_lengths(
    prompt_len: int, max_tokens: int, max_input_len: int, max_output_len: int, max_seq_len: int
) -> None:
    """Refuse a request the engine cannot run, naming the limit and what to ask for instead."""
    if prompt_len == 0:
        raise Refused("text_input is empty: the prompt must hold at least one token")
    if prompt_len > max_input_len:
        raise Refused(
            f"prompt is {prompt_len} tokens, over this engine's max_input_len of {max_input_len}; "
            "shorten the prompt or rebuild with a larger --max-input-len",
            "context_length_exceeded",
        )
    if max_tokens <= 0:
        raise Refused(f"max_tokens={max_tokens} must be at least 1")
    limit = min(max_output_len, max_seq_len - prompt_len)
    if max_tokens > limit:
        raise Refused(
            f"max_tokens={max_tokens} is over this engine's limit of {limit} for a {prompt_len}-token prompt "
            f"(max_output_len {max_output_len}, max_seq_len {max_seq_len}); ask for at most {limit}",
            "context_length_exceeded",
        )
