"""The capabilities record: decided by the target, carried by the manifest, and the one place the API
and the Python engines refuse from. A GPU repository is not refused what its backend honours."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from fastapi.testclient import TestClient

from toolkit.api.app import ApiSettings, create_app
from toolkit.api.triton import InferenceFailed, Piece
from toolkit.cli.main import cli
from toolkit.repository.configs import parse_pbtxt
from toolkit.repository.reader import open_repository
from toolkit.targets import get_target

from fakes import build_with_fake_trtllm, fake_checkpoint_with_tokenizer
from repos import write_test_repository
from tiny import make_tiny_checkpoint

LLAMA_8B = Path(__file__).parent / "data" / "llama-3.1-8b-instruct" / "config.json"
UNREACHABLE = "127.0.0.1:1"


@pytest.fixture(scope="module")
def gpu_repo(tmp_path_factory) -> Path:
    """An H100 repository built by `toolkit build` through the fake TensorRT-LLM tools."""
    tmp = tmp_path_factory.mktemp("gpu")
    checkpoint = fake_checkpoint_with_tokenizer(tmp, LLAMA_8B)
    result = build_with_fake_trtllm(tmp, "-t", "h100-sxm", "-m", checkpoint, "-o", tmp / "repo")
    assert result.exit_code == 0, result.output
    return tmp / "repo"


@pytest.fixture(scope="module")
def cpu_repo(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("cpu")
    return write_test_repository(make_tiny_checkpoint(root / "checkpoint"), root / "repo")


@pytest.fixture(scope="module")
def synthetic_repo(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("synthetic")
    checkpoint = make_tiny_checkpoint(root / "checkpoint")
    return write_test_repository(checkpoint, root / "repo", synthetic=True)


@pytest.fixture(scope="module")
def no_decoupled_cpu_repo(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("cpu-unary")
    checkpoint = make_tiny_checkpoint(root / "checkpoint")
    return write_test_repository(checkpoint, root / "repo", decoupled=False)


class _Recorder:
    """Stands in for Triton at the backend seam: records the sampling each request carries."""

    def __init__(self):
        self.sampling = []

    async def generate(self, prompt, prompt_ids, max_tokens, sampling, **kw):
        self.sampling.append(sampling)
        yield Piece(b"ok", 1, True)


def _client(repo: Path) -> tuple[TestClient, _Recorder]:
    app = create_app(ApiSettings(UNREACHABLE, repo))
    recorder = _Recorder()
    app.state.api.backend.generate = recorder.generate
    return TestClient(app, raise_server_exceptions=False), recorder


def _body(repo: Path, **fields) -> dict:
    model = open_repository(repo).served_model_name
    return {"model": model, "prompt": "hello", "max_tokens": 1, **fields}


def test_the_manifest_carries_what_the_target_decides(gpu_repo, cpu_repo):
    gpu, cpu = open_repository(gpu_repo).capabilities, open_repository(cpu_repo).capabilities
    assert gpu == get_target("h100-sxm").capabilities(open_repository(gpu_repo).manifest.settings)
    assert gpu.penalties and gpu.logit_bias and gpu.target == "h100-sxm"
    assert cpu.penalties and not cpu.supports("beam_width") and cpu.target == "cpu"


def test_the_dry_run_shows_the_capabilities():
    result = CliRunner().invoke(
        cli, ["build", "-r", "llama-3.1-8b-instruct-h100-sxm-fp8", "--dry-run", "--json"]
    )
    assert result.exit_code == 0, result.output
    capabilities = json.loads(result.stdout)["capabilities"]
    assert capabilities["target"] == "h100-sxm" and capabilities["penalties"] is True


def test_a_gpu_repository_is_not_refused_penalties_or_logit_bias(gpu_repo):
    """Before the capabilities record, these were 400s on every target (api/schemas.unsupported_fields)."""
    client, recorder = _client(gpu_repo)
    with client:
        body = _body(
            gpu_repo, presence_penalty=0.5, frequency_penalty=-0.25, logit_bias={"7": -100}
        )
        response = client.post("/v1/completions", json=body)
    assert response.status_code == 200, response.text
    sampling = recorder.sampling[0]
    assert (sampling.presence_penalty, sampling.frequency_penalty) == (0.5, -0.25)
    assert sampling.logit_bias == ((7, -100.0),)
    tensors = {name: array for name, array, _ in sampling.tensors(engine=True)}
    assert (
        tensors["presence_penalty"].item() == 0.5 and tensors["frequency_penalty"].item() == -0.25
    )


def test_logit_bias_becomes_the_engines_embedding_bias(gpu_repo):
    client, _ = _client(gpu_repo)
    with client:
        backend = client.app.state.api.backend
        bias = backend._embedding_bias(((7, -100.0), (3, 2.5)))
    vocab = open_repository(gpu_repo).manifest.model.facts.vocab_size
    assert bias.shape == (1, vocab) and bias.dtype == np.float32
    assert bias[0, 7] == -100 and bias[0, 3] == 2.5 and np.count_nonzero(bias) == 2


def test_a_synthetic_repository_refuses_them_naming_the_target_and_the_fix(synthetic_repo):
    client, recorder = _client(synthetic_repo)
    with client:
        for field, value in (("presence_penalty", 0.5), ("logit_bias", {"3": 1}), ("n", 2)):
            response = client.post("/v1/completions", json=_body(synthetic_repo, **{field: value}))
            assert response.status_code == 400, response.text
            error = response.json()["error"]
            assert error["param"] == field and error["code"] == "unsupported_parameter"
            assert (
                "target synthetic" in error["message"] and "cpu or a GPU target" in error["message"]
            )
    assert recorder.sampling == []  # nothing reached the engine


def test_a_cpu_repository_built_without_decoupling_refuses_n(no_decoupled_cpu_repo):
    client, recorder = _client(no_decoupled_cpu_repo)
    with client:
        response = client.post("/v1/completions", json=_body(no_decoupled_cpu_repo, n=2))
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == "n" and "--no-decoupled" in error["message"]
    assert recorder.sampling == []


def test_a_logit_bias_key_outside_the_vocabulary_is_named(gpu_repo):
    client, _ = _client(gpu_repo)
    with client:
        response = client.post("/v1/completions", json=_body(gpu_repo, logit_bias={"999999": 1}))
    assert response.status_code == 400 and "'999999'" in response.json()["error"]["message"]


def test_the_python_engines_are_told_what_to_refuse(cpu_repo, synthetic_repo):
    def refusals(repo):
        config = parse_pbtxt((repo / "tensorrt_llm" / "config.pbtxt").read_text())
        return json.loads(config.parameters["refusals"].string_value)

    synthetic = open_repository(synthetic_repo).capabilities
    assert refusals(synthetic_repo)["presence_penalty"] == [
        0.0,
        synthetic.refusal("penalties", "input presence_penalty"),
    ]
    cpu = refusals(cpu_repo)
    assert "target cpu" in cpu["beam_width"][1]
    # What the CPU engine does for real is not refused.
    for name in ("presence_penalty", "embedding_bias", "num_return_sequences", "return_log_probs"):
        assert name not in cpu
    assert "guided_decoding_guide" not in cpu and "guided_decoding_guide" in refusals(
        synthetic_repo
    )


def test_any_refusal_of_the_repository_s_models_is_a_400_whatever_its_words():
    """The API used to recognise engine refusals by a list of their wordings: any other became a 502."""
    from toolkit.api.responses import engine_error as _engine_error

    error = _engine_error(
        InferenceFailed("in ensemble 'ensemble', [refused:invalid_value] a reason never seen")
    )
    assert error.status == 400 and error.code == "invalid_value"
    assert error.message == "in ensemble 'ensemble', a reason never seen"
    assert _engine_error(InferenceFailed("CUDA error: illegal memory access")).status == 502


def test_the_text_models_refuse_what_needs_token_ids_and_pass_guides_on(cpu_repo):
    """ensemble / tensorrt_llm_bls return text: log probs, n and logit_bias need the engine contract; a guide
    needs none of it (the stock ensemble and BLS take the guided-decoding tensors)."""
    app = create_app(ApiSettings(UNREACHABLE, cpu_repo, model_name="ensemble"))
    calls = []

    async def generate(prompt, prompt_ids, max_tokens, sampling, **kw):
        calls.append(kw.get("features"))
        yield Piece(b"{}", None, True)

    app.state.api.backend.generate = generate
    model = open_repository(cpu_repo).served_model_name
    chat = {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    with TestClient(app, raise_server_exceptions=False) as client:
        for field, value in (("logprobs", True), ("n", 2), ("logit_bias", {"3": 1})):
            response = client.post("/v1/chat/completions", json={**chat, field: value})
            assert response.status_code == 400, response.text
            error = response.json()["error"]
            assert error["param"] == field and "--model-name tensorrt_llm" in error["message"]
        fine = {**chat, "top_logprobs": 0, "response_format": {"type": "json_object"}}
        assert client.post("/v1/chat/completions", json=fine).status_code == 200
    assert len(calls) == 1 and calls[0].guide.type == "json" and not calls[0].cached_tokens
