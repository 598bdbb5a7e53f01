"""`/tokenize` and `/detokenize`, as vLLM's server has them, with the repository's own tokenizer and chat
template (the ids are the ones the engine gets for the same text).

    POST /tokenize   {"model", "prompt"} or {"model", "messages", "add_generation_prompt"}
                     -> {"count", "max_model_len", "tokens"}
    POST /detokenize {"model", "tokens"} -> {"prompt"}
"""

from __future__ import annotations

import functools
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field

from toolkit.api.errors import ApiError
from toolkit.api.jobs import encode_checked, render_chat
from toolkit.api.schemas import ChatMessage
from toolkit.api.state import ApiState
from toolkit.api.tools import template_messages

MAX_TOKENS_SENT = 1_000_000


class _Request(BaseModel):
    model_config = ConfigDict(extra="forbid")


class TokenizeRequest(_Request):
    model: str
    prompt: str | None = None
    messages: Annotated[list[ChatMessage], Field(min_length=1)] | None = None
    add_generation_prompt: bool = True
    add_special_tokens: bool | None = None  # default: as a completions prompt gets them (not chat)


class TokenizeResponse(BaseModel):
    count: int
    max_model_len: int
    tokens: list[int]


class DetokenizeRequest(_Request):
    model: str
    tokens: Annotated[list[Annotated[int, Field(ge=0)]], Field(max_length=MAX_TOKENS_SENT)]


class DetokenizeResponse(BaseModel):
    prompt: str


async def tokenize(state: ApiState, body: TokenizeRequest) -> TokenizeResponse:
    state.check_model(body.model)
    if (body.prompt is None) == (body.messages is None):
        raise ApiError(
            400, "Send either `prompt` or `messages`.", param="prompt", code="invalid_value"
        )
    codec = state.codec
    if body.messages is not None:  # rendered as the chat route renders them, content marked as text
        text = await render_chat(
            state,
            template_messages(body.messages),
            add_generation_prompt=body.add_generation_prompt,
        )
        special = bool(body.add_special_tokens)  # the template writes them itself
        param = "messages"
    else:
        text, param = body.prompt or "", "prompt"
        special = body.add_special_tokens is not False
    if special:
        tokens = await encode_checked(state, text, param, codec.encode, codec.encode_long)
    else:
        plain = functools.partial(
            codec.text.encode_prompt, add_special_tokens=False, bos_id=codec.tokens.bos_id
        )
        tokens = await encode_checked(state, text, param, plain, plain)
    return TokenizeResponse(
        count=len(tokens), max_model_len=state.limits.max_seq_len, tokens=tokens
    )


async def detokenize(state: ApiState, body: DetokenizeRequest) -> DetokenizeResponse:
    state.check_model(body.model)
    bad = next((t for t in body.tokens if t >= state.vocab_size), None)
    if bad is not None:
        raise ApiError(
            400,
            f"token {bad} is not an id of this model (0 to {state.vocab_size - 1}).",
            param="tokens",
            code="invalid_value",
        )
    return DetokenizeResponse(prompt=state.codec.text.decode(body.tokens))
