"""The OpenAI API's request features through real tritonserver on a CPU repository of the tiny random model:
structured outputs, log probs (against a plain forward pass), n, penalties and logit_bias, a list of prompts,
echo, cached tokens, /tokenize and /detokenize. A random model writes only what guided decoding lets it."""

from __future__ import annotations

import json
import re

import httpx
import pytest

from toolkit.api import ApiSettings, run_api_in_background
from toolkit.serve.net import free_port

from repos import launch_on_free_ports, write_test_repository
from tiny import make_tiny_checkpoint

pytestmark = pytest.mark.server

SCHEMA = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 8},
        "rank": {"type": "integer", "minimum": 1, "maximum": 9},
        "sunny": {"type": "boolean"},
    },
    "required": ["city", "rank", "sunny"],
    "additionalProperties": False,
}
MESSAGES = [{"role": "user", "content": "Hello world"}]


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    root = tmp_path_factory.mktemp("features")
    checkpoint = make_tiny_checkpoint(root / "checkpoint")
    repo = write_test_repository(checkpoint, root / "repo", kv_block_size=16)
    server = launch_on_free_ports(repo, root / "server.log", 300)
    # as `toolkit serve` runs it: engine streams over HTTP (log probs and logit bias go over gRPC)
    api = run_api_in_background(
        ApiSettings(server.grpc_url, repo, engine_http_url=server.http_url), port=free_port()
    )
    yield checkpoint, repo, server, api
    api.stop()
    server.stop()


@pytest.fixture(scope="module")
def model_id(served) -> str:
    return httpx.get(f"{served[3].url}/v1/models").json()["data"][0]["id"]


def post(served, path: str, **body) -> httpx.Response:
    return httpx.post(f"{served[3].url}{path}", json=body, timeout=120)


def events(response: httpx.Response) -> list[dict]:
    lines = [line for line in response.text.split("\n\n") if line.startswith("data: ")]
    assert lines[-1] == "data: [DONE]", response.text[-300:]
    return [json.loads(line.removeprefix("data: ")) for line in lines[:-1]]


def chat(served, model_id, **fields) -> httpx.Response:
    return post(served, "/v1/chat/completions", model=model_id, messages=MESSAGES, **fields)


# --- structured outputs ------------------------------------------------------------------------------
@pytest.mark.parametrize("seed", [1, 2])
def test_json_schema_output_of_a_random_model_is_valid_streamed_or_not(served, model_id, seed):
    import jsonschema

    response_format = {"type": "json_schema", "json_schema": {"name": "w", "schema": SCHEMA}}
    common = dict(max_tokens=64, temperature=1.0, seed=seed, response_format=response_format)
    whole = chat(served, model_id, **common)
    assert whole.status_code == 200, whole.text
    text = whole.json()["choices"][0]["message"]["content"]
    jsonschema.validate(json.loads(text), SCHEMA)
    assert whole.json()["choices"][0]["finish_reason"] == "stop"
    streamed = chat(served, model_id, stream=True, **common)
    pieces = [
        c["choices"][0]["delta"].get("content") or "" for c in events(streamed) if c["choices"]
    ]
    assert "".join(pieces) == text  # same seed, same text


def test_json_object_regex_and_ebnf_on_completions(served, model_id):
    def complete(response_format):
        response = post(
            served,
            "/v1/completions",
            model=model_id,
            prompt="The capital of France is",
            max_tokens=48,
            temperature=1.0,
            seed=3,
            response_format=response_format,
        )
        assert response.status_code == 200, response.text
        return response.json()["choices"][0]["text"]

    assert isinstance(json.loads(complete({"type": "json_object"})), dict)
    regex = r"[A-Z][a-z]{2,6}, [0-9]{4}"
    assert re.fullmatch(regex, complete({"type": "regex", "regex": regex}))
    ebnf = 'root ::= "yes" | "no" | "maybe"'
    assert complete({"type": "ebnf", "ebnf": ebnf}) in ("yes", "no", "maybe")


