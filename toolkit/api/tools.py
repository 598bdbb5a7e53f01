"""Tool calling on the chat endpoint: the tools and the conversation rendered with the chat template, and how
the output becomes tool calls.

- tool_choice `auto` (the default with tools): the model decides; its output is read by the family's
  parser (toolkit.api.tool_parsers, on token ids), chosen from the model or by `--tool-parser`.
- `required` / a named function: guided decoding over the functions' parameters
  (toolkit.api.structured), so the output is the calls' JSON whatever the model.
- `none`: the tools are still shown to the model (as OpenAI does), and its output is content.
"""

from __future__ import annotations

import json

from toolkit.api.errors import ApiError
from toolkit.api.features import Guide
from toolkit.api.generation import ToolSetup
from toolkit.api.openai_types import NamedToolChoice
from toolkit.api.structured import tool_choice_guide
from toolkit.api.tool_parsers import (
    AUTO,
    CHOICES,
    MARKERS,
    NONE,
    PARSERS,
    ToolCallParser,
    detect_parser,
)


def resolve_tool_parser(setting: str, codec) -> tuple[str, int | None] | None:
    """(family, its marker's token id) of the parser to read tool calls with; None: no parser."""
    if setting not in CHOICES:
        raise ValueError(f"tool parser {setting!r} is not one of {', '.join(CHOICES)}")
    vocab = codec.text.tokenizer.get_vocab(with_added_tokens=True)
    template = codec.template.source if codec.template is not None else None
    family = detect_parser(vocab, template) if setting == AUTO else setting
    if family == NONE:
        return None
    return family, vocab.get(MARKERS[family])


def tool_setup(state, body) -> tuple[ToolSetup | None, Guide | None]:
    """How this request's output becomes tool calls, and the guide that enforces tool_choice (if any)."""
    tools = body.tools or []
    choice = body.tool_choice if body.tool_choice is not None else ("auto" if tools else "none")
    if not tools:
        if choice != "none":
            raise ApiError(
                400,
                f"tool_choice {_shown(choice)} needs tools: send the functions in `tools`.",
                param="tool_choice",
                code="invalid_value",
            )
        return None, None
    names = frozenset(tool.function.name for tool in tools)
    if choice == "none":
        return None, None
    if isinstance(choice, NamedToolChoice) and choice.function.name not in names:
        raise ApiError(
            400,
            f"tool_choice names the function `{choice.function.name}`, which is not one of the tools "
            f"({', '.join(sorted(names))}).",
            param="tool_choice",
            code="invalid_value",
        )
    if choice == "auto":
        return _parsed(state, names, body.parallel_tool_calls), None
    guide = tool_choice_guide(tools, choice, body.parallel_tool_calls)
    if isinstance(choice, NamedToolChoice):
        return ToolSetup("named", names, function=choice.function.name), guide
    return ToolSetup("required", names), guide


def _parsed(state, names: frozenset[str], parallel: bool | None) -> ToolSetup:
    if state.tool_parser is None:
        raise ApiError(
            400,
            "tool_choice auto needs a tool-call parser, and this model's tokenizer has none of the "
            f"families' markers ({', '.join(PARSERS)}): serve the API with --tool-parser FAMILY, or send "
            'tool_choice "required" or a named function (enforced with guided decoding).',
            param="tool_choice",
            code="unsupported_parameter",
        )
    if not state.backend.engine:
        raise ApiError(
            400,
            "tool_choice auto reads the model's tool-call tokens, and "
            f"`{state.settings.model_name}` returns text: serve the API on the tensorrt_llm model "
            '(--model-name tensorrt_llm), or send tool_choice "required" or a named function.',
            param="tool_choice",
            code="unsupported_parameter",
        )
    family, marker = state.tool_parser
    texts = state.token_texts

    def parser() -> ToolCallParser:
        return ToolCallParser(family, marker, texts.text, set(names), parallel is not False)

    return ToolSetup("parse", names, parser=parser)


def template_messages(messages) -> list[dict]:
    """The conversation as chat templates read it: tool calls with their arguments as objects (templates
    write them with tojson), tool results with the id of the call they answer."""
    out = []
    for message in messages:
        item: dict = {
            "role": "system" if message.role == "developer" else message.role,
            "content": message.text(),
        }
        if message.name is not None:
            item["name"] = message.name
        if message.tool_calls:
            item["tool_calls"] = [_template_call(call) for call in message.tool_calls]
        if message.tool_call_id is not None:
            item["tool_call_id"] = message.tool_call_id
        out.append(item)
    return out


def _template_call(call) -> dict:
    try:
        arguments = json.loads(call.function.arguments)
    except ValueError:
        arguments = call.function.arguments
    return {
        "id": call.id,
        "type": "function",
        "function": {"name": call.function.name, "arguments": arguments},
    }


def template_tools(tools) -> list[dict] | None:
    """The tools as chat templates read them (OpenAI's own shape, which Hugging Face templates take)."""
    if not tools:
        return None
    return [tool.model_dump(exclude_none=True, by_alias=True) for tool in tools]


def _shown(choice) -> str:
    return repr(choice) if isinstance(choice, str) else f"function {choice.function.name!r}"
