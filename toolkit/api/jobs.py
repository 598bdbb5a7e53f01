"""A request body -> a Job for the engine: what the repository honours, the prompt, its limits, the features
(structured output, tool calls, log probs, n) it asks for."""

from __future__ import annotations

import asyncio
import functools
import time
import uuid

from toolkit.api.errors import ApiError, short_text
from toolkit.api.features import Features, Guide
from toolkit.api.generation import Job, ToolSetup
from toolkit.api.schemas import (
    COMPLETION_DEFAULT_MAX_TOKENS,
    ChatCompletionRequest,
    lone_surrogate,
    requested_features,
    unsupported_fields,
)
from toolkit.api.state import ApiState
from toolkit.api.structured import check_guide, response_format_guide
from toolkit.api.tracing import RequestTrace
from toolkit.api.triton import Sampling
from toolkit.errors import ToolkitError

LONG_PROMPT_CHARS = 32768


def refuse_unsupported(state: ApiState, body) -> None:
    """Refuse what this server never honours, then what this repository does not (its capabilities)."""
    found = unsupported_fields(body)
    if found:
        name, reason = found[0]
        raise ApiError(400, reason, param=name, code="unsupported_parameter")
    capabilities = state.capabilities
    for param, feature in requested_features(body):
        if not capabilities.supports(feature):
            raise ApiError(
                400, capabilities.refusal(feature) + ".", param=param, code="unsupported_parameter"
            )
    _refuse_guide_kinds(state, body)
    if not state.backend.engine:
        _refuse_on_text_models(state, body)


def _refuse_guide_kinds(state: ApiState, body) -> None:
    """A structured output of a kind the repository's guided decoding does not take."""
    capabilities = state.capabilities
    found = response_format_guide(body.response_format)
    wanted = [("response_format", found[0])] if found else []
    tool_choice = getattr(body, "tool_choice", None)
    if getattr(body, "tools", None) and tool_choice not in (None, "auto", "none"):
        wanted.append(("tool_choice", "json_schema"))  # enforced with a guide over the parameters
    for param, kind in wanted:
        if kind not in capabilities.guided_decoding:
            detail = f"{param} {kind}" if param == "response_format" else f"{param} {tool_choice!r}"
            raise ApiError(
                400,
                capabilities.refusal("guided_decoding", detail) + ".",
                param=param,
                code="unsupported_parameter",
            )


# What the text models (ensemble, BLS) cannot give back: they return text, not token ids. Each: why, and
# whether a value asks for it (chat's logprobs is a bool, completions' an int where 0 asks too).
_TOKEN_FEATURES = {
    "logit_bias": ("logit_bias takes token ids", lambda v: bool(v)),
    "logprobs": ("log probs come per token", lambda v: v is not None and v is not False),
    "top_logprobs": ("log probs come per token", lambda v: bool(v)),
    "n": ("the choices of n come back by sequence index", lambda v: v is not None and v > 1),
}


def _refuse_on_text_models(state: ApiState, body) -> None:
    for param, (reason, asks) in _TOKEN_FEATURES.items():
        if not asks(getattr(body, param, None)):
            continue
        raise ApiError(
            400,
            f"{reason}, and `{state.settings.model_name}` returns text: serve the API on the tensorrt_llm "
            f"model (--model-name tensorrt_llm) for {param}.",
            param=param,
            code="unsupported_parameter",
        )


def _logit_bias(state: ApiState, body) -> tuple[tuple[int, float], ...]:
    """OpenAI's logit_bias ({"token id": bias}) as (id, bias) pairs, each id checked against the vocabulary."""
    pairs = []
    for key, bias in (body.logit_bias or {}).items():
        token = int(key) if key.strip().isdigit() else -1
        if not 0 <= token < state.vocab_size:
            raise ApiError(
                400,
                f"logit_bias key {key[:20]!r} is not a token id of this model (0 to {state.vocab_size - 1}).",
                param="logit_bias",
                code="invalid_value",
            )
        pairs.append((token, float(bias)))
    return tuple(pairs)