def test_a_schema_or_grammar_that_does_not_compile_is_a_400_naming_the_error(served, model_id):
    cases = [
        ({"type": "regex", "regex": "[0-9"}, "unclosed character class"),
        ({"type": "ebnf", "ebnf": "root ::= missing"}, "Rule 'missing' not found"),
        (
            {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "nonsense"}}},
            "nonsense",
        ),
    ]
    for response_format, words in cases:
        response = chat(served, model_id, max_tokens=4, response_format=response_format)
        assert response.status_code == 400, response.text
        error = response.json()["error"]
        assert error["param"] == "response_format" and words in error["message"], error


# --- log probs ---------------------------------------------------------------------------------------
def _forward_logprobs(checkpoint, prompt_ids, generated):
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(checkpoint, dtype=torch.float32).eval()
    with torch.no_grad():
        logits = model(torch.tensor([prompt_ids + generated])).logits[0].float()
    rows = torch.log_softmax(logits[len(prompt_ids) - 1 : -1], -1)
    return rows


def test_chat_logprobs_equal_a_plain_forward_pass_of_the_model(served, model_id):
    import torch
    from transformers import AutoModelForCausalLM

    checkpoint = served[0]
    response = chat(served, model_id, max_tokens=8, temperature=0, logprobs=True, top_logprobs=3)
    assert response.status_code == 200, response.text
    content = response.json()["choices"][0]["logprobs"]["content"]
    ids = post(served, "/tokenize", model=model_id, messages=MESSAGES).json()["tokens"]
    model = AutoModelForCausalLM.from_pretrained(checkpoint, dtype=torch.float32).eval()
    for entry in content:  # greedy: each step's token is the forward pass's argmax
        with torch.no_grad():
            row = torch.log_softmax(model(torch.tensor([ids])).logits[0, -1].float(), -1)
        best = row.topk(3)
        token = int(best.indices[0])
        assert abs(entry["logprob"] - float(row[token])) < 1e-4
        assert [round(a["logprob"], 4) for a in entry["top_logprobs"]] == [
            round(v, 4) for v in best.values.tolist()
        ]
        text = post(served, "/detokenize", model=model_id, tokens=[token]).json()["prompt"]
        assert entry["token"] == text and bytes(entry["bytes"]).decode("utf-8", "replace") == text
        ids.append(token)


def test_completion_logprobs_and_echo(served, model_id):
    body = dict(model=model_id, prompt="Hello world", max_tokens=5, temperature=0)
    response = post(served, "/v1/completions", logprobs=2, **body).json()
    logprobs = response["choices"][0]["logprobs"]
    text = response["choices"][0]["text"]
    assert len(logprobs["tokens"]) == len(logprobs["token_logprobs"]) == 5
    assert "".join(logprobs["tokens"]) == text
    assert all(len(top) <= 2 for top in logprobs["top_logprobs"])
    assert logprobs["text_offset"][0] == 0
    echoed = post(served, "/v1/completions", echo=True, **body).json()["choices"][0]["text"]
    assert echoed == "Hello world" + text
    # Streamed with n = 2, each choice starts with the prompt (only choice 0 got it before)
    streamed = post(served, "/v1/completions", echo=True, n=2, stream=True, **body)
    texts = {0: "", 1: ""}
    for event in events(streamed):
        for choice in event["choices"]:
            texts[choice["index"]] += choice["text"]
    assert all(t.startswith("Hello world") and len(t) > len("Hello world") for t in texts.values())
    refused = post(served, "/v1/completions", echo=True, logprobs=0, **body)
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "echo"
    assert "prompt log prob" in refused.json()["error"]["message"]


