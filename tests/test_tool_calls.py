"""Tool calls: each family's parser on token ids (no server), and synthetic repositories scripted to emit each
family's tool-call tokens, served by real tritonserver, read back through the OpenAI API streaming and not."""

from __future__ import annotations

import json

import httpx
import pytest

from toolkit.api import ApiSettings, run_api_in_background
from toolkit.api.tool_parsers import ToolCallParser
from toolkit.serve.net import free_port

from repos import config_only_checkpoint, launch_on_free_ports, write_test_repository
from tiny import make_tool_tokenizer

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "unit": {"enum": ["c", "f"]}},
            "required": ["city"],
        },
    },
}
ARGS = {"city": "Paris", "unit": "c"}
# What each family's model writes for one call (Hermes after some content), in its own markers.
SCRIPTS = {
    "hermes": 'Let me check. <tool_call>\n{"name": "get_weather", "arguments": '
    + json.dumps(ARGS)
    + "}\n</tool_call>",
    "mistral": '[TOOL_CALLS][{"name": "get_weather", "arguments": ' + json.dumps(ARGS) + "}]",
    "llama3_json": '<|python_tag|>{"name": "get_weather", "parameters": ' + json.dumps(ARGS) + "}",
}
CONTENT_BEFORE = {"hermes": "Let me check. ", "mistral": "", "llama3_json": ""}


# --- the parsers, on token ids ----------------------------------------------------------------------
def _parser(family, marker="<M>"):
    names = {1: marker}
    text = lambda i: names.get(i, chr(i))  # noqa: E731 - token i is character i, token 1 the marker
    return ToolCallParser(family, 1, text, {"get_weather"})


def _feed(parser, text: str, marker_at: int | None = None):
    """Feed `text` one character (token) at a time; the marker token at `marker_at`."""
    sent = []
    for i, ch in enumerate(text):
        if i == marker_at:
            sent.append(parser.feed([1], ""))  # a special token: no text for the client
        sent.append(parser.feed([ord(ch)], ch))
    return "".join(sent), parser.finish()


def test_hermes_calls_after_content_are_held_back_from_the_marker_on():
    text = 'Sure. {"name": "get_weather", "arguments": {"city": "Oslo"}}</tool_call>'
    sent, (held, calls) = _feed(_parser("hermes", "<tool_call>"), text, marker_at=6)
    assert sent == "Sure. " and held == ""
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [("get_weather", {"city": "Oslo"})]


def test_output_that_does_not_parse_as_a_call_comes_back_as_content():
    text = '{"name": "get_weather", "arguments": {"city": '  # cut off
    sent, (held, calls) = _feed(_parser("mistral", "[TOOL_CALLS]"), text, marker_at=0)
    assert sent == "" and calls == [] and held == text
    unknown = '[{"name": "launch_rockets", "arguments": {}}]'
    sent, (held, calls) = _feed(_parser("mistral", "[TOOL_CALLS]"), unknown, marker_at=0)
    assert calls == [] and held == unknown


def test_a_marker_the_vocabulary_splits_into_several_tokens_is_found_in_the_text():
    """A parser chosen for a model whose tokenizer has no single token for the marker (--tool-parser)."""
    parser = ToolCallParser("hermes", None, chr, {"get_weather"})
    text = 'Ok <tool_call>{"name": "get_weather", "arguments": {"city": "Oslo"}}</tool_call>'
    sent = "".join(parser.feed([ord(ch)], ch) for ch in text)
    held, calls = parser.finish()
    assert sent == "Ok " and held == "" and calls[0].name == "get_weather"
    parser = ToolCallParser("hermes", None, chr, {"get_weather"})
    sent = "".join(parser.feed([ord(ch)], ch) for ch in "a <tool")
    assert sent + parser.finish()[0] == "a <tool"  # a start that never became the marker is content


def test_llama3_json_calls_come_without_a_marker_too_and_several_split_by_semicolons():
    call = '{"name": "get_weather", "parameters": {"city": "%s"}}'
    text = call % "Rome" + "; " + call % "Oslo"
    sent, (held, calls) = _feed(_parser("llama3_json", "<|python_tag|>"), text)
    assert sent == "" and [json.loads(c.arguments)["city"] for c in calls] == ["Rome", "Oslo"]
    sent, (held, calls) = _feed(_parser("llama3_json", "<|python_tag|>"), "The answer is 4.")
    assert sent == "The answer is 4." and calls == [] and held == ""


