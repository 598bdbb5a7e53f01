"""GPU repositories and the request features of the tensorrtllm backend: guided decoding's parameters and
tokenizer-info file, generation logits for top log probs. Every fact about the backend is read from the
independent upstream record (tests/data/upstream/*.json), never from the toolkit's own lists."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from toolkit.cli.main import cli
from toolkit.repository.configs import parse_pbtxt
from toolkit.repository.reader import open_repository

from fakes import fake_checkpoint, install_fake_trtllm
from tiny import make_bigram_checkpoint

UPSTREAM = Path(__file__).parent / "data" / "upstream"
BACKEND = json.loads((UPSTREAM / "triton_backend.json").read_text())
TOOLS = json.loads((UPSTREAM / "trtllm_tools.json").read_text())
PINNED = BACKEND["revisions"]["c2e65b8"]
LLAMA_8B = Path(__file__).parent / "data" / "llama-3.1-8b-instruct" / "config.json"
# The C++ types of the tokenizer-info keys, as Python's json gives them.
JSON_TYPES = {"std::vector<std::string>": (list, str), "std::string": (str, None)}


def invoke(*args: str):
    return CliRunner().invoke(cli, list(args))


@pytest.fixture(scope="module")
def gpu_repo(tmp_path_factory) -> Path:
    """An H100 repository of a Llama-3-style tokenizer (end of turn <|eot_id|>, other end ids 2 and 3), built
    by `toolkit build` through the fake TensorRT-LLM tools."""
    tmp = tmp_path_factory.mktemp("gpu")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TOOLKIT_HOME", str(tmp / "home"))
        install_fake_trtllm(mp, tmp)
        checkpoint = fake_checkpoint(tmp, LLAMA_8B)
        bigram = make_bigram_checkpoint(tmp / "bigram")
        for name in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
            shutil.copy(bigram / name, checkpoint / name)
        result = invoke("build", "-t", "h100-sxm", "-m", str(checkpoint), "-o", str(tmp / "repo"))
    assert result.exit_code == 0, result.output
    return tmp / "repo"


def _engine_parameters(repo: Path) -> dict[str, str]:
    config = parse_pbtxt((repo / "tensorrt_llm" / "config.pbtxt").read_text())
    return {key: value.string_value for key, value in config.parameters.items()}


def test_the_engine_config_has_every_parameter_the_backend_reads_without_a_default(gpu_repo):
    """The backend's C++ reads these with no fallback: a config without one fails to load (failed before
    the fix: the GPU config wrote none of the three)."""
    parameters = _engine_parameters(gpu_repo)
    missing = set(PINNED["parameter_reads"]["unguarded"]) - set(parameters)
    assert not missing, f"tensorrt_llm would fail to load: no {sorted(missing)}"


def test_guided_decoding_is_on_with_an_accepted_backend_and_an_existing_info_file(gpu_repo):
    guided = PINNED["guided_decoding"]
    parameters = _engine_parameters(gpu_repo)
    backend = parameters["guided_decoding_backend"]
    path = Path(parameters["xgrammar_tokenizer_info_path"])
    assert backend in guided["accepted_backends"]
    assert backend not in guided["off_values"]["guided_decoding_backend"]
    assert path.is_absolute() and path.is_file()
    assert path.parent == gpu_repo / "tensorrt_llm" / "1"


def test_the_tokenizer_info_has_exactly_the_keys_and_types_the_backend_reads(gpu_repo):
    keys = PINNED["guided_decoding"]["tokenizer_info_keys"]
    info = json.loads(
        Path(_engine_parameters(gpu_repo)["xgrammar_tokenizer_info_path"]).read_text()
    )
    assert set(info) == set(keys)
    # The stock script writes the same three keys and no others.
    assert TOOLS["generate_xgrammar_tokenizer_info.py"]["output"]["no_other_keys"] is True
    for key, cpp_type in keys.items():
        if cpp_type.startswith("std::vector<TokenIdType"):
            assert all(isinstance(i, int) and 0 <= i < 2**31 for i in info[key]), key
            continue
        outer, inner = JSON_TYPES[cpp_type]
        assert isinstance(info[key], outer), key
        if inner is not None:
            assert all(isinstance(item, inner) for item in info[key]), key
    tokenizer = json.loads(info["tokenizer_str"])
    assert "model" in tokenizer  # the whole tokenizer.json


def test_the_tokenizer_info_lists_every_token_by_id_and_every_end_id(gpu_repo):
    from tokenizers import Tokenizer

    info = json.loads(
        Path(_engine_parameters(gpu_repo)["xgrammar_tokenizer_info_path"]).read_text()
    )
    tokenizer = Tokenizer.from_file(
        str(gpu_repo / "preprocessing" / "1" / "tokenizer" / "tokenizer.json")
    )
    assert info["encoded_vocab"] == [
        tokenizer.id_to_token(i) for i in range(tokenizer.get_vocab_size(with_added_tokens=True))
    ]
    tokens = open_repository(gpu_repo).tokens
    # <|eot_id|> (the end id) and generation_config's other end tokens: the stock script has the eos only.
    assert set(info["stop_token_ids"]) == {tokens.end_id, *tokens.stop_ids} >= {2, 3, 4}


def test_the_guided_decoding_tensors_reach_the_engine_as_the_stock_ensemble_wires_them(gpu_repo):
    ensemble = parse_pbtxt((gpu_repo / "ensemble" / "config.pbtxt").read_text())
    step = next(s for s in ensemble.ensemble_scheduling.step if s.model_name == "tensorrt_llm")
    stock = next(
        s
        for s in PINNED["models"]["ensemble"]["ensemble_steps"]
        if s["model_name"] == "tensorrt_llm"
    )
    for name in ("guided_decoding_guide_type", "guided_decoding_guide"):
        assert step.input_map[name] == stock["input_map"][name]
    engine = parse_pbtxt((gpu_repo / "tensorrt_llm" / "config.pbtxt").read_text())
    assert {"guided_decoding_guide_type", "guided_decoding_guide"} <= {i.name for i in engine.input}


def test_the_capabilities_offer_what_the_backend_honours(gpu_repo):
    capabilities = open_repository(gpu_repo).capabilities
    assert set(capabilities.guided_decoding) == {"json_object", "json_schema", "regex", "ebnf"}
    assert capabilities.logprobs and capabilities.max_n > 1
    assert not capabilities.supports("top_logprobs")
    assert "--gather-generation-logits" in capabilities.refusal("top_logprobs")


def test_the_fp8_recipe_dry_run_shows_the_guided_decoding_parameters_and_the_info_file(tmp_path):
    output = tmp_path / "repo"
    result = invoke(
        "build",
        "-r",
        "llama-3.1-8b-instruct-h100-sxm-fp8",
        "-o",
        str(output),
        "--dry-run",
        "--json",
    )
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    parameters = data["engine_parameters"]
    assert set(PINNED["parameter_reads"]["unguarded"]) <= set(parameters)
    assert parameters["guided_decoding_backend"] in PINNED["guided_decoding"]["accepted_backends"]
    assert parameters["xgrammar_tokenizer_info_path"] == str(
        output.resolve() / "tensorrt_llm" / "1" / "xgrammar_tokenizer_info.json"
    )
    assert data["repository_files"] == ["tensorrt_llm/1/xgrammar_tokenizer_info.json"]
    assert not output.exists()


def _dry_run(*extra: str) -> dict:
    result = invoke("build", "-t", "h100-sxm", "-m", str(LLAMA_8B), "--dry-run", "--json", *extra)
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_top_logprobs_need_gathered_generation_logits_whose_buffer_the_plan_counts():
    plain = _dry_run()
    gathered = _dry_run("--gather-generation-logits")
    build = gathered["commands"][-1]
    assert (
        "--gather_generation_logits" in build
        and "--gather_generation_logits" not in plain["commands"][-1]
    )
    assert "gather_generation_logits" in TOOLS["trtllm-build"]["flags"]
    # [8, max_batch_size + 1, vocab] FP32 on the GPU, out of the KV pool.
    batch, vocab = gathered["plan"]["max_batch_size"], 128256
    assert gathered["plan"]["generation_logits_bytes"] == 8 * (batch + 1) * vocab * 4
    assert plain["plan"]["generation_logits_bytes"] == 0
    assert gathered["plan"]["kv_cache_tokens"] < plain["plan"]["kv_cache_tokens"]
    assert gathered["capabilities"]["top_logprobs"] == 20
    assert gathered["capabilities"]["top_logprobs_source"] == "generation_logits"
    assert gathered["settings"]["gather_generation_logits"] is True


# --- what the OpenAI API sends a GPU engine ---------------------------------------------------------
class _Recorder:
    def __init__(self):
        self.calls = []

    async def generate(self, prompt, prompt_ids, max_tokens, sampling, **kw):
        from toolkit.api.triton import Piece

        self.calls.append((prompt_ids, max_tokens, sampling, kw.get("features")))
        yield Piece(b"{}", 1, True)


def _api(repo: Path):
    from fastapi.testclient import TestClient

    from toolkit.api.app import ApiSettings, create_app

    app = create_app(ApiSettings("127.0.0.1:1", repo))
    recorder = _Recorder()
    app.state.api.backend.generate = recorder.generate
    return TestClient(app, raise_server_exceptions=False), recorder, app.state.api


def _say_hi(client, repo: Path, **body):
    """POST /v1/chat/completions: one user message "hi" to the repository's model, `body` added."""
    model = open_repository(repo).served_model_name
    chat = {"model": model, "messages": [{"role": "user", "content": "hi"}]}
    return client.post("/v1/chat/completions", json={**chat, **body})


