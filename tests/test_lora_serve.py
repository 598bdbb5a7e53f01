"""LoRA adapters end to end (issue 19's done-when): a CPU repository built with two adapters made here with peft
(weights that change the greedy answer), served by real tritonserver. Per adapter the greedy tokens equal
transformers + peft's on the same prompts, the base model's are unchanged, a mixed concurrent load of base and both
adapters gives each request its own answer; the same through the `openai` client, by model name (and through the
ensemble's text API)."""

from __future__ import annotations

import itertools
import queue
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import openai
import pytest

from toolkit.api import ApiSettings, run_api_in_background
from toolkit.client.tensors import engine_inputs, infer_inputs, scalar
from toolkit.repository.reader import open_repository
from toolkit.serve.net import free_port

from lora_adapters import TWO_ADAPTERS, make_two_adapters, peft_model
from repos import launch_on_free_ports, write_test_repository
from tiny import make_tiny_checkpoint
from toy_tokenizers import byte_level_bpe

pytestmark = pytest.mark.server

NEW_TOKENS = 8
TASKS = {name: task for task, name in enumerate(TWO_ADAPTERS, start=1)}  # alpha 1, beta 2, as built
PROMPTS = (
    "The capital of France is",
    "Hello world, this is",
    "A quick brown fox",
    "Numbers 0 1 2 3",
    "café naïve",
    "symbols !?.,;:",
)
# Several KV blocks long: computed by the base model first, then asked of each adapter while its blocks are in the
# prefix cache (which must not hand them to another adapter).
LONG = " ".join([PROMPTS[0]] * 8)


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    root = tmp_path_factory.mktemp("lora-serve")
    checkpoint = make_tiny_checkpoint(root / "checkpoint")
    adapters = make_two_adapters(checkpoint, root / "adapters")
    repo = write_test_repository(
        checkpoint,
        root / "repo",
        source="hf:Tiny/Lora-Base",
        lora=tuple((name, str(path)) for name, path in adapters.items()),
        kv_block_size=16,  # LONG fills blocks the prefix cache keeps
    )
    return checkpoint, adapters, repo


@pytest.fixture(scope="module")
def server(built, tmp_path_factory):
    _, _, repo = built
    running = launch_on_free_ports(repo, tmp_path_factory.mktemp("log") / "triton.log", 180)
    yield running
    running.stop()


@pytest.fixture(scope="module")
def reference(built):
    """Greedy tokens of transformers (+ peft with one adapter), a forward pass per token: {(ids, name): tokens}."""
    import torch
    from transformers import AutoModelForCausalLM

    checkpoint, adapters, _ = built
    models = {None: AutoModelForCausalLM.from_pretrained(checkpoint, dtype=torch.float32).eval()}
    models.update({name: peft_model(checkpoint, folder) for name, folder in adapters.items()})
    cache: dict = {}

    def greedy(ids: list[int], adapter: str | None) -> list[int]:
        key = (tuple(ids), adapter)
        if key not in cache:
            tokens = list(ids)
            with torch.no_grad():
                for _ in range(NEW_TOKENS):
                    logits = models[adapter](torch.tensor([tokens])).logits
                    tokens.append(int(logits[0, -1].argmax()))
            cache[key] = tokens[len(ids) :]
        return cache[key]

    return greedy


@pytest.fixture(scope="module")
def tokenizer(built):
    from tokenizers import Tokenizer

    _, _, repo = built
    return Tokenizer.from_file(str(repo / "preprocessing" / "1" / "tokenizer" / "tokenizer.json"))


def _ids(tokenizer, text: str) -> list[int]:
    return tokenizer.encode(text, add_special_tokens=False).ids


def _stream(url: str, model: str, inputs) -> tuple[list, str | None]:
    """Every response of one streamed request (until its final one) and the error, if any."""
    import tritonclient.grpc as grpcclient

    results: queue.Queue = queue.Queue()
    responses = []
    with grpcclient.InferenceServerClient(url) as client:
        client.start_stream(callback=lambda result, error: results.put((result, error)))
        client.async_stream_infer(model, inputs, enable_empty_final_response=True)
        while True:
            result, error = results.get(timeout=120)
            if error is not None:
                client.stop_stream()
                return responses, str(error)
            responses.append(result)
            final = result.get_response().parameters.get("triton_final_response")
            if final is not None and final.bool_param:
                break
        client.stop_stream()
    return responses, None


def engine_tokens(url: str, ids: list[int], adapter: str | None) -> list[int]:
    """The engine model's greedy tokens (no end token: exactly NEW_TOKENS) on this adapter (None: base)."""
    scalars = {"end_id": -1, "streaming": True}
    if adapter is not None:
        scalars["lora_task_id"] = TASKS[adapter]
    responses, error = _stream(url, "tensorrt_llm", engine_inputs(ids, NEW_TOKENS, **scalars))
    assert error is None, error
    tokens: list[int] = []
    for result in responses:
        output = result.as_numpy("output_ids")
        if output is not None:
            length = int(result.as_numpy("sequence_length").reshape(-1)[0])
            tokens += output.reshape(-1)[:length].tolist()
    return tokens