async def render_chat(
    state: ApiState,
    messages: list[dict],
    tools: list[dict] | None = None,
    add_generation_prompt: bool = True,
) -> str:
    """The chat prompt; rendering megabytes of messages (pure Python, jinja2) runs on a worker thread.
    A template's own refusal (or no template) is the client's 400."""
    render = functools.partial(
        state.codec.render_chat, messages, tools, add_generation_prompt=add_generation_prompt
    )
    try:
        if sum(len(m["content"] or "") for m in messages) > LONG_PROMPT_CHARS:
            return await asyncio.to_thread(render)
        return render()
    except ToolkitError as exc:  # no template at all: one sentence, not the CLI's "fix:" line
        fix = f"; {exc.hint}" if exc.hint else ""
        raise ApiError(
            400,
            f"This server cannot render chat messages: {exc.message}{fix}.",
            param="messages",
            code="chat_template_missing",
        ) from exc
    except Exception as exc:  # noqa: BLE001 - a template's own error (jinja2 or raise_exception) is the client's 400
        reason = " ".join(str(exc).split()) or type(exc).__name__
        raise ApiError(
            400,
            f"The chat template refused these messages: {short_text(reason, 400)}",
            param="messages",
            code="chat_template_refused",
        ) from exc


def request_features(
    state: ApiState, body, tool_guide: Guide | None = None
) -> tuple[Features, str | None]:
    """The engine features of a body, each guide compiled (a 400 naming the error when it does not); and
    the param a guide came from."""
    found = response_format_guide(body.response_format)
    if found is not None and tool_guide is not None:
        raise ApiError(
            400,
            "response_format and a tool_choice that forces a call both constrain the output: send one.",
            param="response_format",
            code="invalid_value",
        )
    guide, param = (found[1], "response_format") if found else (tool_guide, "tool_choice")
    if guide is not None:
        check_guide(guide, param)
    if isinstance(body, ChatCompletionRequest):
        logprobs, top = bool(body.logprobs), body.top_logprobs or 0
        if top and not logprobs:
            raise ApiError(
                400,
                "top_logprobs needs logprobs true.",
                param="top_logprobs",
                code="invalid_value",
            )
    else:
        logprobs, top = body.logprobs is not None, body.logprobs or 0
    capabilities = state.capabilities
    features = Features(
        guide=guide,
        logprobs=logprobs,
        top_logprobs=top,
        top_from_logits=capabilities.top_logprobs_source == "generation_logits",
        n=body.n or 1,
        cached_tokens=state.backend.engine and capabilities.cached_tokens,
        lora_task_id=state.lora_task(body.model),
    )
    return features, param if guide is not None else None


async def _encode(state: ApiState, prompt: str, param: str) -> list[int]:
    """The prompt's token ids; a prompt that cannot fit max_input_len is refused before it is tokenized,
    and a long one is tokenized off the event loop, without holding the GIL."""
    return await encode_checked(state, prompt, param, state.codec.encode, state.codec.encode_long)


async def encode_checked(
    state: ApiState, prompt: str, param: str, encode, encode_long
) -> list[int]:
    """`encode(prompt)` (or, a long prompt, `encode_long` on a worker thread) once the prompt is valid
    Unicode and short enough for max_input_len."""
    if lone_surrogate(prompt):  # a chat template may join what it was given into one
        raise ApiError(
            400,
            "The prompt is not valid Unicode (it holds a lone surrogate).",
            param=param,
            code="invalid_value",
        )
    max_input_len = state.limits.max_input_len
    most = state.codec.most_chars(max_input_len)
    if most is not None and len(prompt) > most:
        raise ApiError(
            400,
            f"The prompt is {len(prompt)} characters: more than any text of this model's maximum input "
            f"length of {max_input_len} tokens can hold ({most} characters with this tokenizer); shorten it.",
            param=param,
            code="context_length_exceeded",
        )
    if len(prompt) > LONG_PROMPT_CHARS:
        async with state.long_encodes:
            return await asyncio.to_thread(encode_long, prompt)
    return encode(prompt)


