"""Fake TensorRT-LLM tools, plugged in at the real seams: PATH (trtllm-build, nvidia-smi),
TOOLKIT_TRTLLM_EXAMPLES_DIR (convert_checkpoint.py, quantize.py) and PYTHONPATH (tensorrt_llm)."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

FAKES = Path(__file__).resolve().parent
REPO = FAKES.parents[1]


def install_fake_trtllm(
    monkeypatch, tmp_path: Path, *, gpu: bool = True, trtllm: bool = True
) -> Path:
    """Put the fakes on the seams; returns the file where the fake trtllm-build logs its calls."""
    bin_dir = tmp_path / "fake-bin"
    bin_dir.mkdir()
    build = bin_dir / "trtllm-build"
    build.write_text(f"#!{sys.executable}\n" + (FAKES / "trtllm_build.py").read_text())
    build.chmod(0o755)
    if gpu:
        smi = bin_dir / "nvidia-smi"
        shutil.copy(FAKES / "nvidia_smi.sh", smi)
        smi.chmod(0o755)
    python = bin_dir / "python3"
    python.write_text(f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')
    python.chmod(0o755)
    paths = [str(FAKES), str(REPO)] + ([str(FAKES / "python")] if trtllm else [])
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(paths))
    monkeypatch.setenv("PATH", os.pathsep.join([str(bin_dir), "/usr/bin", "/bin"]))
    monkeypatch.setenv("TOOLKIT_TRTLLM_EXAMPLES_DIR", str(FAKES / "examples"))
    monkeypatch.delenv("TOOLKIT_TRTLLM_BIN_DIR", raising=False)
    monkeypatch.delenv("TOOLKIT_TRTLLM_PYTHON", raising=False)
    calls = tmp_path / "trtllm-build-calls.jsonl"
    monkeypatch.setenv("FAKE_TRTLLM_CALLS", str(calls))
    return calls


def fake_checkpoint(tmp_path: Path, config: Path) -> Path:
    """A checkpoint folder: the fixture's config.json and a (tiny, fake) safetensors file."""
    folder = tmp_path / "checkpoint"
    folder.mkdir()
    shutil.copy(config, folder / "config.json")
    (folder / "model.safetensors").write_bytes(b"\x00" * 64)
    return folder


def fake_checkpoint_with_tokenizer(tmp_path: Path, config: Path) -> Path:
    """fake_checkpoint with the tiny checkpoint's real tokenizer files (tests/tiny.py), which a built
    repository's preprocessing and postprocessing need."""
    from tiny import write_tiny_tokenizer

    folder = fake_checkpoint(tmp_path, config)
    write_tiny_tokenizer(folder)
    return folder


def build_with_fake_trtllm(tmp_path: Path, *args):
    """`toolkit build ARGS` through the CLI with the fakes on the seams and TOOLKIT_HOME under
    `tmp_path`, outside any test's monkeypatch (for module and session fixtures); the click result."""
    import pytest
    from click.testing import CliRunner

    from toolkit.cli.main import cli

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TOOLKIT_HOME", str(tmp_path / "home"))
        install_fake_trtllm(mp, tmp_path)
        return CliRunner().invoke(cli, ["build", *(str(a) for a in args)])