# --- n, penalties, bias, prompts ---------------------------------------------------------------------
def test_n_choices_have_their_own_seeds_and_indexes_streamed_or_not(served, model_id):
    common = dict(max_tokens=8, min_tokens=8, temperature=1.0, seed=5, n=3)
    whole = chat(served, model_id, **common).json()
    texts = [c["message"]["content"] for c in whole["choices"]]
    assert [c["index"] for c in whole["choices"]] == [0, 1, 2] and len(set(texts)) == 3
    assert whole["usage"]["completion_tokens"] == 24
    chunks = events(chat(served, model_id, stream=True, **common))
    streamed = {0: "", 1: "", 2: ""}
    for chunk in chunks:
        for choice in chunk["choices"]:
            streamed[choice["index"]] += choice["delta"].get("content") or ""
    assert [streamed[i] for i in range(3)] == texts
    single = chat(served, model_id, max_tokens=8, min_tokens=8, temperature=1.0, seed=5).json()
    assert single["choices"][0]["message"]["content"] == texts[0]


def test_n_choices_of_a_one_token_prompt_are_answered_and_harm_no_other_request(served, model_id):
    """transformers forks a request's n choices from its prompt less one token, so a one-token prompt
    was prefilled with nothing: the engine's whole generation step failed (`cannot reshape tensor of 0
    elements`, a 502 for this request and for every other one in the step, and a loop restart). The
    engine now adds such a request's choices as requests of their own, with the fork's ids and seeds."""
    import concurrent.futures

    tokens = post(served, "/tokenize", model=model_id, prompt="a").json()["tokens"]
    assert len(tokens) == 1, tokens
    common = dict(model=model_id, prompt="a", max_tokens=6, min_tokens=6, temperature=1.0, seed=3)
    alone = post(served, "/v1/completions", n=3, **common)  # an idle engine: a step of its own
    assert alone.status_code == 200, alone.text
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        others = [pool.submit(post, served, "/v1/completions", model=model_id, prompt="Hello",
                              max_tokens=24, min_tokens=24) for _ in range(3)]  # fmt: skip
        several = post(served, "/v1/completions", n=3, **common)
        assert several.status_code == 200, several.text
        for other in others:
            assert other.result().status_code == 200, other.result().text
    assert several.json()["choices"] == alone.json()["choices"]
    choices = several.json()["choices"]
    assert [c["index"] for c in choices] == [0, 1, 2] and len({c["text"] for c in choices}) == 3
    assert several.json()["usage"]["completion_tokens"] == 18
    single = post(served, "/v1/completions", **common).json()
    assert single["choices"][0]["text"] == choices[0]["text"]  # choice 0 keeps the request's seed


def test_logit_bias_and_penalties_reach_the_engine(served, model_id):
    forced = chat(served, model_id, max_tokens=6, temperature=0, logit_bias={"77": 100}).json()
    detok = post(served, "/detokenize", model=model_id, tokens=[77] * 6).json()["prompt"]
    assert forced["choices"][0]["message"]["content"] == detok
    plain = chat(served, model_id, max_tokens=12, temperature=0).json()
    penalized = chat(
        served, model_id, max_tokens=12, temperature=0, repetition_penalty=1.8, presence_penalty=1.5
    ).json()
    assert (
        penalized["choices"][0]["message"]["content"] != plain["choices"][0]["message"]["content"]
    )


def test_a_list_of_prompts_gets_a_choice_each_in_order(served, model_id):
    prompts = ["Hello world", "The capital of France is", "Numbers 0 1 2"]
    response = post(
        served, "/v1/completions", model=model_id, prompt=prompts, max_tokens=4, temperature=0, n=2
    ).json()
    assert [c["index"] for c in response["choices"]] == list(range(6))
    for i, prompt in enumerate(prompts):
        alone = post(
            served, "/v1/completions", model=model_id, prompt=prompt, max_tokens=4, temperature=0
        ).json()
        assert response["choices"][2 * i]["text"] == alone["choices"][0]["text"]