async def plan_job(
    state: ApiState,
    kind: str,
    body,
    prompt: str,
    requested: int | None,
    param: str,
    arrival: float,
    trace: RequestTrace | None = None,
    *,
    features: Features | None = None,
    tools: ToolSetup | None = None,
    first_index: int = 0,
) -> Job:
    """Check the prompt and max_tokens against the engine's limits; a request over them is a 400 naming the limit."""
    limits = state.limits
    started = time.time_ns() if trace is not None else 0
    prompt_ids = await _encode(state, prompt, param)
    if trace is not None:
        trace.tokenized(started, time.time_ns())
    prompt_tokens = len(prompt_ids)
    if prompt_tokens == 0:
        raise ApiError(
            400,
            "The prompt is empty: it must hold at least one token.",
            param=param,
            code="invalid_value",
        )
    if prompt_tokens > limits.max_input_len:
        raise ApiError(
            400,
            f"The prompt is {prompt_tokens} tokens, over this model's maximum input length of "
            f"{limits.max_input_len} tokens; shorten it.",
            param=param,
            code="context_length_exceeded",
        )
    limit = limits.output_limit(prompt_tokens)
    if limit < 1:
        raise ApiError(
            400,
            f"The prompt is {prompt_tokens} tokens and leaves no room to generate within this model's maximum "
            f"sequence length of {limits.max_seq_len} tokens.",
            param=param,
            code="context_length_exceeded",
        )
    if kind == "completion" and (requested is None or "max_tokens" not in body.model_fields_set):
        # OpenAI's default (16), also for an explicit null
        max_tokens = min(requested or COMPLETION_DEFAULT_MAX_TOKENS, limit)
    else:
        max_tokens = requested if requested is not None else limit
    if max_tokens > limit:
        name = (
            "max_completion_tokens"
            if getattr(body, "max_completion_tokens", None) is not None
            else "max_tokens"
        )
        raise ApiError(
            400,
            f"{name}={max_tokens} is over this model's limit of {limit} tokens for a {prompt_tokens}-token prompt "
            f"(max_output_len {limits.max_output_len}, max_seq_len {limits.max_seq_len}).",
            param=name,
            code="context_length_exceeded",
        )
    if body.min_tokens is not None and body.min_tokens > max_tokens:
        raise ApiError(
            400,
            f"min_tokens={body.min_tokens} is over max_tokens={max_tokens}: ask for at most as many tokens as may "
            "be generated.",
            param="min_tokens",
            code="invalid_value",
        )
    if body.stream_options is not None and not body.stream:
        raise ApiError(
            400,
            "stream_options is only allowed when stream is true.",
            param="stream_options",
            code="invalid_value",
        )
    sampling = Sampling(
        temperature=body.temperature,
        top_p=body.top_p,
        seed=body.seed,
        min_tokens=body.min_tokens,
        presence_penalty=body.presence_penalty,
        frequency_penalty=body.frequency_penalty,
        repetition_penalty=body.repetition_penalty,
        logit_bias=_logit_bias(state, body),
    )
    include_usage = bool(body.stream and body.stream_options and body.stream_options.include_usage)
    prefix = "chatcmpl" if kind == "chat" else "cmpl"
    return Job(
        f"{prefix}-{uuid.uuid4().hex}",
        kind,
        body.model,
        prompt,
        prompt_ids,
        prompt_tokens,
        max_tokens,
        sampling,
        tuple(body.stop_list()),
        include_usage,
        arrival=arrival,
        trace=trace,
        features=features,
        tools=tools,
        echo=prompt if getattr(body, "echo", False) else "",
        first_index=first_index,
        block_size=state.kv_block_size,
    )
