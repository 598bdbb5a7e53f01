"""A generation step that raises costs its own requests, not the server.

The checkpoint here is a tiny Llama whose embedding row for one token is NaN: any sampled request
whose prompt holds that token reaches torch.multinomial with NaN probabilities and the step raises
(greedy decoding takes an argmax and does not). Before the CPU engine restarted its generation
loop, that one request left the engine refusing every later request until the server restarted.
Served by a real tritonserver, like the embedded default in test_serve_cpu.
"""

from __future__ import annotations

import pytest

from toolkit.client.generate import GenerateRequest, generate_grpc
from toolkit.errors import ClientError

from repos import launch_on_free_ports, write_test_repository
from tiny import make_tiny_checkpoint

pytestmark = pytest.mark.server

POISON_PROMPT = "The capital of France is Paris."
CLEAN_PROMPT = "Hello world, this is a tiny tokenizer."


@pytest.fixture(scope="module")
def poisoned_server(tmp_path_factory):
    import torch
    from safetensors.torch import load_file, save_file
    from tokenizers import Tokenizer

    root = tmp_path_factory.mktemp("poisoned")
    checkpoint = make_tiny_checkpoint(root / "checkpoint")
    tokenizer = Tokenizer.from_file(str(checkpoint / "tokenizer.json"))
    poison_ids = set(tokenizer.encode(POISON_PROMPT).ids) - set(tokenizer.encode(CLEAN_PROMPT).ids)
    assert poison_ids
    weights = load_file(checkpoint / "model.safetensors")
    embedding = next(name for name in weights if name.endswith("embed_tokens.weight"))
    for token in poison_ids:
        weights[embedding][token] = float("nan")
    save_file(weights, checkpoint / "model.safetensors", metadata={"format": "pt"})
    assert torch.isnan(load_file(checkpoint / "model.safetensors")[embedding]).any()

    repo = write_test_repository(
        checkpoint,
        root / "repo",
        max_input_len=64,
        max_output_len=32,
        max_seq_len=128,
        kv_cache_tokens=2048,
    )
    log = root / "tritonserver.log"
    server = launch_on_free_ports(repo, log, 300)
    yield server, log
    server.stop()


def test_a_failing_step_fails_its_request_and_the_engine_serves_the_next(poisoned_server):
    server, log = poisoned_server
    clean = GenerateRequest(prompt=CLEAN_PROMPT, max_tokens=8, temperature=1.0, seed=3)
    before = generate_grpc(server.grpc_url, clean).text
    assert before

    for _ in range(2):  # it recovers every time, not once
        with pytest.raises(ClientError, match="CPU engine: .*nan"):
            generate_grpc(
                server.grpc_url,
                GenerateRequest(prompt=POISON_PROMPT, max_tokens=8, temperature=1.0),
            )
        # the same seed, the same text: a healthy engine
        assert generate_grpc(server.grpc_url, clean).text == before

    assert "restarting the generation loop" in log.read_text()
