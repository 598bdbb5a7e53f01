"""The CPU repository served by a real tritonserver: correctness against transformers, streaming, load, bad input."""

from __future__ import annotations

import queue
import threading
import time
import urllib.request

import pytest
import torch

from toolkit.client.chat import template_from_repository
from toolkit.client.generate import GenerateRequest, generate_grpc, generate_http
from toolkit.client.tensors import engine_inputs
from toolkit.errors import ClientError

pytestmark = pytest.mark.server

QUESTIONS = [
    "What is the capital of France?",
    "Name three primary colors.",
    "Write one sentence about the ocean.",
    "What is 12 plus 7?",
]


def chat(served_repo, question: str) -> str:
    return template_from_repository(served_repo.repo).render(
        [{"role": "user", "content": question}]
    )


def capital_of_france(served_repo) -> str:
    """The engine's answer (16 tokens) to QUESTIONS[0]: it names Paris while the engine is well."""
    request = GenerateRequest(prompt=chat(served_repo, QUESTIONS[0]), max_tokens=16)
    return generate_grpc(served_repo.grpc_url, request).text


def reference_ids(reference_model, prompt: str, max_tokens: int) -> list[int]:
    model, tokenizer = reference_model
    ids = tokenizer(prompt, add_special_tokens=False, return_tensors="pt")["input_ids"]
    with torch.no_grad():
        out = model.generate(
            ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_tokens, do_sample=False
        )
    generated = out[0, ids.shape[1] :].tolist()
    end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    return generated[: generated.index(end)] if end in generated else generated


@pytest.mark.parametrize("question", QUESTIONS)
def test_greedy_tokens_equal_transformers_generate(served_repo, reference_model, question):
    """The engine model itself, token ids in and out, against transformers' generate."""
    import tritonclient.grpc as grpcclient

    prompt = chat(served_repo, question)
    _, tokenizer = reference_model
    ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
    expected = reference_ids(reference_model, prompt, 24)
    inputs = engine_inputs(ids, 24)
    results: queue.Queue = queue.Queue()
    with grpcclient.InferenceServerClient(served_repo.grpc_url) as client:
        client.start_stream(callback=lambda result, error: results.put((result, error)))
        client.async_stream_infer("tensorrt_llm", inputs)
        result, error = results.get(timeout=120)
        client.stop_stream()
    assert error is None, error
    length = int(result.as_numpy("sequence_length").reshape(-1)[0])
    assert result.as_numpy("output_ids").reshape(-1)[:length].tolist() == expected


def _engine_tokens(url: str, ids: list[int], max_tokens: int, **scalars) -> list[int]:
    import tritonclient.grpc as grpcclient

    results: queue.Queue = queue.Queue()
    with grpcclient.InferenceServerClient(url) as client:
        client.start_stream(callback=lambda result, error: results.put((result, error)))
        client.async_stream_infer("tensorrt_llm", engine_inputs(ids, max_tokens, **scalars))
        result, error = results.get(timeout=120)
        client.stop_stream()
    assert error is None, error
    length = int(result.as_numpy("sequence_length").reshape(-1)[0])
    return result.as_numpy("output_ids").reshape(-1)[:length].tolist()


def test_temperature_alone_is_greedy_as_in_tensorrt_llm(served_repo, reference_model):
    """TensorRT-LLM samples only with top_k > 1 or top_p > 0: NVIDIA's end-to-end client sends
    temperature 1.0 and nothing else and gets greedy text; top_k 1 is argmax too."""
    prompt = chat(served_repo, QUESTIONS[1])
    _, tokenizer = reference_model
    ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
    expected = reference_ids(reference_model, prompt, 16)
    for scalars in (
        {"temperature": 1.0, "seed": 1},
        {"temperature": 1.7, "seed": 2},
        {"temperature": 1.0, "runtime_top_k": 1, "runtime_top_p": 0.0, "seed": 3},
    ):
        assert _engine_tokens(served_repo.grpc_url, ids, 16, **scalars) == expected, scalars
    sampled = {
        tuple(
            _engine_tokens(
                served_repo.grpc_url, ids, 16, temperature=1.5, runtime_top_p=1.0, seed=s
            )
        )
        for s in (1, 2, 3)
    }
    assert len(sampled) > 1  # top_p > 0 does sample