def test_each_adapter_s_greedy_tokens_equal_transformers_peft_and_the_base_is_unchanged(
    server, reference, tokenizer
):
    for text in (LONG, *PROMPTS[:3]):
        ids = _ids(tokenizer, text)
        answers = {}
        for adapter in (None, *TASKS):
            answers[adapter] = engine_tokens(server.grpc_url, ids, adapter)
            assert answers[adapter] == reference(ids, adapter), (text, adapter)
        assert len({tuple(a) for a in answers.values()}) == 3, f"adapters must change {text!r}"


def test_a_mixed_concurrent_load_gives_each_request_its_own_answer(server, reference, tokenizer):
    work = [(text, adapter) for text in (LONG, *PROMPTS) for adapter in (None, *TASKS)] * 2
    with ThreadPoolExecutor(max_workers=12) as pool:
        answers = list(
            pool.map(
                lambda job: engine_tokens(server.grpc_url, _ids(tokenizer, job[0]), job[1]), work
            )
        )
    for (text, adapter), got in zip(work, answers, strict=True):
        assert got == reference(_ids(tokenizer, text), adapter), (text, adapter)


def test_an_unknown_task_id_and_run_time_weights_are_refused_and_the_engine_serves_on(
    server, reference, tokenizer
):
    ids = _ids(tokenizer, PROMPTS[0])
    _, error = _stream(server.grpc_url, "tensorrt_llm", engine_inputs(ids, 4, lora_task_id=9))
    assert error is not None and "[refused:lora_unknown] unknown LoRA task id 9" in error
    assert "this repository has 1 (alpha), 2 (beta)" in error
    weights = [
        *engine_inputs(ids, 4),
        *infer_inputs([("lora_weights", np.zeros((1, 2, 8), np.float16), "FP16")]),
    ]
    _, error = _stream(server.grpc_url, "tensorrt_llm", weights)
    assert error is not None and "lora_weights" in error and "--lora NAME=PATH" in error
    assert engine_tokens(server.grpc_url, ids, "beta") == reference(ids, "beta")


@pytest.mark.parametrize("model", ["ensemble", "tensorrt_llm_bls"])
def test_the_text_models_pass_run_time_adapter_weights_on_to_the_engine(server, model):
    """The CPU engine refuses them by name: that answer proves they reached it whole."""
    inputs = infer_inputs(
        [
            ("text_input", np.array([[b"hello"]], dtype=object), "BYTES"),
            scalar("max_tokens", 2, "INT32"),
            ("lora_weights", np.zeros((1, 2, 8), np.float16), "FP16"),
            ("lora_config", np.zeros((1, 2, 3), np.int32), "INT32"),
        ]
    )
    _, error = _stream(server.grpc_url, model, inputs)
    assert (
        error is not None
        and "lora_weights: this engine serves only the LoRA adapters built" in error
    )


def _until_end(tokens: list[int], ends: set[int]) -> list[int]:
    for i, token in enumerate(tokens):
        if token in ends:
            return tokens[:i]
    return tokens


@pytest.mark.parametrize("model", ["ensemble", "tensorrt_llm_bls"])
def test_the_text_models_pass_the_task_id_on(server, built, reference, tokenizer, model):
    _, _, repo = built
    tokens = open_repository(repo).tokens
    ends = {tokens.end_id, *tokens.stop_ids}
    text = PROMPTS[1]
    ids = tokenizer.encode(
        text
    ).ids  # the ensemble's preprocessing adds the tokenizer's special tokens
    inputs = infer_inputs(
        [
            ("text_input", np.array([[text.encode()]], dtype=object), "BYTES"),
            scalar("max_tokens", NEW_TOKENS, "INT32"),
            scalar("lora_task_id", TASKS["alpha"], "UINT64"),
        ]
    )
    responses, error = _stream(server.grpc_url, model, inputs)
    assert error is None, error
    got = b"".join(
        r.as_numpy("text_output").reshape(-1)[0]
        for r in responses
        if r.as_numpy("text_output") is not None
    )
    expected = _until_end(reference(ids, "alpha"), ends)
    assert got.decode("utf-8", "replace") == tokenizer.decode(expected, skip_special_tokens=True)


# --- the OpenAI API: each adapter a model id ---------------------------------------------------------
@pytest.fixture(scope="module")
def client(server, built):
    _, _, repo = built
    # as `toolkit serve` runs it: engine streams over Triton's HTTP generate_stream
    handle = run_api_in_background(
        ApiSettings(server.grpc_url, Path(repo), engine_http_url=server.http_url), port=free_port()
    )
    yield openai.OpenAI(base_url=f"{handle.url}/v1", api_key="none", max_retries=0, timeout=120)
    handle.stop()


def test_the_models_list_has_the_base_and_each_adapter_with_its_parent(client):
    models = {m.id: m for m in client.models.list().data}
    assert list(models) == ["Lora-Base", "alpha", "beta"]
    assert models["Lora-Base"].parent is None
    assert all(models[name].parent == "Lora-Base" for name in TASKS)
    assert client.models.retrieve("beta").parent == "Lora-Base"


