"""Structured outputs: a request's response_format, or its tool_choice, as a guide for guided decoding.

- response_format json_object -> the backend's `json` guide; json_schema -> `json_schema` (always
  enforced: guided decoding cannot produce output outside the schema, so `strict` changes nothing);
  the regex and ebnf extensions -> `regex`, `ebnf_grammar`.
- tool_choice "required" -> a JSON list of one or more {"name", "parameters"} of the tools (one only
  with parallel_tool_calls false); a named function -> that function's parameters schema. Either way
  the arguments hold the properties the function declares and no others (`additionalProperties`
  false unless the schema says otherwise), as OpenAI's strict function calling has it.

Every guide is compiled here (llguidance, model_repo/common/guides.py) before any engine sees it, so one
that does not compile is a 400 naming the compiler's error on every target (the GPU's xgrammar would
fail the request inside the engine).
"""

from __future__ import annotations

import json

from toolkit.api.errors import ApiError
from toolkit.api.features import Guide
from toolkit.api.openai_types import (
    EbnfFormat,
    JsonObjectFormat,
    JsonSchemaResponseFormat,
    NamedToolChoice,
    RegexFormat,
    Tool,
)
from toolkit.repository import contract as c
from toolkit.repository.sources import common_module

ANY_OBJECT = {"type": "object"}


def response_format_guide(response_format) -> tuple[str, Guide] | None:
    """(the capabilities' guide kind, the guide) of a response_format; None for text."""
    if isinstance(response_format, JsonObjectFormat):
        return "json_object", Guide(c.GUIDE_TYPES["json_object"], None)
    if isinstance(response_format, JsonSchemaResponseFormat):
        schema = response_format.json_schema.schema_ or ANY_OBJECT
        return "json_schema", Guide(c.GUIDE_TYPES["json_schema"], json.dumps(schema))
    if isinstance(response_format, RegexFormat):
        return "regex", Guide(c.GUIDE_TYPES["regex"], response_format.regex)
    if isinstance(response_format, EbnfFormat):
        return "ebnf", Guide(c.GUIDE_TYPES["ebnf"], response_format.ebnf)
    return None


def tool_choice_guide(tools: list[Tool], tool_choice, parallel: bool | None) -> Guide | None:
    """The guide that enforces tool_choice "required" or a named function; None for auto and none."""
    if isinstance(tool_choice, NamedToolChoice):
        function = next(t.function for t in tools if t.function.name == tool_choice.function.name)
        return Guide(c.GUIDE_TYPES["json_schema"], json.dumps(_arguments(function.parameters)))
    if tool_choice != "required":
        return None
    calls = [
        {
            "type": "object",
            "properties": {
                "name": {"const": tool.function.name},
                "parameters": _arguments(tool.function.parameters),
            },
            "required": ["name", "parameters"],
            "additionalProperties": False,
        }
        for tool in tools
    ]
    schema: dict = {"type": "array", "items": {"anyOf": calls}, "minItems": 1}
    if parallel is False:
        schema["maxItems"] = 1
    return Guide(c.GUIDE_TYPES["json_schema"], json.dumps(schema))


def _arguments(parameters: dict | None) -> dict:
    """A function's parameters schema as its arguments' guide: the properties it declares, no others
    (unless it says which others it takes), as OpenAI's strict function calling has it. JSON Schema
    alone would allow any other key, and a small model invents them without end."""
    schema = dict(parameters or ANY_OBJECT)
    if schema.get("type") == "object" and "additionalProperties" not in schema:
        schema["additionalProperties"] = False
    return schema


def check_guide(guide: Guide, param: str) -> None:
    """A 400 naming the compiler's error when the guide does not compile."""
    guides = common_module("guides")
    try:
        guides.check_guide(guide.type, guide.text)
    except guides.GuideError as exc:
        raise ApiError(400, f"{exc}.", param=param, code="invalid_value") from None
