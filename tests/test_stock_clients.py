"""NVIDIA's stock clients' access patterns, written by us (CI cannot fetch their scripts), against real
tritonserver serving a Llama-3-style checkpoint made in the test (tests/tiny.py: its next token is a
fixed function of the last one, so every answer and every end token is known in advance).

Patterns reproduced, each from the tensorrtllm_backend source at the last revision with all_models/:
- end_to_end_grpc_client.py: gRPC stream to `ensemble`/`tensorrt_llm_bls`, temperature 1.0 and no
  top_k/top_p (greedy in TensorRT-LLM), reads `text_output` as `output[0].decode("utf-8")`.
- inflight_batcher_llm_client.py: token ids to `tensorrt_llm`, `--stop-after-ms N --request-id ID`
  (a second request carrying `stop` and the same id), and its unary path without --streaming.
- tools/inflight_batcher_llm/end_to_end_test.py: unary infer over HTTP and gRPC through
  preprocessing -> tensorrt_llm -> postprocessing, passing preprocessing's outputs on unchanged, and
  comparing with `ensemble` and `tensorrt_llm_bls`.
"""

from __future__ import annotations

import contextlib
import queue
import threading
import time

import numpy as np
import pytest

from toolkit.client.tensors import engine_tensors, infer_inputs, scalar
from toolkit.serve.net import free_port

from repos import launch_on_free_ports, write_test_repository
from tiny import make_bigram_checkpoint

pytestmark = pytest.mark.server

# prompt word -> the text the model answers and the end token it ends on
ANSWERS = {
    "stop1": " one",  # <|eot_id|>: the tokenizer's eos_token, the end_id
    "stop2": " two",  # <|end_of_text|>: in generation_config's eos list, a default stop word
    "stop3": " three",  # <|eom_id|>: likewise
}


def _serve(root, decoupled: bool):

    checkpoint = root / "checkpoint"
    if not checkpoint.exists():
        make_bigram_checkpoint(checkpoint)
    repo = write_test_repository(
        checkpoint,
        root / f"repo-{decoupled}",
        decoupled=decoupled,
        max_input_len=64,
        max_output_len=2000,
        max_seq_len=2064,
        kv_cache_tokens=8192,
    )
    server = launch_on_free_ports(repo, root / f"server-{decoupled}.log", 180)
    return repo, server


@pytest.fixture(scope="module")
def bigram_root(tmp_path_factory):
    return tmp_path_factory.mktemp("bigram")


@pytest.fixture(scope="module")
def streaming_server(bigram_root):
    repo, server = _serve(bigram_root, decoupled=True)
    yield repo, server
    server.stop()


@pytest.fixture(scope="module")
def unary_server(bigram_root):
    repo, server = _serve(bigram_root, decoupled=False)
    yield repo, server
    server.stop()


def _text_inputs(prompt: str, max_tokens: int, stream: bool, **extra):
    """end_to_end_grpc_client.py's prepare_inputs: every tensor [1, 1], temperature 1.0, no top_k/top_p."""
    tensors = [
        ("text_input", np.array([[prompt]], dtype=object), "BYTES"),
        scalar("max_tokens", max_tokens, "INT32"),
        scalar("stream", stream, "BOOL"),
        scalar("beam_width", 1, "INT32"),
        scalar("temperature", 1.0, "FP32"),
    ]
    for name, words in extra.items():
        tensors.append((name, np.array([words], dtype=object), "BYTES"))
    return infer_inputs(tensors)


def _stream_text(url: str, model: str, prompt: str, *, stream: bool, max_tokens: int = 12, **extra):
    """The end-to-end client's run: start_stream, async_stream_infer, stop_stream (which returns once the
    server has ended every request on the stream), then output[0].decode("utf-8") of each response."""
    import tritonclient.grpc as grpcclient

    results: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(url)
    client.start_stream(callback=lambda result, error: results.put((result, error)))
    client.async_stream_infer(
        model, _text_inputs(prompt, max_tokens, stream, **extra), request_id="7"
    )
    finished = threading.Event()
    closer = threading.Thread(target=lambda: (client.stop_stream(), finished.set()), daemon=True)
    closer.start()
    assert finished.wait(60), f"{model}: the stream did not end within 60 s"
    client.close()
    text, shapes = "", set()
    while not results.empty():
        result, error = results.get()
        assert error is None, error
        output = result.as_numpy("text_output")
        shapes.add(output.shape)
        text += output[0].decode("utf-8")  # the stock client's indexing: a flat [1] per request
    return text, shapes


