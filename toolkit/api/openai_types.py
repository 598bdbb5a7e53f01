"""Request bodies for structured outputs and tool calling, following the OpenAI API reference.

`response_format`: text, json_object, json_schema (OpenAI's), and, as trtllm-serve has them, regex and
ebnf (extensions). `tools` / `tool_choice` / `parallel_tool_calls`, and the messages of a tool
conversation: an assistant's `tool_calls`, a `tool` message answering one.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field


class _Request(BaseModel):
    model_config = ConfigDict(extra="forbid")


# --- response_format --------------------------------------------------------------------------------
class JsonSchemaFormat(_Request):
    name: Annotated[str, Field(min_length=1, max_length=64)]
    description: str | None = None
    schema_: dict[str, Any] | None = Field(None, alias="schema")
    strict: bool | None = None

    model_config = ConfigDict(extra="forbid", populate_by_name=True)


class TextFormat(_Request):
    type: Literal["text"]


class JsonObjectFormat(_Request):
    type: Literal["json_object"]


class JsonSchemaResponseFormat(_Request):
    type: Literal["json_schema"]
    json_schema: JsonSchemaFormat


class RegexFormat(_Request):
    """Extension (trtllm-serve's): the output matches this regular expression."""

    type: Literal["regex"]
    regex: Annotated[str, Field(min_length=1)]


class EbnfFormat(_Request):
    """Extension (trtllm-serve's): the output follows this EBNF grammar (xgrammar's notation: root ::= ...)."""

    type: Literal["ebnf"]
    ebnf: Annotated[str, Field(min_length=1)]


ResponseFormat = Annotated[
    TextFormat | JsonObjectFormat | JsonSchemaResponseFormat | RegexFormat | EbnfFormat,
    Field(discriminator="type"),
]
# The tags pydantic puts in an error's location after `response_format` (its member's `type`).
RESPONSE_FORMAT_TAGS = frozenset(
    get_args(member.model_fields["type"].annotation)[0]
    for member in get_args(get_args(ResponseFormat)[0])
)


# --- tools ----------------------------------------------------------------------------------------
class FunctionDefinition(_Request):
    name: Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.\-]+$")]
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class Tool(_Request):
    type: Literal["function"]
    function: FunctionDefinition


class NamedFunction(_Request):
    name: str


class NamedToolChoice(_Request):
    type: Literal["function"]
    function: NamedFunction


ToolChoice = Literal["none", "auto", "required"] | NamedToolChoice


class ToolCallFunction(_Request):
    name: str
    arguments: str  # JSON text, as OpenAI sends it


class ToolCall(_Request):
    id: str
    type: Literal["function"]
    function: ToolCallFunction
