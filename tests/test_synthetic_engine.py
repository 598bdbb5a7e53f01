"""The synthetic engine on the real tritonserver: the tensorrt_llm contract, tokens without a model."""

from __future__ import annotations

import queue
import shutil
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest

from toolkit.client.tensors import engine_inputs
from toolkit.repository import configs
from toolkit.repository import contract as c
from toolkit.serve.binary import find_tritonserver
from toolkit.serve.launcher import ServerConfig, log_tail, server_command
from toolkit.subprocs import stop_process

pytestmark = pytest.mark.server

SOURCE = Path(__file__).resolve().parent.parent / "model_repo" / "tensorrt_llm_synthetic" / "1" / "model.py"
TOKEN_IDS = (11, 12, 13)
PORT = 18310  # http; grpc +1, metrics +2


@pytest.fixture(scope="module")
def engine_url(tmp_path_factory):
    """A repository holding only the synthetic tensorrt_llm model, served on its own ports."""
    repo = tmp_path_factory.mktemp("synthetic-repo")
    (repo / c.ENGINE / "1").mkdir(parents=True)
    shutil.copy(SOURCE, repo / c.ENGINE / "1" / "model.py")
    config = configs.python_model(c.ENGINE, c.ENGINE_INPUTS, c.ENGINE_OUTPUTS, max_batch_size=16, decoupled=True,
                                  parameters={"step_time_ms": 0, "token_ids": ",".join(map(str, TOKEN_IDS))})
    (repo / c.ENGINE / "config.pbtxt").write_text(configs.to_pbtxt(config))
    binary = find_tritonserver()
    server_config = ServerConfig(repo=repo, http_port=PORT, grpc_port=PORT + 1, metrics_port=PORT + 2)
    log = repo / "server.log"
    with open(log, "wb") as out:
        process = subprocess.Popen(server_command(binary, server_config), stdout=out, stderr=subprocess.STDOUT,
                                   env=binary.env, start_new_session=True)
    try:
        _wait_ready(f"http://127.0.0.1:{PORT}/v2/models/{c.ENGINE}/ready", process, log)
        yield f"127.0.0.1:{PORT + 1}"
    finally:
        stop_process(process)


def _wait_ready(url: str, process, log: Path, timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            pytest.fail(f"tritonserver exited\n{log_tail(log)}")
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                if response.status == 200:
                    return
        except OSError:
            time.sleep(0.3)
    pytest.fail(f"synthetic engine not ready\n{log_tail(log)}")


def _infer(url: str, *, output_len: int, streaming: bool, exclude_input: bool = True, ids=(5, 6, 7), model: str = c.ENGINE):
    """Send one request over a gRPC stream; returns [(output_ids, sequence_length, final)] or raises the error."""
    import tritonclient.grpc as grpcclient

    client = grpcclient.InferenceServerClient(url)
    results: queue.Queue = queue.Queue()
    client.start_stream(callback=lambda result, error: results.put((result, error)))

    inputs = engine_inputs(list(ids), output_len, streaming=streaming, exclude_input_in_output=exclude_input)
    client.async_stream_infer(model, inputs, enable_empty_final_response=True)
    responses = []
    try:
        while True:
            result, error = results.get(timeout=30)
            if error is not None:
                raise RuntimeError(str(error))
            final = result.get_response().parameters["triton_final_response"].bool_param
            ids_out = result.as_numpy("output_ids")
            lengths = result.as_numpy("sequence_length")
            responses.append((None if ids_out is None else ids_out.tolist(), None if lengths is None else lengths.tolist(), final))
            if final:
                return responses
    finally:
        client.stop_stream()
        client.close()


def test_streaming_sends_one_token_per_response_and_the_last_is_final(engine_url):
    responses = _infer(engine_url, output_len=5, streaming=True)
    assert len(responses) == 5  # no extra empty final response
    assert [r[2] for r in responses] == [False] * 4 + [True]
    assert all(r[1] == [[1]] for r in responses)
    tokens = [r[0][0][0][0] for r in responses]
    assert set(tokens) <= set(TOKEN_IDS)
    assert tokens[1] == TOKEN_IDS[(TOKEN_IDS.index(tokens[0]) + 1) % len(TOKEN_IDS)]  # cycles through the ids


def test_non_streaming_returns_every_token_at_once_with_or_without_the_prompt(engine_url):
    [(ids, lengths, final)] = _infer(engine_url, output_len=4, streaming=False, exclude_input=True)
    assert final and lengths == [[4]] and len(ids[0][0]) == 4
    [(ids, lengths, final)] = _infer(engine_url, output_len=4, streaming=False, exclude_input=False, ids=(5, 6, 7))
    assert lengths == [[7]] and ids[0][0][:3] == [5, 6, 7]


def test_concurrent_streams_each_get_their_own_length(engine_url):
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(4) as pool:
        counts = list(pool.map(lambda n: len(_infer(engine_url, output_len=n, streaming=True)), (3, 8, 1, 16)))
    assert counts == [3, 8, 1, 16]


def test_zero_output_length_is_refused_with_a_message(engine_url):
    with pytest.raises(RuntimeError, match="request_output_len must be > 0"):
        _infer(engine_url, output_len=0, streaming=True)