@pytest.mark.parametrize("model", ["ensemble", "tensorrt_llm_bls"])
@pytest.mark.parametrize("stream", [True, False])
@pytest.mark.parametrize(("word", "answer"), sorted(ANSWERS.items()))
def test_end_to_end_client_reads_flat_text_and_every_end_token_stops(
    streaming_server, model, stream, word, answer
):
    _, server = streaming_server
    text, shapes = _stream_text(server.grpc_url, model, word, stream=stream)
    assert shapes == {(1,)}
    assert text == answer  # ended on its end token: no " junk" after it, nothing special printed


def test_chat_template_answer_ends_on_the_turn_end(streaming_server):
    from toolkit.client.chat import template_from_repository

    repo, server = streaming_server
    prompt = template_from_repository(repo).render([{"role": "user", "content": "hello"}])
    text, _ = _stream_text(server.grpc_url, "ensemble", prompt, stream=True)
    assert text == " hello world"


def test_min_tokens_generates_past_the_default_stop_words(streaming_server):
    """min_tokens > 0: preprocessing leaves out the default stop words and the engine masks end_id until then."""
    import tritonclient.grpc as grpcclient

    _, server = streaming_server
    tensors = [
        ("text_input", np.array([["stop2"]], dtype=object), "BYTES"),
        scalar("max_tokens", 6, "INT32"),
        scalar("min_tokens", 6, "INT32"),
    ]
    results: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(server.grpc_url)
    client.start_stream(callback=lambda result, error: results.put((result, error)))
    try:
        client.async_stream_infer("ensemble", infer_inputs(tensors))
        result, error = results.get(timeout=60)
        assert error is None, error
        text = result.as_numpy("text_output")[0].decode()
    finally:
        client.stop_stream()
        client.close()
    assert text.startswith(" two") and len(text) > len(" two")


def _engine_stream(url: str, prompt_ids, max_tokens, request_id: str, **scalars):
    import tritonclient.grpc as grpcclient

    results: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(url)
    client.start_stream(callback=lambda result, error: results.put((result, error)))
    client.async_stream_infer(
        "tensorrt_llm",
        infer_inputs(engine_tensors(prompt_ids, max_tokens, **scalars)),
        request_id=request_id,
        enable_empty_final_response=True,
    )
    return client, results


def test_stop_after_ms_with_a_request_id_stops_the_running_request(streaming_server):
    """inflight_batcher_llm_client.py --stop-after-ms 200 --request-id 42 --streaming (2000 tokens take seconds)."""
    repo, server = streaming_server
    loop = _token_id(repo, "▁loop")
    client, results = _engine_stream(server.grpc_url, [1, loop], 2000, "42", streaming=True)
    stopper, stop_results = None, None
    try:
        first, error = results.get(timeout=60)
        assert error is None, error
        time.sleep(0.2)
        # prepare_stop_signals: input_ids [1,1], input_lengths [[0]], request_output_len [[0]], stop [[True]]
        stopper, stop_results = _engine_stream(server.grpc_url, [0], 0, "42", stop=True)
        stop_answer, stop_error = stop_results.get(timeout=30)
        assert stop_error is None, stop_error
        assert stop_answer.as_numpy("output_ids") is None  # "Got cancellation response from server"
        tokens, started = 0, time.monotonic()
        while True:
            result, error = results.get(timeout=30)
            assert error is None, error  # a stopped request ends normally, with what it generated
            ids = result.as_numpy("output_ids")
            tokens += 0 if ids is None else ids.shape[-1]
            if result.get_response().parameters["triton_final_response"].bool_param:
                break
        assert time.monotonic() - started < 10
        # the first response held one token: it stopped short of max_tokens
        assert tokens + 1 < 2000
    finally:
        for c in (client, stopper):
            if c is not None:
                c.stop_stream()
                c.close()


def test_a_stop_without_a_request_id_is_an_error(streaming_server):
    _, server = streaming_server
    client, results = _engine_stream(server.grpc_url, [0], 0, "", stop=True)
    try:
        _, error = results.get(timeout=30)
        assert error is not None and "request ID is not provided" in str(error)
    finally:
        client.stop_stream()
        client.close()


def _token_id(repo, token: str) -> int:
    import json

    vocab = json.loads((repo / "preprocessing/1/tokenizer/tokenizer.json").read_text())["model"][
        "vocab"
    ]
    return vocab[token]


