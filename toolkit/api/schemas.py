"""Request and response bodies, following the OpenAI API reference (chat completions, completions, models).

Requests forbid unknown fields: OpenAI answers an unrecognized argument with a 400, and so do we.
They are strict about JSON types too, as OpenAI is: `"max_tokens": true` or `"16"`, `"stream": "true"`,
`"temperature": "1"` are 400s, never converted (an integer is still a number: `"temperature": 1`).
Fields whose support depends on the repository (n, logprobs, penalties, logit_bias, structured
outputs, ...) are typed here and checked against its capabilities (`requested_features`); fields of
the reference this server cannot honour at all are declared so that `unsupported_fields` refuses them
by name instead of dropping them silently. The structured-output and tool types are
toolkit.api.openai_types'.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, Strict, field_validator
from pydantic_core import PydanticCustomError

from toolkit.api.openai_types import ResponseFormat, TextFormat, Tool, ToolCall, ToolChoice

UINT64_MAX = 2**64 - 1
INT64_MIN = -(2**63)
COMPLETION_DEFAULT_MAX_TOKENS = 16  # OpenAI's default for /v1/completions
MAX_N = 128  # OpenAI's bound on n
MAX_TOP_LOGPROBS = 20  # OpenAI's bound on top_logprobs (and vLLM's on completions' logprobs)
MAX_PROMPTS = 64  # prompts in one completions request (each is its own engine request)
StrictInt = Annotated[int, Strict()]
Penalty = Annotated[float, Field(ge=-2, le=2)]
Bias = Annotated[float, Field(ge=-100, le=100)]
StopText = Annotated[str, Field(min_length=1)]
Stop = StopText | Annotated[list[StopText], Field(max_length=4)] | None


# JSON may escape a lone UTF-16 surrogate ("\ud800"): valid JSON, not valid Unicode. Python's json keeps it in the
# str, where it fails later on every encode to UTF-8 (the tokenizer, Triton's BYTES tensors, our own error body).
# json.loads joins every valid pair into one character, so any surrogate left in a str is a lone one.
LONE_SURROGATE = re.compile("[\ud800-\udfff]")


def lone_surrogate(text: str) -> re.Match | None:
    """The first lone surrogate in `text`; isascii() is O(1) (a flag of the str), the scan ~5 ns a character."""
    return None if text.isascii() else LONE_SURROGATE.search(text)


def valid_unicode(value):
    """`value` (a str, or a list of them) unchanged; a `lone_surrogate` error naming where one is."""
    items = value if isinstance(value, list) else [value]
    for index, item in enumerate(items):
        found = lone_surrogate(item) if isinstance(item, str) else None
        if found:
            raise PydanticCustomError(
                "lone_surrogate",
                "the string holds a lone UTF-16 surrogate ({char} at character {at}), which is not "
                "valid Unicode: send text as UTF-8, or escape only valid surrogate pairs",
                {
                    "char": f"\\u{ord(found.group()):04x}",
                    "at": found.start(),
                    "index": index if isinstance(value, list) else None,
                },
            )
    return value


class _Request(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class StreamOptions(_Request):
    include_usage: bool | None = None


class TextPart(_Request):
    type: Literal["text"]
    text: str

    _unicode = field_validator("text")(valid_unicode)


class OtherPart(BaseModel):
    """A content part of another type than text (image_url, input_audio, file, ...): accepted by the schema
    only so that `unsupported_content` can refuse it by name."""

    model_config = ConfigDict(extra="allow")
    type: str

    @field_validator("type")
    @classmethod
    def _not_text(cls, value: str) -> str:
        # a malformed text part: TextPart's own error says what is wrong with it
        if value == "text":
            raise ValueError("a text part is a TextPart")
        return value


UNION_MEMBERS = (TextPart, OtherPart)  # errors leave their names out of a field's path

# What a content part of a type other than text holds, as clients are told when it is refused.
PART_KINDS = {"image_url": "image", "input_audio": "audio", "file": "file"}


class ChatMessage(_Request):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart | OtherPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = None  # an assistant's calls
    tool_call_id: str | None = None  # a tool message: the call it answers

    _unicode = field_validator("content", "name")(valid_unicode)

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text for part in self.content if isinstance(part, TextPart))


class _Sampling(_Request):
    """Fields shared by chat and text completions."""

    model: str
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, ge=0, le=1)
    # OpenAI's is a signed 64-bit integer; the engine's a UINT64 (a negative seed is sent as its two's
    # complement, Sampling.tensors). Up to UINT64_MAX too, as the engine contract takes it.
    seed: int | None = Field(None, ge=INT64_MIN, le=UINT64_MAX)
    stop: Stop = None
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    user: str | None = None
    # Extension (vLLM and TensorRT-LLM spell it so): generate at least this many tokens before the end token may stop
    # the generation; min_tokens = max_tokens gives a fixed output length (benchmarks). At most max_tokens.
    min_tokens: int | None = Field(None, ge=0)
    n: Annotated[StrictInt, Field(ge=1, le=MAX_N)] | None = None
    presence_penalty: Penalty | None = None
    frequency_penalty: Penalty | None = None
    # Token id (as a string, as in JSON object keys) -> a bias added to its logit before sampling.
    logit_bias: dict[str, Bias] | None = None
    # Extension (TensorRT-LLM's, vLLM's): > 1 discourages tokens already in the prompt or the output.
    repetition_penalty: float | None = Field(None, gt=0, le=10)
    # json_object, json_schema; regex and ebnf as extensions (trtllm-serve's), on completions too.
    response_format: ResponseFormat | None = None

    _unicode = field_validator("model", "stop", "user")(valid_unicode)

    def stop_list(self) -> list[str]:
        if self.stop is None:
            return []
        return [self.stop] if isinstance(self.stop, str) else list(self.stop)


class ChatCompletionRequest(_Sampling):
    messages: Annotated[list[ChatMessage], Field(min_length=1)]
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    logprobs: Annotated[bool, Strict()] | None = None
    top_logprobs: Annotated[StrictInt, Field(ge=0, le=MAX_TOP_LOGPROBS)] | None = None
    tools: Annotated[list[Tool], Field(max_length=128)] | None = None
    tool_choice: ToolChoice | None = None
    parallel_tool_calls: bool | None = None
    functions: Any = None
    function_call: Any = None
    audio: Any = None
    modalities: Any = None
    prediction: Any = None
    reasoning_effort: Any = None
    store: Any = None
    metadata: Any = None
    service_tier: Any = None
    web_search_options: Any = None

    def requested_max_tokens(self) -> int | None:
        return (
            self.max_completion_tokens
            if self.max_completion_tokens is not None
            else self.max_tokens
        )


class CompletionRequest(_Sampling):
    prompt: str | Annotated[list[str], Field(min_length=1, max_length=MAX_PROMPTS)]
    max_tokens: int | None = Field(COMPLETION_DEFAULT_MAX_TOKENS, ge=1)
    # How many alternatives per token to return with their log probs (0: the sampled token's only).
    logprobs: Annotated[StrictInt, Field(ge=0, le=MAX_TOP_LOGPROBS)] | None = None
    echo: bool | None = None  # the prompt before the completion
    best_of: Any = None
    suffix: Any = None

    _prompt_unicode = field_validator("prompt")(valid_unicode)

    def prompt_text(self) -> str:
        return self.prompt if isinstance(self.prompt, str) else self.prompt[0]

    def prompts(self) -> list[str]:
        return [self.prompt] if isinstance(self.prompt, str) else list(self.prompt)


def _other_than(*allowed):
    """A check that refuses any value but None and `allowed`, compared with their types
    (0 is not False, True is not 1)."""
    return lambda v: v is not None and not any(type(v) is type(a) and v == a for a in allowed)


def unsupported_fields(request: _Sampling) -> list[tuple[str, str]]:
    """(field, reason) for every field set to a value this server cannot honour on any repository."""
    checks = {
        "functions": _other_than([]),
        "function_call": _other_than("none"),
        "audio": _other_than(),
        "modalities": _other_than(["text"]),
        "prediction": _other_than(),
        "reasoning_effort": _other_than(),
        "store": _other_than(False),
        "metadata": _other_than(),
        "service_tier": _other_than("auto", "default"),
        "web_search_options": _other_than(),
        "best_of": _other_than(1),
        "suffix": _other_than(""),
    }
    found = []
    for name, refused in checks.items():
        if name in type(request).model_fields and refused(getattr(request, name)):
            found.append(
                (
                    name,
                    f"`{name}` = {_short(getattr(request, name))} is not supported by this server",
                )
            )
    return found


def requested_features(request: _Sampling) -> list[tuple[str, str]]:
    """(field, capability feature) for what the request asks of the repository (toolkit.capabilities)."""
    found = []
    if request.n is not None and request.n > 1:
        found.append(("n", "n"))
    for name in ("presence_penalty", "frequency_penalty"):
        if getattr(request, name):
            found.append((name, "penalties"))
    if request.repetition_penalty is not None and request.repetition_penalty != 1.0:
        found.append(("repetition_penalty", "penalties"))
    if request.logit_bias:
        found.append(("logit_bias", "logit_bias"))
    if isinstance(request, ChatCompletionRequest):
        if request.logprobs:
            found.append(("logprobs", "logprobs"))
        if request.top_logprobs:
            found.append(("top_logprobs", "top_logprobs"))
    elif isinstance(request, CompletionRequest) and request.logprobs is not None:
        found.append(("logprobs", "logprobs"))
        if request.logprobs > 0:
            found.append(("logprobs", "top_logprobs"))
        if request.echo:
            found.append(("echo", "prompt_logprobs"))
    return found


def wants_text(response_format) -> bool:
    return response_format is None or isinstance(response_format, TextFormat)


def _short(value, limit: int = 80) -> str:
    """A value as an error names it: its repr, cut to `limit` characters (never the whole of a huge one)."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def unsupported_content(request: ChatCompletionRequest) -> tuple[str, str] | None:
    """(param, reason) for the first content part that is not text: this server takes text only."""
    for m, message in enumerate(request.messages):
        for p, part in enumerate(message.content if isinstance(message.content, list) else ()):
            if isinstance(part, OtherPart):
                kind = PART_KINDS.get(part.type)
                what = f"{kind.capitalize()} content" if kind else "Content"
                return (
                    f"messages.{m}.content.{p}",
                    f"{what} is not supported by this server (a content part of type `{part.type}`): "
                    "it takes text only; send `text` parts or a string.",
                )
    return None