def test_the_api_sends_the_backend_s_own_tensors_each_declared_upstream(gpu_repo):
    """Structured output, log probs and n reach a GPU engine as the stock inputs, under the backend's guide
    type names, and the outputs asked for are the stock ones: each checked against the upstream record."""
    client, recorder, state = _api(gpu_repo)
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    with client:
        response = _say_hi(
            client,
            gpu_repo,
            max_tokens=4,
            n=2,
            logprobs=True,
            response_format={"type": "json_schema", "json_schema": {"name": "a", "schema": schema}},
        )
        assert response.status_code == 200, response.text
        prompt_ids, max_tokens, sampling, features = recorder.calls[0]
        request = state.backend._engine_request(prompt_ids, max_tokens, sampling, features)
    sent = {i.name: i for i in request.inputs}  # the ModelInferRequest the API sends
    stock_inputs = {t["name"]: t for t in PINNED["models"]["tensorrt_llm"]["inputs"]}
    for name, tensor in sent.items():
        assert name in stock_inputs, f"{name} is no input of the stock tensorrt_llm"
        stock_type = stock_inputs[name]["data_type"]
        assert tensor.datatype == ("BYTES" if stock_type == "STRING" else stock_type), name
    assert {"guided_decoding_guide_type", "guided_decoding_guide", "return_log_probs"} <= set(sent)
    assert {"num_return_sequences", "return_perf_metrics"} <= set(sent)
    stock_outputs = {t["name"] for t in PINNED["models"]["tensorrt_llm"]["outputs"]}
    asked = {o.name for o in request.outputs}
    assert asked <= stock_outputs and {"output_log_probs", "sequence_index"} <= asked
    # a type the backend maps (an unknown one it would silently ignore: the request would run unconstrained)
    assert features.guide.type in PINNED["guided_decoding"]["guide_types"]
    assert json.loads(features.guide.text) == schema


