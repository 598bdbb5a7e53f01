"""Log probs in OpenAI's two shapes: chat's `logprobs.content` (token, logprob, bytes, top_logprobs) and the
completions' `logprobs` (tokens, token_logprobs, top_logprobs as {token: logprob}, text_offset).

A token's text is its exact bytes (special tokens: their name in the vocabulary), as UTF-8 with
replacement where a token ends inside a character; `bytes` gives the exact bytes, as OpenAI does.
"""

from __future__ import annotations

from toolkit.api.features import TokenLogprob


class TokenTexts:
    """Token id -> (text, bytes) with the repository's tokenizer."""

    def __init__(self, codec):
        self.codec = codec
        vocab = codec.text.tokenizer.get_vocab(with_added_tokens=True)
        self.names = {i: token for token, i in vocab.items()}

    def bytes(self, token: int) -> bytes:
        data = self.codec.decode_bytes([token])
        return data if data else self.names.get(token, "").encode()

    def text(self, token: int) -> str:
        return self.bytes(token).decode("utf-8", errors="replace")


def chat_logprobs(texts: TokenTexts, entries: list[TokenLogprob], top: int) -> dict:
    """`choice.logprobs` of a chat completion (or of one chunk)."""

    def item(token: int, logprob: float) -> dict:
        data = texts.bytes(token)
        return {
            "token": data.decode("utf-8", errors="replace"),
            "logprob": logprob,
            "bytes": list(data),
        }

    content = []
    for entry in entries:
        record = item(entry.token, entry.logprob)
        record["top_logprobs"] = [item(t, lp) for t, lp in entry.top[:top]]
        content.append(record)
    return {"content": content, "refusal": None}


def completion_logprobs(
    texts: TokenTexts, entries: list[TokenLogprob], top: int, offset: int = 0
) -> dict:
    """`choice.logprobs` of a text completion (or of one chunk); `offset`: where in the text its first
    token starts (characters)."""
    tokens, token_logprobs, tops, offsets = [], [], [], []
    for entry in entries:
        text = texts.text(entry.token)
        tokens.append(text)
        token_logprobs.append(entry.logprob)
        offsets.append(offset)
        offset += len(text)
        if top:
            tops.append({texts.text(t): lp for t, lp in entry.top[:top]})
    return {
        "tokens": tokens,
        "token_logprobs": token_logprobs,
        "top_logprobs": tops if top else None,
        "text_offset": offsets,
    }