def test_a_stream_interval_answers_the_first_token_then_every_interval_with_the_same_tokens(
    served_repo, reference_model
):
    """The stream_interval request parameter (--stream-interval): responses at tokens 1, 4, 8 and the last,
    the tokens unchanged; a value out of range is refused naming it."""
    import tritonclient.grpc as grpcclient

    prompt = chat(served_repo, QUESTIONS[0])
    _, tokenizer = reference_model
    ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
    # the same request in one response: the tokens the interval must not change (min_tokens runs past the end)
    expected = _engine_tokens(served_repo.grpc_url, ids, 10, min_tokens=10)
    results: queue.Queue = queue.Queue()
    inputs = engine_inputs(ids, 10, streaming=True, min_tokens=10)
    with grpcclient.InferenceServerClient(served_repo.grpc_url) as client:
        client.start_stream(callback=lambda result, error: results.put((result, error)))
        client.async_stream_infer(
            "tensorrt_llm",
            inputs,
            enable_empty_final_response=True,
            parameters={"stream_interval": 4},
        )
        pieces = []
        while True:
            result, error = results.get(timeout=120)
            assert error is None, error
            if result.as_numpy("output_ids") is not None:
                pieces.append(result.as_numpy("output_ids").reshape(-1).tolist())
            if result.get_response().parameters["triton_final_response"].bool_param:
                break
        client.async_stream_infer("tensorrt_llm", inputs, parameters={"stream_interval": 0})
        _, refused = results.get(timeout=120)
        client.stop_stream()
    assert [len(p) for p in pieces] == [1, 3, 4, 2]
    assert [t for p in pieces for t in p] == expected
    assert refused is not None and "stream_interval=0" in str(refused)


@pytest.mark.parametrize("question", QUESTIONS[:3])
def test_text_over_grpc_streaming_and_http_equals_reference(served_repo, reference_model, question):
    prompt = chat(served_repo, question)
    _, tokenizer = reference_model
    expected = tokenizer.decode(
        reference_ids(reference_model, prompt, 32), skip_special_tokens=True
    )
    request = GenerateRequest(prompt=prompt, max_tokens=32)
    streamed = generate_grpc(served_repo.grpc_url, request)
    assert streamed.text == expected
    assert len(streamed.pieces) > 1  # really streamed, piece by piece
    assert generate_grpc(served_repo.grpc_url, request, stream=False).text == expected
    assert generate_http(served_repo.http_url, request).text == expected
    assert generate_grpc(served_repo.grpc_url, request, model="tensorrt_llm_bls").text == expected


def test_bls_serves_a_short_request_while_a_long_one_runs(served_repo):
    """The BLS model blocks a thread per request while it waits for the engine; one long generation
    must not hold up the others (it once served one request at a time)."""
    prompt = chat(served_repo, "Count from one to one hundred in words.")
    done: dict = {}

    def long_request():
        done["long"] = generate_grpc(
            served_repo.grpc_url,
            GenerateRequest(prompt=prompt, max_tokens=200, min_tokens=200),
            model="tensorrt_llm_bls",
        )
        done["long_at"] = time.monotonic()

    runner = threading.Thread(target=long_request)
    runner.start()
    time.sleep(1.0)  # the long request is generating
    short = generate_grpc(
        served_repo.grpc_url,
        GenerateRequest(prompt=chat(served_repo, QUESTIONS[0]), max_tokens=8),
        model="tensorrt_llm_bls",
    )
    short_at = time.monotonic()
    runner.join(timeout=300)
    assert "Paris" in short.text
    assert short_at < done["long_at"], "the short request waited for the long one"


def test_sixteen_concurrent_streams_all_complete_with_the_right_text(served_repo):
    prompts = [chat(served_repo, QUESTIONS[i % len(QUESTIONS)]) for i in range(16)]
    alone = {
        p: generate_grpc(served_repo.grpc_url, GenerateRequest(prompt=p, max_tokens=24)).text
        for p in set(prompts)
    }
    results: dict[int, str] = {}
    errors: list[Exception] = []

    def run(index: int) -> None:
        try:
            results[index] = generate_grpc(
                served_repo.grpc_url, GenerateRequest(prompt=prompts[index], max_tokens=24)
            ).text
        except Exception as exc:  # noqa: BLE001 - collected and reported below
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(16)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=300)
    assert not errors
    assert len(results) == 16
    for index, text in results.items():
        assert text == alone[prompts[index]], f"stream {index} differs under load"


def test_streamed_pieces_concatenate_to_the_full_text_with_multibyte_characters(served_repo):
    prompt = chat(served_repo, "Repeat exactly: café 🎉🎉 日本語 — naïve résumé 😀")
    request = GenerateRequest(prompt=prompt, max_tokens=40)
    streamed = generate_grpc(served_repo.grpc_url, request)
    whole = generate_grpc(served_repo.grpc_url, request, stream=False)
    assert "".join(streamed.pieces) == streamed.text == whole.text
    assert "\ufffd" not in streamed.text


