"""The synthetic engine on the real tritonserver: the tensorrt_llm contract, tokens without a model."""

from __future__ import annotations

import queue

import pytest

from toolkit.client.tensors import engine_inputs
from toolkit.repository import contract as c
from toolkit.repository.reader import open_repository
from toolkit.targets import engine_of

from repos import launch_on_free_ports, write_test_repository
from tiny import make_tiny_checkpoint

pytestmark = pytest.mark.server


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """A synthetic repository (built by the writer over a tiny checkpoint), served on its own ports."""

    root = tmp_path_factory.mktemp("synthetic")
    repo = write_test_repository(
        make_tiny_checkpoint(root / "checkpoint"), root / "repo", synthetic=True
    )
    server = launch_on_free_ports(repo, root / "server.log", 120)
    yield server.grpc_url, tuple(engine_of(open_repository(repo)).token_ids)
    server.stop()


@pytest.fixture(scope="module")
def engine_url(served):
    return served[0]


def _infer(
    url: str,
    *,
    output_len: int,
    streaming: bool,
    exclude_input: bool = True,
    ids=(5, 6, 7),
    model: str = c.ENGINE,
    parameters: dict | None = None,
):
    """Send one request over a gRPC stream; returns [(output_ids, sequence_length, final)] or raises the error."""
    import tritonclient.grpc as grpcclient

    client = grpcclient.InferenceServerClient(url)
    results: queue.Queue = queue.Queue()
    client.start_stream(callback=lambda result, error: results.put((result, error)))

    inputs = engine_inputs(
        list(ids), output_len, streaming=streaming, exclude_input_in_output=exclude_input
    )
    client.async_stream_infer(
        model, inputs, enable_empty_final_response=True, parameters=parameters
    )
    responses = []
    try:
        while True:
            result, error = results.get(timeout=30)
            if error is not None:
                raise RuntimeError(str(error))
            final = result.get_response().parameters["triton_final_response"].bool_param
            ids_out = result.as_numpy("output_ids")
            lengths = result.as_numpy("sequence_length")
            responses.append(
                (
                    None if ids_out is None else ids_out.tolist(),
                    None if lengths is None else lengths.tolist(),
                    final,
                )
            )
            if final:
                return responses
    finally:
        client.stop_stream()
        client.close()


def test_streaming_sends_one_token_per_response_and_the_last_is_final(served):
    engine_url, token_ids = served
    responses = _infer(engine_url, output_len=5, streaming=True)
    assert len(responses) == 5  # no extra empty final response
    assert [r[2] for r in responses] == [False] * 4 + [True]
    assert all(r[1] == [[1]] for r in responses)
    tokens = [r[0][0][0][0] for r in responses]
    assert set(tokens) <= set(token_ids)
    # cycles through the ids
    assert tokens[1] == token_ids[(token_ids.index(tokens[0]) + 1) % len(token_ids)]


def _cycle_follows(tokens: list, token_ids: tuple) -> bool:
    start = token_ids.index(tokens[0])
    return tokens == [token_ids[(start + i) % len(token_ids)] for i in range(len(tokens))]


def test_a_stream_interval_sends_the_first_token_alone_then_a_response_per_interval(served):
    engine_url, token_ids = served
    responses = _infer(engine_url, output_len=13, streaming=True, parameters={"stream_interval": 4})
    # As TensorRT-LLM's stream_interval: responses at tokens 1, 4, 8, 12, and the last at 13.
    assert [r[1] for r in responses] == [[[1]], [[3]], [[4]], [[4]], [[1]]]
    assert [r[2] for r in responses] == [False] * 4 + [True]
    tokens = [t for r in responses for t in r[0][0][0]]
    assert len(tokens) == 13 and _cycle_follows(tokens, token_ids)
    # An interval longer than the engine's token cycle still streams the cycle in order.
    long = len(token_ids) + 3
    responses = _infer(
        engine_url, output_len=2 * long + 1, streaming=True, parameters={"stream_interval": long}
    )
    assert [r[1][0][0] for r in responses] == [1, long - 1, long, 1]
    tokens = [t for r in responses for t in r[0][0][0]]
    assert len(tokens) == 2 * long + 1 and _cycle_follows(tokens, token_ids)


@pytest.mark.parametrize("value", [0, -2, 1025, "4", 2.5])
def test_a_stream_interval_that_is_not_a_whole_number_from_1_to_1024_is_refused_naming_it(
    engine_url, value
):
    with pytest.raises(RuntimeError, match=r"stream_interval=.*from 1 to 1024"):
        _infer(engine_url, output_len=3, streaming=True, parameters={"stream_interval": value})


def test_non_streaming_returns_every_token_at_once_with_or_without_the_prompt(engine_url):
    [(ids, lengths, final)] = _infer(engine_url, output_len=4, streaming=False, exclude_input=True)
    assert final and lengths == [[4]] and len(ids[0][0]) == 4
    [(ids, lengths, final)] = _infer(
        engine_url, output_len=4, streaming=False, exclude_input=False, ids=(5, 6, 7)
    )
    assert lengths == [[7]] and ids[0][0][:3] == [5, 6, 7]


def test_concurrent_streams_each_get_their_own_length(engine_url):
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(4) as pool:
        counts = list(
            pool.map(lambda n: len(_infer(engine_url, output_len=n, streaming=True)), (3, 8, 1, 16))
        )
    assert counts == [3, 8, 1, 16]


def test_zero_output_length_is_refused_with_a_message(engine_url):
    with pytest.raises(RuntimeError, match="request_output_len must be > 0"):
        _infer(engine_url, output_len=0, streaming=True)
