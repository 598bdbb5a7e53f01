"""Property-based fuzzing of the OpenAI API from its own OpenAPI schema (schemathesis), against the served repository.

The property: no request, valid or not, gets a 5xx; every error is in OpenAI's format; and the server
answers a normal request correctly afterwards. The schema copy used for generation pins `model` to the
served id and caps max_tokens so that most generated requests reach the engine and stay short.
"""

from __future__ import annotations

import copy

import httpx
import openai
import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings

from toolkit.api import ApiSettings, run_api_in_background
from toolkit.serve.net import free_port

pytestmark = pytest.mark.server

MAX_TOKENS_CAP = 4
GENERATION_OPS = ("/v1/chat/completions", "/v1/completions")


@pytest.fixture(scope="module")
def fuzz_api(served_repo):
    # as `toolkit serve` runs it: engine streams over Triton's HTTP generate_stream (log probs and
    # logit bias over gRPC), so fuzzed sampling values reach the engine through both transports
    settings = ApiSettings(
        served_repo.grpc_url, served_repo.repo, max_in_flight=64,
        engine_http_url=served_repo.http_url,
    )  # fmt: skip
    handle = run_api_in_background(settings, port=free_port())
    yield handle
    handle.stop()


def _constrained(schema: dict, model_id: str) -> dict:
    schema = copy.deepcopy(schema)
    for name, component in schema["components"]["schemas"].items():
        props = component.get("properties", {})
        if name in ("ChatCompletionRequest", "CompletionRequest"):
            props["model"] = {"type": "string", "enum": [model_id]}
        for field in ("max_tokens", "max_completion_tokens"):
            if field in props:
                props[field] = {
                    "anyOf": [
                        {"type": "integer", "minimum": 1, "maximum": MAX_TOKENS_CAP},
                        {"type": "null"},
                    ]
                }
    return schema


@pytest.fixture(scope="module")
def api_schema(fuzz_api):
    raw = httpx.get(f"{fuzz_api.url}/openapi.json").json()
    model_id = httpx.get(f"{fuzz_api.url}/v1/models").json()["data"][0]["id"]
    return schemathesis.openapi.from_dict(_constrained(raw, model_id))


def _operations(api_schema) -> dict:
    found = {}
    for result in api_schema.get_all_operations():
        operation = result.ok()
        found[f"{operation.method.upper()} {operation.path}"] = operation
    return found


# schemathesis' own pytest plugin does not load under pytest 9, so each operation's strategy drives hypothesis here.
@pytest.mark.parametrize(
    "operation",
    [
        "POST /v1/chat/completions",
        "POST /v1/completions",
        "GET /v1/models",
        "GET /v1/models/{model}",
        "GET /health",
        "GET /metrics",
    ],
)
def test_no_request_gets_a_5xx(api_schema, fuzz_api, operation):
    operations = _operations(api_schema)
    # bounded: the whole module stays near a minute on 2 CPU cores
    examples = 15 if operation.startswith("POST") else 10

    @given(case=operations[operation].as_strategy())
    @settings(
        max_examples=examples,
        deadline=None,
        suppress_health_check=list(HealthCheck),
        database=None,
        phases=[Phase.explicit, Phase.generate],
    )
    def check(case):
        if (
            case.path in GENERATION_OPS
            and isinstance(case.body, dict)
            and not (case.body.get("max_tokens") or case.body.get("max_completion_tokens"))
        ):
            case.body["max_tokens"] = (
                MAX_TOKENS_CAP  # without it a chat generates up to the engine's limit: right, but slow
            )
        response = case.call(base_url=fuzz_api.url, timeout=60)
        assert response.status_code < 500, (
            f"{case.method} {case.path} {case.body!r} -> {response.status_code} {response.text[:300]}"
        )
        if response.status_code >= 400 and case.path.startswith("/v1/"):
            assert set(response.json()["error"]) == {"message", "type", "param", "code"}

    check()


@pytest.fixture(scope="module")
def grpc_fuzz_api(served_repo):
    handle = run_api_in_background(
        ApiSettings(served_repo.grpc_url, served_repo.repo, max_in_flight=64), port=free_port()
    )
    yield handle
    handle.stop()


@pytest.mark.parametrize("operation", ["POST /v1/chat/completions", "POST /v1/completions"])
def test_each_body_gets_the_same_status_over_either_engine_transport(
    api_schema, fuzz_api, grpc_fuzz_api, operation
):
    """The same fuzzed body to an API reading the engine over HTTP and to one over gRPC: the same status
    (what reaches the engine goes as JSON on one and protobuf on the other: odd values must not part
    them), and the same error code when refused."""

    @given(case=_operations(api_schema)[operation].as_strategy())
    @settings(
        max_examples=20, deadline=None, suppress_health_check=list(HealthCheck), database=None,
        phases=[Phase.explicit, Phase.generate],
    )  # fmt: skip
    def check(case):
        if isinstance(case.body, dict) and not (
            case.body.get("max_tokens") or case.body.get("max_completion_tokens")
        ):
            case.body["max_tokens"] = MAX_TOKENS_CAP
        answers = [case.call(base_url=api.url, timeout=60) for api in (fuzz_api, grpc_fuzz_api)]
        statuses = [a.status_code for a in answers]
        assert statuses[0] == statuses[1] and statuses[0] < 500, (
            f"{case.body!r} -> HTTP transport {statuses[0]} {answers[0].text[:200]}, "
            f"gRPC {statuses[1]} {answers[1].text[:200]}"
        )
        if statuses[0] >= 400:
            codes = [a.json()["error"]["code"] for a in answers]
            assert codes[0] == codes[1], (case.body, codes)

    check()


def test_server_still_answers_correctly_after_fuzzing(fuzz_api):
    client = openai.OpenAI(
        base_url=f"{fuzz_api.url}/v1", api_key="none", max_retries=0, timeout=120
    )
    model_id = client.models.list().data[0].id
    response = client.chat.completions.create(
        model=model_id,
        messages=[{"role": "user", "content": "What is the capital of France?"}],
        max_tokens=8,
        temperature=0,
    )
    assert "Paris" in response.choices[0].message.content
    assert response.usage.completion_tokens > 0
    assert httpx.get(f"{fuzz_api.url}/health").status_code == 200
    metrics = httpx.get(f"{fuzz_api.url}/metrics").text
    assert 'status="5' not in metrics and "toolkit_api_requests_in_flight 0.0" in metrics