# --- a --no-decoupled repository: unary ModelInfer and HTTP infer ---------------------------------


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_end_to_end_test_pattern_over_unary_infer(unary_server, protocol):
    """end_to_end_test.py: preprocessing -> tensorrt_llm -> postprocessing by hand equals ensemble and BLS."""
    if protocol == "http":
        import tritonclient.http as tc

        url = unary_server[1].http_url.removeprefix("http://")
    else:
        import tritonclient.grpc as tc

        url = unary_server[1].grpc_url
    client = tc.InferenceServerClient(url)

    def infer(model, tensors, outputs):
        inputs = []
        for name, array, dtype in tensors:
            item = tc.InferInput(name, list(array.shape), dtype)
            item.set_data_from_numpy(array)
            inputs.append(item)
        result = client.infer(
            model, inputs, request_id="1", outputs=[tc.InferRequestedOutput(n) for n in outputs]
        )
        return {name: result.as_numpy(name) for name in outputs}

    words = np.array([[""]], dtype=object)
    pre = infer(
        "preprocessing",
        [
            ("QUERY", np.array([["stop3"]], dtype=object), "BYTES"),
            ("REQUEST_OUTPUT_LEN", np.array([[8]], dtype=np.int32), "INT32"),
            ("BAD_WORDS_DICT", words, "BYTES"),
            ("STOP_WORDS_DICT", words, "BYTES"),
        ],
        [
            "INPUT_ID",
            "REQUEST_INPUT_LEN",
            "REQUEST_OUTPUT_LEN",
            "DECODER_INPUT_ID",
            "OUT_END_ID",
            "OUT_PAD_ID",
            "STOP_WORDS_IDS",
        ],
    )
    engine = infer(
        "tensorrt_llm",
        [
            ("input_ids", pre["INPUT_ID"], "INT32"),
            ("decoder_input_ids", pre["DECODER_INPUT_ID"], "INT32"),
            ("input_lengths", pre["REQUEST_INPUT_LEN"], "INT32"),
            ("request_output_len", pre["REQUEST_OUTPUT_LEN"], "INT32"),
            ("end_id", pre["OUT_END_ID"], "INT32"),
            ("pad_id", pre["OUT_PAD_ID"], "INT32"),
            ("stop_words_list", pre["STOP_WORDS_IDS"], "INT32"),
        ],
        ["output_ids", "sequence_length"],
    )
    post = infer(
        "postprocessing",
        [
            ("TOKENS_BATCH", engine["output_ids"], "INT32"),
            ("SEQUENCE_LENGTH", engine["sequence_length"], "INT32"),
        ],
        ["OUTPUT"],
    )
    text_tensors = [
        ("text_input", np.array([["stop3"]], dtype=object), "BYTES"),
        ("max_tokens", np.array([[8]], dtype=np.int32), "INT32"),
        ("bad_words", words, "BYTES"),
        ("stop_words", words, "BYTES"),
    ]
    ensemble = infer("ensemble", text_tensors, ["text_output"])
    bls = infer("tensorrt_llm_bls", text_tensors, ["text_output"])
    assert (
        post["OUTPUT"].tolist() == ensemble["text_output"].tolist() == bls["text_output"].tolist()
    )
    assert ensemble["text_output"][0].decode() == " three"
    client.close()


def test_unary_engine_request_returns_every_token_in_one_response(unary_server):
    """inflight_batcher_llm_client.py without --streaming: async_infer on tensorrt_llm, one response."""
    import tritonclient.grpc as grpcclient

    repo, server = unary_server
    done: queue.Queue = queue.Queue()
    with grpcclient.InferenceServerClient(server.grpc_url) as client:
        ids = [1, _token_id(repo, "▁stop1")]
        client.async_infer(
            "tensorrt_llm",
            infer_inputs(
                engine_tensors(ids, 8, runtime_top_k=1, runtime_top_p=0.0, temperature=1.0)
            ),
            callback=lambda result, error: done.put((result, error)),
            request_id="5",
        )
        result, error = done.get(timeout=60)
    assert error is None, error
    # the end token ends the sequence without being part of it (TensorRT-LLM does not count it in sequence_length)
    assert result.as_numpy("output_ids")[0][0].tolist() == [_token_id(repo, "▁one")]
    assert result.as_numpy("sequence_length").tolist() == [[1]]