def test_same_seed_same_sample_even_under_load(served_repo):
    prompt = chat(served_repo, "Write a short poem about rain.")
    request = GenerateRequest(prompt=prompt, max_tokens=24, temperature=1.0, top_p=0.95, seed=1234)
    first = generate_grpc(served_repo.grpc_url, request).text
    background = threading.Thread(
        target=generate_grpc,
        args=(served_repo.grpc_url, GenerateRequest(prompt=prompt, max_tokens=48, temperature=1.0)),
    )
    background.start()
    second = generate_grpc(served_repo.grpc_url, request).text
    background.join(timeout=120)
    other_seed = {
        generate_grpc(
            served_repo.grpc_url,
            GenerateRequest(prompt=prompt, max_tokens=24, temperature=1.0, top_p=0.95, seed=s),
        ).text
        for s in (1, 2, 3)
    }
    assert first == second
    assert len(other_seed | {first}) > 1  # it really samples


@pytest.mark.parametrize("seed", [None, 7])
def test_a_vanishing_temperature_decodes_greedily_instead_of_killing_the_engine(served_repo, seed):
    """logits / 6e-43 overflows float32 to NaN probabilities, and a NaN draw once killed the
    engine's generation loop for every later request (CI, found by the API fuzzer)."""
    prompt = chat(served_repo, QUESTIONS[0])
    greedy = generate_grpc(served_repo.grpc_url, GenerateRequest(prompt=prompt, max_tokens=16)).text
    tiny = GenerateRequest(
        prompt=prompt, max_tokens=16, temperature=6.02e-43, top_k=50, top_p=0.9, seed=seed
    )
    assert generate_grpc(served_repo.grpc_url, tiny).text == greedy
    assert (
        generate_grpc(served_repo.grpc_url, GenerateRequest(prompt=prompt, max_tokens=16)).text
        == greedy
    )


def test_stop_words_end_generation(served_repo):
    prompt = chat(served_repo, QUESTIONS[0])
    full = generate_grpc(served_repo.grpc_url, GenerateRequest(prompt=prompt, max_tokens=32)).text
    assert "Paris" in full
    stopped = generate_grpc(
        served_repo.grpc_url, GenerateRequest(prompt=prompt, max_tokens=32, stop_words=(" Paris",))
    ).text
    assert stopped == full[: full.index(" Paris") + len(" Paris")]


def test_min_tokens_forces_the_output_length(served_repo):
    import tritonclient.grpc as grpcclient  # noqa: F401 - the grpc extra must be present

    prompt = chat(served_repo, QUESTIONS[0])
    result = generate_grpc(
        served_repo.grpc_url, GenerateRequest(prompt=prompt, max_tokens=20, min_tokens=20)
    )
    assert len(result.pieces) >= 10  # "The capital of France is Paris." alone is 8 tokens


@pytest.mark.parametrize(
    ("request_args", "message"),
    [
        ({"max_tokens": 0}, "max_tokens=0 must be at least 1"),
        ({"max_tokens": 5000}, "ask for at most"),
        ({"prompt": "word " * 700, "max_tokens": 8}, "max_input_len of 512"),
        ({"prompt": "", "max_tokens": 8}, "prompt must hold at least one token"),
    ],
)
def test_bad_requests_get_a_clear_error_and_the_server_keeps_serving(
    served_repo, request_args, message
):
    args = {"prompt": "hello", **request_args}
    request = GenerateRequest(**args)
    # skip the client's own check: the server must refuse too
    object.__setattr__(request, "validate", lambda: None)
    with pytest.raises(ClientError, match=message.replace("(", r"\(")):
        generate_grpc(served_repo.grpc_url, request)
    with pytest.raises(ClientError, match=message.replace("(", r"\(")):
        generate_http(served_repo.http_url, request)
    assert "Paris" in capital_of_france(served_repo)


def _engine_error(served_repo, tensors) -> str | None:
    """Send raw tensors to tensorrt_llm over a gRPC stream; the error message of its final response, if any."""
    import tritonclient.grpc as grpcclient

    from toolkit.client.tensors import infer_inputs

    answers: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(served_repo.grpc_url)
    client.start_stream(callback=lambda result, error: answers.put((result, error)))
    try:
        client.async_stream_infer(
            "tensorrt_llm", infer_inputs(tensors), enable_empty_final_response=True
        )
        while True:
            result, error = answers.get(timeout=60)
            if error is not None:
                return error.message()
            if result.get_response().parameters["triton_final_response"].bool_param:
                return None
    finally:
        client.stop_stream()
        client.close()


