"""The OpenAI API against the real served CPU repository, with the official `openai` package as the client."""

from __future__ import annotations

import re
import time
import urllib.request

import httpx
import openai
import pytest

from toolkit.api import ApiSettings, run_api_in_background
from toolkit.serve.net import free_port

from sse_events import chunk_text, sse_events

pytestmark = pytest.mark.server

KEY = "sk-test-key"
MESSAGES = [{"role": "user", "content": "What is the capital of France?"}]


def start_api(served_repo, **kw):
    settings = ApiSettings(served_repo.grpc_url, served_repo.repo, **kw)
    return run_api_in_background(settings, port=free_port())


@pytest.fixture(scope="module")
def api_options() -> dict:
    """conftest's `api` with an API key and room for 8 requests in flight."""
    return {"api_keys": (KEY,), "max_in_flight": 8}


@pytest.fixture(scope="module")
def hf_tokenizer(served_repo):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(served_repo.repo / "preprocessing" / "1" / "tokenizer")


def chat_prompt_tokens(tokenizer, messages) -> int:
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    return len(tokenizer(text, add_special_tokens=False)["input_ids"])


def engine_metric(served_repo, name: str) -> float:
    url = (
        served_repo.metrics_url
        if served_repo.metrics_url.endswith("/metrics")
        else f"{served_repo.metrics_url}/metrics"
    )
    text = urllib.request.urlopen(url, timeout=5).read().decode()
    values = [float(m.group(1)) for m in re.finditer(rf"^{name}(?:{{[^}}]*}})? (\S+)$", text, re.M)]
    return sum(values)


def test_health_and_models(api, client, model_id):
    assert httpx.get(f"{api.url}/health").json()["status"] == "ok"
    assert model_id and client.models.retrieve(model_id).id == model_id


def test_chat_completion_usage_matches_the_tokenizer(client, model_id, hf_tokenizer):
    response = client.chat.completions.create(
        model=model_id, messages=MESSAGES, max_tokens=12, temperature=0
    )
    choice = response.choices[0]
    assert choice.message.role == "assistant" and choice.message.content
    assert response.usage.prompt_tokens == chat_prompt_tokens(hf_tokenizer, MESSAGES)
    assert (
        response.usage.total_tokens
        == response.usage.prompt_tokens + response.usage.completion_tokens
    )
    if choice.finish_reason == "length":
        assert response.usage.completion_tokens == 12
    else:
        assert choice.finish_reason == "stop" and 0 < response.usage.completion_tokens <= 12
    assert "Paris" in choice.message.content


