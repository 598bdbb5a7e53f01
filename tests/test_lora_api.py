"""The OpenAI API's LoRA routing without a server: a synthetic repository built with two adapters; /v1/models lists
them under the base model, a body's `model` picks the task id the engine request carries (the engine contract and
the text one), an unknown model is a 404 naming the valid ids, and the base model's names keep working."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from toolkit.api import ApiSettings, create_app
from toolkit.api.features import Features
from toolkit.api.triton import Piece, Sampling, TritonBackend

from lora_adapters import make_two_adapters
from repos import write_test_repository
from tiny import make_tiny_checkpoint

UNREACHABLE = "127.0.0.1:1"


@pytest.fixture(scope="module")
def repo(tmp_path_factory):
    root = tmp_path_factory.mktemp("lora-api")
    checkpoint = make_tiny_checkpoint(root / "checkpoint")
    adapters = make_two_adapters(checkpoint, root / "adapters")
    return write_test_repository(
        checkpoint,
        root / "repo",
        source="hf:Tiny/Lora-Base",
        synthetic=True,
        lora=tuple((name, str(path)) for name, path in adapters.items()),
    )


@pytest.fixture(scope="module")
def app(repo):
    return create_app(ApiSettings(UNREACHABLE, repo))


@pytest.fixture
def sent(app, monkeypatch):
    """The features of every request the app hands the backend (which answers one token)."""
    seen: list[Features] = []

    async def generate(prompt, prompt_ids, max_tokens, sampling, *, features=None, watched=True):
        seen.append(features)
        yield Piece(b"ok", 1, True, tokens=(5,))

    monkeypatch.setattr(app.state.api.backend, "generate", generate)
    return seen


def test_models_lists_the_base_and_each_adapter_with_its_parent(app):
    with TestClient(app) as client:
        data = client.get("/v1/models").json()["data"]
        assert [(m["id"], m["parent"], m["root"]) for m in data] == [
            ("Lora-Base", None, "Lora-Base"),
            ("alpha", "Lora-Base", "Lora-Base"),
            ("beta", "Lora-Base", "Lora-Base"),
        ]
        assert client.get("/v1/models/beta").json()["parent"] == "Lora-Base"
        missing = client.get("/v1/models/gamma")
        assert missing.status_code == 404 and "`alpha`, `beta`" in missing.text


@pytest.mark.parametrize(
    ("model", "task"), [("Lora-Base", 0), ("tensorrt_llm", 0), ("alpha", 1), ("beta", 2)]
)
def test_the_body_s_model_picks_the_adapter_s_task_id(app, sent, model, task):
    with TestClient(app) as client:
        answer = client.post(
            "/v1/completions", json={"model": model, "prompt": "hello", "max_tokens": 2}
        )
    assert answer.status_code == 200, answer.text
    assert answer.json()["model"] == model
    assert [f.lora_task_id for f in sent] == [task]


def test_an_unknown_model_is_a_404_naming_every_valid_id(app, sent):
    with TestClient(app) as client:
        answer = client.post(
            "/v1/chat/completions",
            json={"model": "gamma", "messages": [{"role": "user", "content": "hi"}]},
        )
    assert answer.status_code == 404
    error = answer.json()["error"]
    assert error["code"] == "model_not_found" and error["param"] == "model"
    assert error["message"] == (
        "The model `gamma` does not exist; this server serves `Lora-Base` and its LoRA adapters "
        "`alpha`, `beta`."
    )
    assert sent == []


def _inputs(request) -> dict:
    """The request's inputs by name: (data type, shape) of the ModelInferRequest the API sends."""
    return {i.name: (i.datatype, list(i.shape)) for i in request.inputs}


@pytest.mark.parametrize("model_name", ["tensorrt_llm", "ensemble"])
def test_the_task_id_goes_out_as_the_backend_s_uint64_input(repo, model_name):
    from toolkit.api.prompt import PromptCodec
    from toolkit.repository.reader import open_repository

    repository = open_repository(repo)
    backend = TritonBackend(
        UNREACHABLE, model_name, decoder=PromptCodec(repository), tokens=repository.tokens
    )
    for task in (0, 2):
        features = Features(cached_tokens=False, lora_task_id=task)
        request = (
            backend._engine_request([5, 6], 4, Sampling(temperature=0), features)
            if backend.engine
            else backend._text_request("hi", 4, Sampling(temperature=0), features)
        )
        inputs = _inputs(request)
        if task:
            assert inputs["lora_task_id"] == ("UINT64", [1, 1])
        else:
            assert "lora_task_id" not in inputs