def test_completions_by_model_name_equal_transformers_peft(client, built, reference, tokenizer):
    _, _, repo = built
    tokens = open_repository(repo).tokens
    ends = {tokens.end_id, *tokens.stop_ids}
    checked = 0
    for text in PROMPTS:
        ids = _ids(tokenizer, text)
        expected = {name: reference(ids, name) for name in (None, *TASKS)}
        if any(set(e) & ends for e in expected.values()):
            continue  # an end token inside the answer: the API would stop there (checked elsewhere)
        for name in ("Lora-Base", *TASKS):
            answer = client.completions.create(
                model=name, prompt=text, max_tokens=NEW_TOKENS, temperature=0
            )
            assert answer.model == name
            want = expected[None if name == "Lora-Base" else name]
            assert answer.choices[0].text == tokenizer.decode(want), (text, name)
        checked += 1
    assert checked >= 2, "too few prompts whose answers hold no end token"


def test_an_unknown_model_is_a_404_listing_the_valid_ids(client):
    with pytest.raises(openai.NotFoundError) as refused:
        client.completions.create(model="gamma", prompt="hi", max_tokens=2)
    message = refused.value.body["message"]
    assert "`gamma` does not exist" in message
    assert all(f"`{name}`" in message for name in ("Lora-Base", "alpha", "beta"))


# --- toolkit bench --lora-mix ------------------------------------------------------------------------------
def test_bench_spreads_a_lora_mix_and_reports_each_adapter(server, built, tmp_path):
    from toolkit.bench.sweep import LoadPoint, plan_sweep, run_sweep

    _, _, repo = built
    # The tiny tokenizer has too few whole words to build prompts from: words of a toy one, sent as text.
    syllables = itertools.product("bcdfgklmnprst", "aeiou", "bdgklmnprst")
    words = [a + b + c + "er" for a, b, c in itertools.islice(syllables, 90)]
    byte_level_bpe([" ".join(words)] * 20, vocab_size=1000).save(str(tmp_path / "tokenizer.json"))
    plan = plan_sweep(
        server.grpc_url,
        (LoadPoint("concurrency", 6),),
        input_tokens=12,
        output_tokens=6,
        out_dir=tmp_path / "bench",
        prompts=4,
        requests=24,
        repo=Path(repo),
        tokenizer=tmp_path / "tokenizer.json",
        metrics_url=server.metrics_url,
        lora_mix=("alpha", "beta", "base"),
    )
    assert plan.lora_mix == (("alpha", 1), ("beta", 2), ("base", 0))
    (point,) = run_sweep(plan).points
    assert set(point.adapters) == {"alpha", "beta", "base"}
    assert [m.requests for m in point.adapters.values()] == [8, 8, 8]
    assert sum(m.output_tokens for m in point.adapters.values()) == point.metrics.output_tokens
    total = sum(m.output_tokens_per_s for m in point.adapters.values())
    assert total == pytest.approx(point.metrics.output_tokens_per_s)


def test_bench_refuses_a_mix_name_that_is_no_adapter(built, tmp_path):
    from toolkit.bench.sweep import LoadPoint, plan_sweep
    from toolkit.errors import BenchError

    _, _, repo = built
    with pytest.raises(BenchError, match=r"gamma is not a LoRA adapter .*valid: base, alpha, beta"):
        plan_sweep(
            "127.0.0.1:1",
            (LoadPoint("concurrency", 1),),
            input_tokens=4,
            output_tokens=2,
            out_dir=tmp_path,
            repo=Path(repo),
            lora_mix=("alpha", "gamma"),
        )


# --- toolkit generate --lora -------------------------------------------------------------------------------
@pytest.mark.parametrize("with_repo", [False, True])
def test_generate_with_an_adapter_by_name(server, built, reference, tokenizer, with_repo):
    import json

    from click.testing import CliRunner

    from toolkit.cli.main import cli

    _, _, repo = built
    tokens = open_repository(repo).tokens
    text = PROMPTS[2]
    expected = _until_end(
        reference(tokenizer.encode(text).ids, "beta"), {tokens.end_id, *tokens.stop_ids}
    )
    args = [
        "generate",
        text,
        "--raw",
        "--lora",
        "beta",
        "-u",
        server.grpc_url,
        "-n",
        str(NEW_TOKENS),
    ]
    result = CliRunner().invoke(
        cli, [*args, "--json", *(["--repo", str(repo)] if with_repo else [])]
    )
    assert result.exit_code == 0, result.output
    answer = json.loads(result.output)
    assert answer["lora"] == "beta"
    assert answer["text"] == tokenizer.decode(expected, skip_special_tokens=True)


def test_generate_refuses_an_adapter_name_the_server_does_not_have(server):
    from click.testing import CliRunner

    from toolkit.cli.main import cli

    result = CliRunner().invoke(
        cli, ["generate", "hi", "--raw", "--lora", "gamma", "-u", server.grpc_url]
    )
    assert result.exit_code == 1
    assert "--lora gamma" in result.output and "its adapters: alpha, beta" in result.output