def test_streamed_chat_equals_the_whole_answer_and_reports_usage(client, model_id):
    whole = client.chat.completions.create(
        model=model_id, messages=MESSAGES, max_completion_tokens=12, temperature=0
    )
    stream = client.chat.completions.create(
        model=model_id,
        messages=MESSAGES,
        max_completion_tokens=12,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    finish = [
        c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason
    ]
    assert text == whole.choices[0].message.content
    assert finish == [whole.choices[0].finish_reason]
    assert chunks[-1].choices == [] and chunks[-1].usage.model_dump() == whole.usage.model_dump()


def test_text_completion_streamed_and_not(client, model_id, hf_tokenizer):
    prompt = "The capital of France is"
    whole = client.completions.create(model=model_id, prompt=prompt, max_tokens=8, temperature=0)
    assert whole.usage.prompt_tokens == len(
        hf_tokenizer(prompt, add_special_tokens=False)["input_ids"]
    )
    assert whole.choices[0].finish_reason in ("stop", "length")
    pieces = list(
        client.completions.create(
            model=model_id, prompt=prompt, max_tokens=8, temperature=0, stream=True
        )
    )
    assert "".join(p.choices[0].text for p in pieces) == whole.choices[0].text


def test_completions_default_to_16_tokens_also_for_an_explicit_null(api, model_id):
    for extra in ({}, {"max_tokens": None}):
        body = {"model": model_id, "prompt": COUNTING, "temperature": 0, "min_tokens": 16, **extra}
        response = httpx.post(
            f"{api.url}/v1/completions",
            json=body,
            headers={"Authorization": f"Bearer {KEY}"},
            timeout=120,
        )
        assert response.status_code == 200, response.text
        assert (
            response.json()["usage"]["completion_tokens"] == 16
            and response.json()["choices"][0]["finish_reason"] == "length"
        )


@pytest.mark.parametrize("stream", [False, True])
def test_stop_sequence_ends_the_text_before_it(client, model_id, stream):
    prompt = "Count: one, two, three, four, five, six,"
    full = (
        client.completions.create(model=model_id, prompt=prompt, max_tokens=24, temperature=0)
        .choices[0]
        .text
    )
    stop = full[len(full) // 2 : len(full) // 2 + 3]
    assert stop.strip(), f"the greedy answer {full!r} is too short to pick a stop string from"
    expected = full[: full.find(stop)]
    kwargs = dict(
        model=model_id,
        prompt=prompt,
        max_tokens=24,
        temperature=0,
        stop=[stop, "never-in-output-xyz"],
    )
    if stream:
        pieces = list(client.completions.create(**kwargs, stream=True))
        text = "".join(p.choices[0].text for p in pieces)
        reason = pieces[-1].choices[0].finish_reason
    else:
        choice = client.completions.create(**kwargs).choices[0]
        text, reason = choice.text, choice.finish_reason
    assert text == expected and reason == "stop"


def test_seeded_sampling_repeats(client, model_id):
    kwargs = dict(
        model=model_id, messages=MESSAGES, max_tokens=8, temperature=1.0, top_p=0.9, seed=1234
    )
    first = client.chat.completions.create(**kwargs).choices[0].message.content
    assert client.chat.completions.create(**kwargs).choices[0].message.content == first


def test_unsupported_field_is_400_in_openai_format(client, model_id):
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(model=model_id, messages=MESSAGES, modalities=["audio"])
    assert caught.value.body["param"] == "modalities"


def test_wrong_or_missing_key_is_401(api, model_id):
    wrong = openai.OpenAI(base_url=f"{api.url}/v1", api_key="sk-wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        wrong.chat.completions.create(model=model_id, messages=MESSAGES, max_tokens=2)
    response = httpx.get(f"{api.url}/v1/models")
    assert response.status_code == 401 and response.json()["error"]["code"] == "invalid_api_key"


def test_too_long_prompt_is_400_naming_the_limit(client, model_id, served_repo):
    from toolkit.repository.reader import open_repository

    limit = open_repository(served_repo.repo).limits.max_input_len
    with pytest.raises(openai.BadRequestError) as caught:
        client.completions.create(model=model_id, prompt="hello " * (limit + 10), max_tokens=2)
    assert str(limit) in caught.value.body["message"]


COUNTING = "1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12,"  # greedy decoding keeps counting: no early end of sequence


def _open_stream(url: str, model: str, max_tokens: int, headers: dict | None = None):
    """A long streamed completion left open after its third text chunk; returns (http client, response, lines)."""
    http = httpx.Client(timeout=120)
    body = {
        "model": model,
        "prompt": COUNTING,
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": True,
    }
    response = http.send(
        http.build_request("POST", f"{url}/v1/completions", json=body, headers=headers or {}),
        stream=True,
    )
    assert response.status_code == 200, response.read()
    lines = response.iter_lines()
    seen = 0
    for event in sse_events(lines):
        if chunk_text(event) is not None:
            seen += 1
            if seen >= 3:
                break
    # Keep `lines` referenced: a collected line iterator closes the response, which is a disconnect.
    return http, response, lines


def test_in_flight_bound_answers_429_with_retry_after(served_repo, model_id):
    handle = start_api(served_repo, max_in_flight=1, retry_after_s=3)
    try:
        http, held, _lines = _open_stream(handle.url, model_id, 200)
        response = httpx.post(
            f"{handle.url}/v1/chat/completions",
            json={"model": model_id, "messages": MESSAGES, "max_tokens": 2},
        )
        assert response.status_code == 429 and response.headers["retry-after"] == "3"
        assert response.json()["error"]["code"] == "rate_limit_exceeded"
        with pytest.raises(openai.RateLimitError):
            openai.OpenAI(
                base_url=f"{handle.url}/v1", api_key="none", max_retries=0
            ).chat.completions.create(model=model_id, messages=MESSAGES, max_tokens=2)
        held.close()
        http.close()
        deadline = time.monotonic() + 15
        while True:  # the slot frees once the server notices the disconnect
            response = httpx.post(
                f"{handle.url}/v1/chat/completions",
                json={"model": model_id, "messages": MESSAGES, "max_tokens": 2, "temperature": 0},
                timeout=60,
            )
            if response.status_code != 429 or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        assert response.status_code == 200, response.text
    finally:
        handle.stop()


def disconnect_mid_stream(
    served_repo, url: str, model_id: str, headers: dict | None = None
) -> None:
    """Open a long stream through the API at `url`, close it while it generates, and wait until the engine
    counts the request cancelled; nothing is left in flight then."""
    cancelled_before = engine_metric(served_repo, "toolkit_engine_requests_cancelled_total")
    http, response, _lines = _open_stream(url, model_id, 200, headers)
    time.sleep(1.0)
    # still generating
    assert engine_metric(served_repo, "toolkit_engine_requests_cancelled_total") == cancelled_before
    response.close()
    http.close()
    deadline = time.monotonic() + 20
    while engine_metric(served_repo, "toolkit_engine_requests_cancelled_total") <= cancelled_before:
        assert time.monotonic() < deadline, "the engine did not count the request as cancelled"
        time.sleep(0.2)
    assert engine_metric(served_repo, "toolkit_engine_requests_in_flight") == 0


def test_client_disconnect_cancels_the_engine_request(api, client, model_id, served_repo):
    disconnect_mid_stream(served_repo, api.url, model_id, {"Authorization": f"Bearer {KEY}"})
    # Generation stopped: the engine's token counter stays flat and nothing is left in flight.
    tokens = engine_metric(served_repo, "toolkit_engine_generated_tokens_total")
    time.sleep(1.0)
    assert engine_metric(served_repo, "toolkit_engine_generated_tokens_total") == tokens
    assert re.search(
        r"toolkit_api_cancelled_requests_total [1-9]", httpx.get(f"{api.url}/metrics").text
    )
    # The next request is served normally.
    after = client.chat.completions.create(
        model=model_id, messages=MESSAGES, max_tokens=6, temperature=0
    )
    assert after.choices[0].message.content and after.usage.completion_tokens > 0


def test_a_non_streaming_client_that_goes_away_cancels_too(api, client, model_id, served_repo):
    """Without streaming the API holds the request until the whole text is ready; a client that
    gives up before then must still free the engine."""
    cancelled_before = engine_metric(served_repo, "toolkit_engine_requests_cancelled_total")
    body = {
        "model": model_id,
        "prompt": COUNTING,
        "max_tokens": 200,
        "min_tokens": 200,
        "temperature": 0,
    }
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(
            f"{api.url}/v1/completions",
            json=body,
            headers={"Authorization": f"Bearer {KEY}"},
            timeout=httpx.Timeout(60, read=1.5),
        )
    deadline = time.monotonic() + 20
    while engine_metric(served_repo, "toolkit_engine_requests_cancelled_total") <= cancelled_before:
        assert time.monotonic() < deadline, "the engine did not count the request as cancelled"
        time.sleep(0.2)
    assert engine_metric(served_repo, "toolkit_engine_requests_in_flight") == 0
    after = client.completions.create(model=model_id, prompt=COUNTING, max_tokens=4, temperature=0)
    assert after.choices[0].text and after.usage.completion_tokens == 4


def test_metrics_count_requests_tokens_and_latency(api):
    text = httpx.get(f"{api.url}/metrics").text
    assert re.search(
        r'toolkit_api_requests_total\{endpoint="chat_completions",status="200"\} [1-9]', text
    )
    assert re.search(r"toolkit_api_completion_tokens_total [1-9]", text)
    assert re.search(r"toolkit_api_time_to_first_token_seconds_count [1-9]", text)
    assert re.search(r"toolkit_api_inter_token_latency_seconds_count [1-9]", text)
    # TTFT's halves, each observed once per generation that produced a token, and adding up to at most TTFT.
    counts = {
        name: float(re.search(rf"{name}_count (\S+)", text).group(1))
        for name in (
            "toolkit_api_time_to_first_token_seconds",
            "toolkit_api_admission_seconds",
            "toolkit_api_engine_first_response_seconds",
        )
    }
    sums = {name: float(re.search(rf"{name}_sum (\S+)", text).group(1)) for name in counts}
    assert (
        counts["toolkit_api_engine_first_response_seconds"]
        == counts["toolkit_api_time_to_first_token_seconds"]
        <= counts["toolkit_api_admission_seconds"]
    )
    assert (
        sums["toolkit_api_admission_seconds"] > 0
        and 0
        < sums["toolkit_api_engine_first_response_seconds"]
        < sums["toolkit_api_time_to_first_token_seconds"]
    )
    assert re.search(
        r'toolkit_api_requests_total\{endpoint="chat_completions",status="401"\} [1-9]', text
    )
    assert "toolkit_api_requests_in_flight 0.0" in text