# --- synthetic repositories scripted to call a tool ---------------------------------------------------
@pytest.fixture(scope="module", params=sorted(SCRIPTS))
def scripted(request, tmp_path_factory):
    family = request.param
    root = tmp_path_factory.mktemp(f"tools-{family}")
    files = make_tool_tokenizer(root / "tokenizer", family)
    vocab = len(json.loads(files["tokenizer.json"])["model"]["vocab"]) + 2
    checkpoint = config_only_checkpoint(
        root / "checkpoint", files, vocab, max_position_embeddings=4096
    )
    repo = write_test_repository(
        checkpoint,
        root / "repo",
        synthetic=True,
        synthetic_output=SCRIPTS[family],
        max_input_len=1024,
        max_seq_len=2048,
        max_output_len=512,
        kv_cache_tokens=4096,
    )
    server = launch_on_free_ports(repo, root / "server.log", 180)
    # as `toolkit serve` runs it: engine streams over Triton's HTTP generate_stream
    api = run_api_in_background(
        ApiSettings(server.grpc_url, repo, engine_http_url=server.http_url), port=free_port()
    )
    model = httpx.get(f"{api.url}/v1/models").json()["data"][0]["id"]
    yield family, api.url, model
    api.stop()
    server.stop()


def _ask(url, model, **fields) -> httpx.Response:
    body = {
        "model": model,
        "messages": [{"role": "user", "content": "Weather in Paris?"}],
        "tools": [WEATHER],
        "max_tokens": 200,
        **fields,
    }
    return httpx.post(f"{url}/v1/chat/completions", json=body, timeout=60)


def test_a_scripted_call_comes_back_as_tool_calls(scripted):
    family, url, model = scripted
    response = _ask(url, model)
    assert response.status_code == 200, response.text
    choice = response.json()["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    (call,) = choice["message"]["tool_calls"]
    assert call["type"] == "function" and call["id"].startswith("call_")
    assert call["function"]["name"] == "get_weather"
    assert json.loads(call["function"]["arguments"]) == ARGS
    assert (choice["message"]["content"] or "") == CONTENT_BEFORE[family]


def test_a_scripted_call_streams_as_tool_call_deltas_never_a_partial_marker(scripted):
    family, url, model = scripted
    response = _ask(url, model, stream=True)
    assert response.status_code == 200, response.text
    lines = [line for line in response.text.split("\n\n") if line.startswith("data: ")]
    assert lines[-1] == "data: [DONE]"
    chunks = [json.loads(line.removeprefix("data: ")) for line in lines[:-1]]
    content = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    assert content == CONTENT_BEFORE[family]
    calls = [
        call
        for c in chunks
        if c["choices"]
        for call in c["choices"][0]["delta"].get("tool_calls", [])
    ]
    assert [(c["index"], c["function"]["name"]) for c in calls] == [(0, "get_weather")]
    assert json.loads(calls[0]["function"]["arguments"]) == ARGS
    finish = [
        c["choices"][0]["finish_reason"]
        for c in chunks
        if c["choices"] and c["choices"][0]["finish_reason"]
    ]
    assert finish == ["tool_calls"]


def test_tool_choice_none_gives_the_output_as_content(scripted):
    family, url, model = scripted
    choice = _ask(url, model, tool_choice="none").json()["choices"][0]
    assert choice["finish_reason"] == "stop" and "tool_calls" not in choice["message"]
    assert "get_weather" in choice["message"]["content"]


def test_tools_are_rendered_with_the_template_s_tool_use_variant(tmp_path):
    from toolkit.model.chat_template import ChatTemplate

    config = {
        "eos_token": "</s>",
        "chat_template": [
            {"name": "default", "template": "{% for m in messages %}{{ m.content }}{% endfor %}"},
            {
                "name": "tool_use",
                "template": "TOOLS {{ tools | map(attribute='function') | map(attribute='name') | join(',') }}"
                " {% for m in messages %}{{ m.role }}:{{ m.content }}{% if m.tool_calls %}"
                "{{ m.tool_calls[0].function.arguments.city }}{% endif %};{% endfor %}",
            },
        ],
    }
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    template = ChatTemplate.from_tokenizer_dir(tmp_path)
    messages = [
        {"role": "user", "content": "weather?"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"function": {"name": "get_weather", "arguments": {"city": "Oslo"}}}],
        },
        {"role": "tool", "content": "sunny", "tool_call_id": "call_1"},
    ]
    assert template.render(messages) == "weather?sunny"  # no tools: the default template
    rendered = template.render(messages, tools=[WEATHER])
    assert rendered == "TOOLS get_weather user:weather?;assistant:Oslo;tool:sunny;"


def test_the_conversation_reaches_the_template_with_call_arguments_as_objects():
    from toolkit.api.schemas import ChatCompletionRequest
    from toolkit.api.tools import template_messages, template_tools

    body = ChatCompletionRequest.model_validate(
        {
            "model": "m",
            "tools": [WEATHER],
            "messages": [
                {"role": "user", "content": "weather?"},
                {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [
                        {
                            "id": "call_1",
                            "type": "function",
                            "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'},
                        }
                    ],
                },
                {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
            ],
        }
    )
    messages = template_messages(body.messages)
    assert messages[1]["tool_calls"][0]["function"]["arguments"] == {"city": "Oslo"}
    assert messages[2] == {"role": "tool", "content": "sunny", "tool_call_id": "call_1"}
    assert template_tools(body.tools) == [WEATHER]
