"""The repositories the deploy tests render, built once per session: a CPU one of a tiny checkpoint
and an H100 FP8 TP=2 one built through the fake TensorRT-LLM tools, and the GPU render.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from toolkit.model.sources import ResolvedModel

from chart import HUB_REVISION, KUBE_VERSIONS, LLAMA_8B, deploy, find_helm, hub_variant, render
from fakes import build_with_fake_trtllm, fake_checkpoint_with_tokenizer
from repos import python_repository
from tiny import make_tiny_checkpoint


@pytest.fixture(scope="session")
def helm() -> str:
    return find_helm()


@pytest.fixture(scope="session")
def cpu_repo(tmp_path_factory) -> Path:
    """A CPU repository of a tiny checkpoint whose manifest names a pinned hub revision (what a
    `toolkit build --model hf:ORG/NAME` records), under a folder that stands for the volume."""
    tmp = tmp_path_factory.mktemp("cpu")
    checkpoint = make_tiny_checkpoint(tmp / "checkpoint")
    model = ResolvedModel(checkpoint, "hf:acme/tiny-llama", HUB_REVISION)
    return python_repository(
        model,
        tmp / "volume" / "repo",
        max_input_len=128,
        max_output_len=64,
        max_seq_len=256,
        kv_cache_tokens=1024,
    )


@pytest.fixture(scope="session")
def gpu_repo(tmp_path_factory) -> Path:
    """An H100 FP8, TP=2 repository built by `toolkit build` through the fake TensorRT-LLM tools,
    repository and engine on one folder that stands for the volume."""
    tmp = tmp_path_factory.mktemp("gpu")
    checkpoint = fake_checkpoint_with_tokenizer(tmp, LLAMA_8B)
    (checkpoint / "generation_config.json").write_text(json.dumps({"eos_token_id": 2}))
    volume = tmp / "volume"
    result = build_with_fake_trtllm(
        tmp, "--target", "h100-sxm", "--model", checkpoint, "--dtype", "fp8", "--kv-dtype", "fp8",
        "--tp", "2", "--output", volume / "repo", "--engine-dir", volume / "engines" / "llama-h100-fp8-tp2",
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    return volume / "repo"


@pytest.fixture(scope="session")
def gpu_render(helm, gpu_repo, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("gpu-render")
    repo = hub_variant(gpu_repo, tmp)
    values = deploy(repo, tmp / "d", "--min-replicas", "2", "--max-replicas", "8")
    return repo, values, render(helm, tmp / "d"), render(helm, tmp / "d", kube=KUBE_VERSIONS[1])
