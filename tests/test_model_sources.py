"""Model sources and facts: local folders, pickle refusal, the hub (offline, from a cache we lay out),
unknown sources."""

from __future__ import annotations

import json
import os
import shutil

import pytest
from click.testing import CliRunner

from toolkit.cli.main import cli
from toolkit.errors import ModelSourceError, UnsupportedModelError
from toolkit.model.facts import facts_from_config, read_model_facts
from toolkit.model.sources import resolve_model

from tiny import make_tiny_checkpoint


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return make_tiny_checkpoint(tmp_path_factory.mktemp("tiny") / "ckpt")


def test_local_folder_resolves(tiny):
    resolved = resolve_model(str(tiny))
    assert resolved.path == tiny.resolve()
    assert resolved.source == f"local:{tiny.resolve()}"


def test_facts_of_tiny_llama(tiny):
    facts = read_model_facts(tiny)
    assert (
        facts.num_layers,
        facts.num_attention_heads,
        facts.num_kv_heads,
        facts.head_dim,
        facts.hidden_size,
    ) == (2, 4, 2, 8, 32)
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny, dtype=torch.float32)
    assert facts.parameter_count == sum(p.numel() for p in model.parameters())


def test_unsupported_architecture_names_the_supported_ones():
    with pytest.raises(UnsupportedModelError, match="(?s)GPT2LMHeadModel.*LlamaForCausalLM"):
        facts_from_config({"architectures": ["GPT2LMHeadModel"]})


def test_pickle_only_checkpoint_is_refused_unless_allowed(tmp_path):
    ckpt = make_tiny_checkpoint(tmp_path / "pickled", weights="bin")
    with pytest.raises(UnsupportedModelError, match="(?s)pickle.*--allow-pickle"):
        resolve_model(str(ckpt))
    assert resolve_model(str(ckpt), allow_pickle=True).path == ckpt.resolve()


def test_unknown_source_names_the_value_and_the_forms():
    result = CliRunner().invoke(cli, ["build", "--model", "no-such-thing", "--output", "x"])
    assert result.exit_code == 1
    assert "unknown model source 'no-such-thing'" in result.output
    assert "hf:ORG/NAME" in result.output


def _lay_out_hub_cache(cache, tiny, repo_id="acme/tiny-llama", commit="a" * 40):
    """The huggingface_hub cache layout: models--ORG--NAME/{refs/main, snapshots/<commit>/...}."""
    root = cache / f"models--{repo_id.replace('/', '--')}"
    snapshot = root / "snapshots" / commit
    snapshot.mkdir(parents=True)
    for item in tiny.iterdir():
        shutil.copy2(item, snapshot / item.name)
    (root / "refs").mkdir()
    (root / "refs" / "main").write_text(commit)
    return commit


def test_hub_source_offline_from_the_cache(tiny, tmp_path, monkeypatch):
    """The hub itself cannot be reached here; huggingface_hub's own offline mode reads the cache we lay out."""
    cache = tmp_path / "hub"
    commit = _lay_out_hub_cache(cache, tiny)
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    import importlib

    import huggingface_hub.constants as constants

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    importlib.invalidate_caches()
    for spec in ("hf:acme/tiny-llama", "acme/tiny-llama", f"hf:acme/tiny-llama@{commit}"):
        resolved = resolve_model(spec)
        assert resolved.source == "hf:acme/tiny-llama"
        assert resolved.revision == commit
        assert (resolved.path / "config.json").is_file()
    with pytest.raises(
        ModelSourceError, match="(?s)not in the local Hugging Face cache.*HF_HUB_OFFLINE"
    ):
        resolve_model("hf:acme/absent-model")


def test_hf_token_is_never_printed(tiny, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_TOKEN", "hf_secret_token_value")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    result = CliRunner().invoke(
        cli, ["build", "--model", "hf:acme/absent-model", "--output", str(tmp_path / "r"), "--json"]
    )
    assert result.exit_code == 1
    assert "hf_secret_token_value" not in result.output
    assert not any(
        "hf_secret_token_value" in p.read_text(errors="ignore")
        for p in tmp_path.rglob("*")
        if p.is_file()
    )


def test_config_json_must_parse(tmp_path):
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(UnsupportedModelError, match="not valid JSON"):
        read_model_facts(tmp_path)
    (tmp_path / "config.json").write_text(
        json.dumps(
            {"architectures": ["LlamaForCausalLM"], "num_attention_heads": 4, "hidden_size": 0}
        )
    )
    with pytest.raises(UnsupportedModelError, match="hidden_size=0"):
        read_model_facts(tmp_path)


def test_an_unreachable_hub_fails_at_once_naming_why_and_the_offline_catalog(tmp_path):
    """No network: one TCP probe decides, then the cache is asked; no retry loop (it took 24 s before)."""
    import socket
    import subprocess
    import sys
    import time

    with socket.socket() as closed:  # a port nothing listens on: connection refused at once
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    env = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE", "HF_TOKEN")}
    env.update({"HF_ENDPOINT": f"http://127.0.0.1:{port}", "HF_HOME": str(tmp_path / "hf")})
    started = time.monotonic()
    done = subprocess.run(
        # not in the catalog
        [
            sys.executable,
            "-m",
            "toolkit.cli.main",
            "plan",
            "-m",
            "hf:Qwen/Qwen2.5-14B-Instruct",
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    elapsed = time.monotonic() - started
    assert done.returncode == 1, done.stderr
    assert (
        "127.0.0.1 cannot be reached" in done.stderr
        and "not in the local Hugging Face cache" in done.stderr
    )
    assert "fix:" in done.stderr
    # a hang bound, not a speed target: the CLI's startup dominates
    assert elapsed < 30, f"took {elapsed:.0f} s"
    plan = subprocess.run(
        [sys.executable, "-m", "toolkit.cli.main", "plan", "-m", "llama-3.1-8b-instruct", "--json"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert plan.returncode == 0, plan.stderr  # the catalog entry of the same model plans offline