def test_a_repeated_prompt_reports_its_cached_tokens_and_the_engine_its_reused_blocks(
    served, model_id
):
    import urllib.request

    prompt = "A quick brown fox jumps over the lazy dog. " * 8
    body = dict(model=model_id, prompt=prompt, max_tokens=2, temperature=0)
    first = post(served, "/v1/completions", **body).json()["usage"]
    second = post(served, "/v1/completions", **body).json()["usage"]
    assert first["prompt_tokens_details"]["cached_tokens"] == 0
    cached = second["prompt_tokens_details"]["cached_tokens"]
    assert 0 < cached < second["prompt_tokens"] and cached % 16 == 0
    metrics = urllib.request.urlopen(served[2].metrics_url, timeout=10).read().decode()
    reused = re.search(
        r'nv_trt_llm_kv_cache_block_metrics\{[^}]*kv_cache_block_type="reused"[^}]*\} (\S+)',
        metrics,
    )
    assert reused and float(reused.group(1)) >= cached // 16


def test_tokenize_and_detokenize_use_the_repository_s_tokenizer(served, model_id):
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(served[0] / "tokenizer.json"))
    tokens = post(served, "/tokenize", model=model_id, prompt="Hello world").json()
    assert tokens["tokens"] == tokenizer.encode("Hello world").ids and tokens["count"] == 2
    assert tokens["max_model_len"] == 256
    assert post(served, "/detokenize", model=model_id, tokens=tokens["tokens"]).json() == {
        "prompt": "Hello world"
    }
    chat_ids = post(served, "/tokenize", model=model_id, messages=MESSAGES).json()["tokens"]
    rendered = chat(served, model_id, max_tokens=1).json()["usage"]["prompt_tokens"]
    assert len(chat_ids) == rendered
    bad = post(served, "/detokenize", model=model_id, tokens=[10**6])
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "tokens"


@pytest.mark.parametrize("model_name", ["ensemble", "tensorrt_llm_bls"])
def test_the_text_models_pass_the_guide_on_to_the_engine(served, model_id, model_name):
    _, repo, server, _ = served
    api = run_api_in_background(ApiSettings(server.grpc_url, repo, model_name), port=free_port())
    try:
        regex = r"[0-9]{3}-[a-z]{4}"
        response = httpx.post(
            f"{api.url}/v1/completions",
            json={
                "model": model_id,
                "prompt": "Hello world",
                "max_tokens": 24,
                "temperature": 1.0,
                "seed": 4,
                "response_format": {"type": "regex", "regex": regex},
            },
            timeout=120,
        )
        assert response.status_code == 200, response.text
        assert re.fullmatch(regex, response.json()["choices"][0]["text"])
    finally:
        api.stop()


def test_tokenize_refuses_what_the_generation_routes_refuse(served, model_id):
    """A lone surrogate was a 500 from the tokenizer, and a prompt of megabytes was encoded on the event
    loop with no length check (every stream and /health waited); now both are the 400s the completion
    routes give."""
    # JSON's escape of a lone surrogate (httpx cannot encode the character itself)
    body = json.dumps({"model": model_id, "prompt": "hi @"}).replace("@", "\\ud800")
    surrogate = httpx.post(
        f"{served[3].url}/tokenize",
        content=body,
        headers={"content-type": "application/json"},
        timeout=120,
    )
    assert surrogate.status_code == 400, surrogate.text
    assert surrogate.json()["error"]["code"] == "invalid_value"
    huge = post(served, "/tokenize", model=model_id, prompt="word " * 200_000)
    assert huge.status_code == 400, huge.text
    assert huge.json()["error"]["code"] == "context_length_exceeded"
    content = [{"role": "user", "content": "<|im_start|>system"}]
    marked = post(served, "/tokenize", model=model_id, messages=content).json()["tokens"]
    rendered = post(served, "/v1/chat/completions", model=model_id, messages=content, max_tokens=1)
    assert len(marked) == rendered.json()["usage"]["prompt_tokens"]  # the ids the engine gets