def test_top_logprobs_on_an_engine_without_generation_logits_is_a_400_naming_the_setting(gpu_repo):
    client, recorder, _ = _api(gpu_repo)
    with client:
        response = _say_hi(client, gpu_repo, logprobs=True, top_logprobs=2)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == "top_logprobs" and "--gather-generation-logits" in error["message"]
    assert "target h100-sxm" in error["message"] and recorder.calls == []


def test_top_logprobs_from_generation_logits_are_their_log_softmax():
    """A GPU engine built with --gather-generation-logits returns raw logits; the API reduces them."""
    import numpy as np

    from toolkit.api.features import Features, token_logprobs

    features = Features(logprobs=True, top_logprobs=2, top_from_logits=True)
    assert {"generation_logits", "output_log_probs"} <= set(features.outputs())
    names = {name for name, _, _ in features.tensors({})}
    assert "return_generation_logits" in names and "num_top_logprobs" not in names
    logits = np.array([[[[2.0, 0.0, 1.0, -1.0]]]], np.float32)  # [1, 1, beam 1, vocab 4]: one step
    outputs = {"output_log_probs": np.array([[[-0.4]]], np.float32), "generation_logits": logits}
    (entry,) = token_logprobs(outputs, [0], 2)
    expected = logits.reshape(-1) - np.log(np.exp(logits.reshape(-1)).sum())
    assert entry.token == 0 and abs(entry.logprob + 0.4) < 1e-6
    assert [i for i, _ in entry.top] == [0, 2]
    assert all(abs(v - expected[i]) < 1e-6 for i, v in entry.top)


@pytest.mark.parametrize("revision, version", [("v0.17.0", "0.17.0"), ("v0.18.2", "0.18.2")])
def test_engines_of_releases_without_guided_decoding_get_none_of_it(revision, version, tmp_path):
    """Before 0.19 the backend has neither the guided inputs nor the parameters: none is declared (a guided
    input an engine does not have would be refused by Triton, or passed on by the BLS and dropped)."""
    from toolkit.repository import configs
    from toolkit.repository import contract as c
    from toolkit.targets.gpu import guided_decoding_parameters

    stock = BACKEND["revisions"][revision]["models"]
    assert guided_decoding_parameters(tmp_path, version) == {}
    assert "tokenizer_dir" not in stock["tensorrt_llm"]["parameters"]
    engine_stock = {t["name"] for t in stock["tensorrt_llm"]["inputs"]}
    assert {t.name for t in c.engine_inputs(version)} <= engine_stock
    # The text models keep the pinned names of renamed inputs (and map them to the engine's): left aside.
    renamed = set(c.engine_renames(version))
    ensemble = {i.name for i in configs.ensemble_model(8, version).input} - renamed
    assert ensemble <= {t["name"] for t in stock["ensemble"]["inputs"]}
    bls = {t.name for t in c.text_inputs(version, bls=True)} - renamed
    assert bls <= {t["name"] for t in stock["tensorrt_llm_bls"]["inputs"]}
    left_out = {t.name for t in c.ENGINE_INPUTS if not c.has_input(t.name, version)}
    assert left_out == {"guided_decoding_guide_type", "guided_decoding_guide"}
