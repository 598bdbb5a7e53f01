"""The clients production code uses, unchanged, against the API on the served CPU repository (SmolLM2 through
real tritonserver): the `openai` package's structured outputs and log probs, LangChain's structured output
and a two-turn tool conversation, LiteLLM's. The model has no tool-call tokens of its own: the API reads
calls with the Hermes parser (--tool-parser hermes), and forced calls are guided decoding."""

from __future__ import annotations

import json

import pytest
from pydantic import BaseModel

pytestmark = pytest.mark.server

KEY = "sk-clients"
QUESTION = "What is the capital of France? Answer in JSON."


class Capital(BaseModel):
    country: str
    capital: str


WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "description": "The city"}},
            "required": ["city"],
        },
    },
}


@pytest.fixture(scope="module")
def api_options() -> dict:
    """conftest's `api` with an API key and the Hermes tool-call parser."""
    return {"api_keys": (KEY,), "tool_parser": "hermes"}


def test_openai_parse_returns_the_pydantic_object(client, model_id):
    completion = client.chat.completions.parse(
        model=model_id,
        messages=[{"role": "user", "content": QUESTION}],
        response_format=Capital,
        max_tokens=60,
        temperature=0,
    )
    parsed = completion.choices[0].message.parsed
    assert isinstance(parsed, Capital)
    assert "Paris" in parsed.capital


def test_openai_logprobs_equal_a_transformers_forward_pass(client, model_id, reference_model):
    import torch

    model, tokenizer = reference_model
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    response = client.chat.completions.create(
        model=model_id,
        messages=messages,
        max_tokens=6,
        temperature=0,
        logprobs=True,
        top_logprobs=3,
    )
    content = response.choices[0].logprobs.content
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    for entry in content:
        with torch.no_grad():
            row = torch.log_softmax(model(torch.tensor([ids])).logits[0, -1].float(), -1)
        best = row.topk(3)
        token = int(best.indices[0])  # greedy
        assert bytes(entry.bytes) == tokenizer.decode([token]).encode()
        assert abs(entry.logprob - float(row[token])) < 1e-4
        for alternative, value in zip(entry.top_logprobs, best.values.tolist(), strict=True):
            assert abs(alternative.logprob - value) < 1e-4
        ids.append(token)


def test_openai_forced_tool_call_and_the_answer_after_its_result(client, model_id):
    messages = [{"role": "user", "content": "What is the weather in Paris?"}]
    first = client.chat.completions.create(
        model=model_id,
        messages=messages,
        tools=[WEATHER_TOOL],
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
        max_tokens=40,
        temperature=0,
    )
    choice = first.choices[0]
    assert choice.finish_reason == "tool_calls"
    (call,) = choice.message.tool_calls
    assert call.function.name == "get_weather" and "city" in json.loads(call.function.arguments)
    messages += [
        choice.message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": "Sunny, 24 C"},
    ]
    second = client.chat.completions.create(
        model=model_id, messages=messages, tools=[WEATHER_TOOL], max_tokens=30, temperature=0
    )
    assert second.choices[0].message.content


def test_langchain_structured_output_and_a_two_turn_tool_conversation(api, model_id):
    from langchain_core.messages import HumanMessage
    from langchain_core.tools import tool
    from langchain_openai import ChatOpenAI

    llm = ChatOpenAI(
        model=model_id,
        base_url=f"{api.url}/v1",
        api_key=KEY,
        temperature=0,
        max_tokens=60,
        max_retries=0,
        timeout=300,
    )
    result = llm.with_structured_output(Capital).invoke(QUESTION)
    assert isinstance(result, Capital) and "Paris" in result.capital

    @tool
    def get_weather(city: str) -> str:
        """Get the current weather in a city."""
        return f"Sunny, 24 C in {city}"

    question = HumanMessage("What is the weather in Paris?")
    called = llm.bind_tools([get_weather], tool_choice="get_weather").invoke([question])
    assert called.tool_calls and called.tool_calls[0]["name"] == "get_weather"
    assert "city" in called.tool_calls[0]["args"]
    result_message = get_weather.invoke(called.tool_calls[0])
    answer = llm.bind_tools([get_weather]).invoke([question, called, result_message])
    assert answer.content or answer.tool_calls


def test_litellm_structured_output_and_tool_calls(api, model_id, monkeypatch):
    monkeypatch.setenv("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # no download of its price list
    import litellm

    litellm.telemetry = False
    common = dict(model=f"openai/{model_id}", api_base=f"{api.url}/v1", api_key=KEY, temperature=0)
    response = litellm.completion(
        messages=[{"role": "user", "content": QUESTION}],
        response_format=Capital,
        max_tokens=60,
        **common,
    )
    parsed = Capital.model_validate_json(response.choices[0].message.content)
    assert "Paris" in parsed.capital
    messages = [{"role": "user", "content": "What is the weather in Paris?"}]
    called = litellm.completion(
        messages=messages,
        tools=[WEATHER_TOOL],
        tool_choice="required",
        max_tokens=80,
        **common,
    )
    message = called.choices[0].message
    assert message.tool_calls, (called.choices[0].finish_reason, message.content)
    (call,) = message.tool_calls
    assert call.function.name == "get_weather"
    messages += [
        called.choices[0].message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": "Sunny, 24 C"},
    ]
    answer = litellm.completion(messages=messages, tools=[WEATHER_TOOL], max_tokens=30, **common)
    assert answer.choices[0].message.content or answer.choices[0].message.tool_calls