@pytest.mark.parametrize(
    "change, message",
    [
        (
            {"input_ids": [[1, 9690, 49152]]},
            "token id 49152, outside this model's vocabulary [0, 49152)",
        ),
        ({"input_ids": [[1, -5, 198]]}, "token id -5"),
        ({"input_lengths": [[0]]}, "input_lengths 0 must be between 1 and the 3 ids"),
        ({"input_lengths": [[7]]}, "input_lengths 7 must be between 1 and the 3 ids"),
        (
            {
                "input_ids": [[1, 9690, 198], [1, 9690, 198]],
                "input_lengths": [[3], [3]],
                "request_output_len": [[4], [4]],
                "streaming": [[True], [True]],
            },
            "batch of 2 prompts",
        ),
        # An end id past the vocabulary failed the whole generation step of a guided request (its mask
        # indexed it), and every other request in the step with it.
        (
            {"end_id": [[49152]], "guided_decoding_guide_type": [[b"json"]]},
            "end_id 49152 is outside this model's vocabulary [0, 49152)",
        ),
        (
            {"end_id": [[-1]], "guided_decoding_guide_type": [[b"json"]]},
            "a guided request needs an end id",
        ),
    ],
)
def test_malformed_engine_requests_are_refused_without_hurting_the_engine(
    served_repo, change, message
):
    """Raw clients of tensorrt_llm can send ids no tokenizer makes; they once crashed the whole generation step."""
    import numpy as np

    tensors = {
        "input_ids": [[1, 9690, 198]],
        "input_lengths": [[3]],
        "request_output_len": [[4]],
        "streaming": [[True]],
        **change,
    }
    dtypes = {
        "input_ids": "INT32",
        "input_lengths": "INT32",
        "request_output_len": "INT32",
        "streaming": "BOOL",
        "end_id": "INT32",
        "guided_decoding_guide_type": "BYTES",
    }
    numpy_types = {"INT32": np.int32, "BOOL": bool, "BYTES": np.object_}
    sent = [
        (name, np.array(value, dtype=numpy_types[dtypes[name]]), dtypes[name])
        for name, value in tensors.items()
    ]
    error = _engine_error(served_repo, sent)
    assert error is not None and message in error, error
    assert "Paris" in capital_of_france(served_repo)


def _metric(served_repo, name: str) -> float:
    with urllib.request.urlopen(served_repo.metrics_url, timeout=5) as response:
        for line in response.read().decode().splitlines():
            if line.startswith(name):
                return float(line.rsplit(" ", 1)[1])
    return 0.0


def test_a_client_that_goes_away_cancels_its_request(served_repo):
    """Cancellation reaches the engine for requests sent to tensorrt_llm directly (Triton 2.51's
    ensemble and BLS do not forward a client's cancellation to the models they call)."""
    import tritonclient.grpc as grpcclient

    before = _metric(served_repo, "toolkit_engine_requests_cancelled_total")
    pieces: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(served_repo.grpc_url)
    client.start_stream(callback=lambda result, error: pieces.put((result, error)))
    inputs = engine_inputs([1, 9690, 198, 19556, 549], 250, streaming=True, min_tokens=250)
    client.async_stream_infer("tensorrt_llm", inputs)
    for _ in range(3):
        assert pieces.get(timeout=60)[1] is None
    client.stop_stream(cancel_requests=True)
    client.close()
    deadline = time.monotonic() + 20
    while (
        _metric(served_repo, "toolkit_engine_requests_cancelled_total") <= before
        and time.monotonic() < deadline
    ):
        time.sleep(0.2)
    assert _metric(served_repo, "toolkit_engine_requests_cancelled_total") == before + 1
    generated = _metric(served_repo, "toolkit_engine_generated_tokens_total")
    time.sleep(1.0)
    # it stopped generating
    assert _metric(served_repo, "toolkit_engine_generated_tokens_total") == generated
    assert "Paris" in capital_of_france(served_repo)


def test_toolkit_generate_answers_paris_over_grpc_and_http(served_repo):
    from click.testing import CliRunner

    from toolkit.cli.main import cli

    for args in (["-u", served_repo.grpc_url], ["-p", "http", "-u", served_repo.http_url]):
        result = CliRunner().invoke(cli, ["generate", "What is the capital of France?", *args])
        assert result.exit_code == 0, result.output
        assert "Paris" in result.stdout
    result = CliRunner().invoke(cli, ["generate", "hi", "-u", served_repo.grpc_url, "-n", "5000"])
    assert result.exit_code == 1
    assert (
        "max_tokens=5000 is over this engine's limit" in result.output
        and "fix: lower --max-tokens" in result.output
    )


def test_the_cpu_engine_leaves_a_core_for_the_rest_of_the_server(served_repo):
    """--num-threads 0 (the default) meant torch's default, every core: on a busy 2-core host the
    engine ran several times slower at 2 threads than at 1, behind Triton, pre/postprocessing and the API."""
    import os

    log = (served_repo.home / "tritonserver-test.log").read_text(errors="replace")
    expected = max(1, len(os.sched_getaffinity(0)) - 1)
    assert f"tensorrt_llm (CPU): {expected} torch threads" in log, log[-2000:]