def test_streaming_on_a_unary_repository_is_refused_clearly(unary_server):
    import tritonclient.grpc as grpcclient

    _, server = unary_server
    results: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(server.grpc_url)
    client.start_stream(callback=lambda result, error: results.put((result, error)))
    try:
        client.async_stream_infer("ensemble", _text_inputs("stop1", 8, True))
        _, error = results.get(timeout=60)
    finally:
        client.stop_stream()
        client.close()
    assert error is not None and "--no-decoupled" in str(error)


def test_toolkit_generate_works_on_a_unary_repository(unary_server):
    from click.testing import CliRunner

    from toolkit.cli.main import cli

    _, server = unary_server
    for protocol, url in (("grpc", server.grpc_url), ("http", server.http_url)):
        result = CliRunner().invoke(cli, ["generate", "--raw", "-p", protocol, "-u", url, "stop2"])
        assert result.exit_code == 0, result.output
        assert result.output.strip() == "two"


@contextlib.contextmanager
def openai_client(repo, server):
    """The openai package's client of the OpenAI API (run here, in-process) over `server`."""
    import openai

    from toolkit.api import ApiSettings, run_api_in_background

    handle = run_api_in_background(ApiSettings(server.grpc_url, repo), port=free_port())
    try:
        yield openai.OpenAI(base_url=f"{handle.url}/v1", api_key="none", max_retries=0, timeout=60)
    finally:
        handle.stop()


def test_the_api_answers_on_a_unary_repository(unary_server):
    with openai_client(*unary_server) as client:
        model = client.models.list().data[0].id
        answer = client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": "hi"}]
        )
        assert answer.choices[0].message.content == " hello world"
        assert answer.choices[0].finish_reason == "stop"
        chunks = list(
            client.chat.completions.create(
                model=model, messages=[{"role": "user", "content": "hi"}], stream=True
            )
        )
        assert (
            "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == " hello world"
        )


@pytest.mark.parametrize(("word", "answer"), sorted(ANSWERS.items()))
def test_the_api_stops_on_every_end_token_with_finish_reason_stop(streaming_server, word, answer):
    with openai_client(*streaming_server) as client:
        model = client.models.list().data[0].id
        done = client.completions.create(model=model, prompt=word, max_tokens=10)
        assert done.choices[0].text == answer and done.choices[0].finish_reason == "stop"
        looped = client.completions.create(model=model, prompt="loop", max_tokens=5)
        assert looped.choices[0].finish_reason == "length" and looped.usage.completion_tokens == 5


def test_stock_clients_run_concurrently_without_crossing(streaming_server):
    """Several end-to-end clients at once each get their own answer."""
    _, server = streaming_server
    errors, answers = [], {}

    def one(word):
        try:
            answers[word] = _stream_text(server.grpc_url, "ensemble", word, stream=True)[0]
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=one, args=(w,)) for w in sorted(ANSWERS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors and answers == ANSWERS


def test_toolkit_bench_refuses_a_unary_repository_clearly(unary_server):
    from click.testing import CliRunner

    from toolkit.cli.main import cli

    repo, server = unary_server
    result = CliRunner().invoke(
        cli, ["bench", "--repo", str(repo), "-u", server.grpc_url, "-c", "1"]
    )
    assert result.exit_code == 1
    assert "--no-decoupled" in result.output and "time to first token" in result.output


def test_a_tokenizer_llguidance_cannot_read_refuses_guided_requests_and_serves_the_rest(
    streaming_server,
):
    """The bigram checkpoint's word-level Metaspace tokenizer has no byte mapping llguidance takes: the CPU
    engine still loads, and a guided request is a 400 saying why."""
    import httpx

    from toolkit.api import ApiSettings, run_api_in_background

    repo, server = streaming_server
    handle = run_api_in_background(ApiSettings(server.grpc_url, repo), port=free_port())
    try:
        model = httpx.get(f"{handle.url}/v1/models").json()["data"][0]["id"]
        body = {"model": model, "prompt": "hello", "max_tokens": 4, "temperature": 0}
        guided = httpx.post(
            f"{handle.url}/v1/completions",
            json={**body, "response_format": {"type": "regex", "regex": "[a-z]+"}},
            timeout=60,
        )
        assert guided.status_code == 400, guided.text
        error = guided.json()["error"]
        assert (
            error["code"] == "unsupported_parameter"
            and "llguidance cannot read" in error["message"]
        )
        plain = httpx.post(f"{handle.url}/v1/completions", json=body, timeout=60)
        assert plain.status_code == 200, plain.text
    finally:
        handle.stop()
