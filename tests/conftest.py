"""Shared test setup: every test gets its own toolkit home (caches, engines) in a temp dir."""

from __future__ import annotations

import signal

import pytest

# The tests send SIGINT and SIGHUP to what they start, and the toolkit keeps a signal it inherited as
# ignored ignored (nohup's SIGHUP; SIGINT of a shell's background job). A runner that starts the suite
# so (`nohup ... &` in a script) would pass that on to every process: restore the defaults here, which
# the processes the tests start inherit.
signal.signal(signal.SIGINT, signal.default_int_handler)
signal.signal(signal.SIGHUP, signal.SIG_DFL)


@pytest.fixture(autouse=True)
def toolkit_home(tmp_path_factory, monkeypatch):
    home = tmp_path_factory.mktemp("toolkit-home")
    monkeypatch.setenv("TOOLKIT_HOME", str(home))
    return home


# --- the served CPU repository (real tritonserver), shared by every server test --------------
import os  # noqa: E402
from dataclasses import dataclass  # noqa: E402
from pathlib import Path  # noqa: E402

from toolkit.serve.net import free_port  # noqa: E402


@dataclass(frozen=True)
class ServedRepo:
    repo: Path
    checkpoint: Path
    home: Path
    grpc_url: str
    http_url: str
    metrics_url: str
    pid: int


@pytest.fixture(scope="session")
def served_repo(tmp_path_factory):
    """Build the embedded default's CPU repository once and serve it for the whole session."""
    from toolkit.model.sources import resolve_model

    from repos import launch_on_free_ports, python_repository

    home = Path(os.environ.get("TOOLKIT_TEST_HOME") or tmp_path_factory.mktemp("served-home"))
    with pytest.MonkeyPatch.context() as env:
        env.setenv("TOOLKIT_HOME", str(home))
        model = resolve_model("smollm2-135m-instruct", progress=False)
        repo = tmp_path_factory.mktemp("served") / "repo"
        python_repository(
            model,
            repo,
            max_input_len=512,
            max_output_len=256,
            max_seq_len=1024,
            kv_cache_tokens=16384,
        )
        server = launch_on_free_ports(repo, home / "tritonserver-test.log", 300)
    yield ServedRepo(
        repo=repo,
        checkpoint=model.path,
        home=home,
        grpc_url=server.grpc_url,
        http_url=server.http_url,
        metrics_url=server.metrics_url,
        pid=server.pid,
    )
    server.stop()


@pytest.fixture(scope="session")
def reference_model(served_repo):
    """transformers' own model and tokenizer over the same checkpoint: the greedy reference."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(served_repo.checkpoint)
    model = AutoModelForCausalLM.from_pretrained(served_repo.checkpoint, dtype=torch.float32).eval()
    return model, tokenizer


# --- the OpenAI API over the served repository, and the `openai` client of it ------------------
@pytest.fixture(scope="module")
def api_options() -> dict:
    """ApiSettings options of `api` beyond the repository; a module overrides this fixture. The first of
    its `api_keys` is the one `client` sends."""
    return {}


@pytest.fixture(scope="module")
def api(served_repo, api_options):
    """The OpenAI API, on a thread of this process, over the session's served repository."""
    from toolkit.api import ApiSettings, run_api_in_background

    settings = ApiSettings(served_repo.grpc_url, served_repo.repo, **api_options)
    handle = run_api_in_background(settings, port=free_port())
    yield handle
    handle.stop()


@pytest.fixture(scope="module")
def client(api, api_options):
    """The `openai` package's client of `api`, sending its first API key."""
    import openai

    key = (api_options.get("api_keys") or ("none",))[0]
    return openai.OpenAI(base_url=f"{api.url}/v1", api_key=key, max_retries=0, timeout=300)


@pytest.fixture(scope="module")
def model_id(client) -> str:
    return client.models.list().data[0].id