# --- responses -----------------------------------------------------------------------------------
class PromptTokensDetails(BaseModel):
    cached_tokens: int  # prompt tokens whose KV blocks the engine reused from its prefix cache


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails | None = None


class AssistantMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str | None
    refusal: None = None
    tool_calls: list[ToolCall] | None = None


class ChatChoice(BaseModel):
    index: int = 0
    message: AssistantMessage
    logprobs: dict[str, Any] | None = None
    finish_reason: Literal["stop", "length", "tool_calls"]


class _CompletionResponse(BaseModel):
    """What a chat and a text completion response share, in OpenAI's order; each names its object and
    choices (a subclass's field keeps its place here)."""

    id: str
    object: str
    created: int
    model: str
    choices: list[Any]
    usage: Usage
    system_fingerprint: str | None = None


class ChatCompletion(_CompletionResponse):
    object: Literal["chat.completion"] = "chat.completion"
    choices: list[ChatChoice]


class CompletionChoice(BaseModel):
    index: int = 0
    text: str
    logprobs: dict[str, Any] | None = None
    finish_reason: Literal["stop", "length"]


class Completion(_CompletionResponse):
    object: Literal["text_completion"] = "text_completion"
    choices: list[CompletionChoice]


class Model(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str
    # As vLLM lists them: the model it is served from (the base model's id for itself and for each of its
    # LoRA adapters), and for an adapter the base model it adapts (None for the base model).
    root: str | None = None
    parent: str | None = None


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[Model]


class ErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorResponse(BaseModel):
    error: ErrorDetail


class Health(BaseModel):
    status: Literal["ok"]
    model: str
