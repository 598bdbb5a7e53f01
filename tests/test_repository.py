"""Repository writer and serve pre-flight on a tiny checkpoint: configs, manifest, atomic writes, refusals."""

from __future__ import annotations

import json
import socket
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from toolkit.cli.main import cli
from toolkit.errors import RepositoryError
from toolkit.repository import configs
from toolkit.repository import contract as c
from toolkit.repository.sources import model_repo_sources
from toolkit.serve.launcher import ServerConfig, check_repository, launch_server

from tiny import make_tiny_checkpoint

sys.path.insert(0, str(model_repo_sources() / "common"))
from textcodec import TextCodec  # noqa: E402


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return make_tiny_checkpoint(tmp_path_factory.mktemp("tiny") / "ckpt")


def build(tiny, out: Path, *extra: str):
    return CliRunner().invoke(
        cli,
        [
            "build",
            "--model",
            str(tiny),
            "--output",
            str(out),
            "--max-seq-len",
            "256",
            "--max-input-len",
            "128",
            "--max-output-len",
            "64",
            "--kv-cache-tokens",
            "1024",
            "--json",
            *extra,
        ],
    )


def test_build_writes_the_five_models_with_configs_that_parse(tiny, tmp_path):
    result = build(tiny, tmp_path / "repo")
    assert result.exit_code == 0, result.output
    repo = tmp_path / "repo"
    for name in c.MODEL_NAMES:
        text = (repo / name / "config.pbtxt").read_text()
        assert "${" not in text
        config = configs.parse_pbtxt(text)
        assert config.name == name
    engine = configs.parse_pbtxt((repo / "tensorrt_llm" / "config.pbtxt").read_text())
    assert engine.backend == "python" and engine.model_transaction_policy.decoupled
    assert [i.name for i in engine.input][:3] == [
        "input_ids",
        "input_lengths",
        "request_output_len",
    ]
    assert {o.name for o in engine.output} >= {"output_ids", "sequence_length"}
    assert engine.parameters["max_seq_len"].string_value == "256"
    assert engine.parameters["kv_cache_blocks"].string_value == "16"  # 1024 tokens / 64 per block
    ensemble = configs.parse_pbtxt((repo / "ensemble" / "config.pbtxt").read_text())
    names = {i.name for i in ensemble.input}
    assert {
        "text_input",
        "max_tokens",
        "stream",
        "end_id",
        "pad_id",
        "temperature",
        "top_k",
        "top_p",
        "seed",
        "stop_words",
        "bad_words",
        "exclude_input_in_output",
    } <= names
    assert [s.model_name for s in ensemble.ensemble_scheduling.step] == [
        "preprocessing",
        "tensorrt_llm",
        "postprocessing",
    ]
    assert (repo / "preprocessing" / "1" / "tokenizer" / "tokenizer.json").is_file()
    assert (repo / "tensorrt_llm" / "1" / "weights" / "model.safetensors").is_file()


def test_manifest_records_source_hashes_target_and_versions(tiny, tmp_path):
    build(tiny, tmp_path / "repo")
    manifest = json.loads((tmp_path / "repo" / "manifest.json").read_text())
    assert manifest["target"] == "cpu"
    assert manifest["model"]["source"] == f"local:{tiny.resolve()}"
    assert len(manifest["checkpoint_files"]["model.safetensors"]) == 64
    size, _mtime, digest = manifest["files"]["tensorrt_llm/1/weights/model.safetensors"]
    assert digest == manifest["checkpoint_files"]["model.safetensors"] and size > 0
    assert manifest["generator"] == "toolkit" and manifest["tokens"]["end_id"] == 2
    assert manifest["versions"]["transformers"] and manifest["toolkit_version"]
    assert manifest["limits"]["max_seq_len"] == 256


def test_unchanged_rebuild_is_skipped_and_a_change_rebuilds(tiny, tmp_path):
    first = json.loads(build(tiny, tmp_path / "repo").stdout)
    again = json.loads(build(tiny, tmp_path / "repo").stdout)
    assert not first["skipped"] and again["skipped"]
    changed = json.loads(build(tiny, tmp_path / "repo", "--max-batch-size", "8").stdout)
    assert not changed["skipped"] and changed["build_key"] != first["build_key"]


def test_a_served_repository_is_not_replaced_under_its_server(tiny, tmp_path):
    """A rebuild in place while it was served succeeded: the engine went on with the old limits while
    an API worker started again read the new ones (max_tokens refused by one worker, taken by the
    other). tritonserver and the API hold a shared lock on the folder; a build refuses it, and takes
    it once they stopped."""
    from toolkit.api import ApiSettings
    from toolkit.serve.api_process import launch_api
    from toolkit.serve.net import free_port
    from toolkit.subprocs import stop_process

    from repos import launch_on_free_ports

    repo = tmp_path / "repo"
    assert build(tiny, repo).exit_code == 0
    server = launch_on_free_ports(repo, tmp_path / "server.log", 120)
    api = None
    try:
        api, _ = launch_api(
            ApiSettings(server.grpc_url, repo), host="127.0.0.1", port=free_port(),
            log_file=tmp_path / "api.log",
        )  # fmt: skip
        result = build(tiny, repo, "--max-batch-size", "8")
        assert result.exit_code == 1 and "is being served" in result.output, result.output
        assert "build to another --output" in result.output
        server.stop(timeout_s=10)
        # the API alone holds it too
        result = build(tiny, repo, "--max-batch-size", "8")
        assert result.exit_code == 1 and "is being served" in result.output, result.output
    finally:
        server.stop(timeout_s=10)
        if api is not None:
            stop_process(api, 10)
    changed = build(tiny, repo, "--max-batch-size", "8")
    assert changed.exit_code == 0 and not json.loads(changed.stdout)["skipped"], changed.output


def test_failed_build_leaves_the_previous_repository_whole(tiny, tmp_path, monkeypatch):
    repo = tmp_path / "repo"
    build(tiny, repo)
    before = (repo / "manifest.json").read_text()
    import toolkit.repository.writer as writer

    def broken(*_args, **_kwargs):
        raise OSError("disk full (simulated)")

    monkeypatch.setattr(writer, "_swap_into_place", broken)
    result = build(tiny, repo, "--max-batch-size", "4")
    assert result.exit_code != 0
    assert (repo / "manifest.json").read_text() == before
    check_repository(repo)
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".repo.building")]


def test_refuses_to_overwrite_a_folder_that_is_not_a_repository(tiny, tmp_path):
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("keep me")
    result = build(tiny, tmp_path / "mine")
    assert result.exit_code == 1 and "not a toolkit repository" in result.output
    assert (tmp_path / "mine" / "notes.txt").read_text() == "keep me"


@pytest.mark.parametrize(
    "limits, message, fix",
    [
        ({"max_seq_len": 4096}, "--max-seq-len=4096 is over the model's max_position_embeddings 2048",
         "pass --max-seq-len 2048 or less"),
        ({"max_input_len": 2048}, "--max-input-len=2048 leaves no room to generate within --max-seq-len=2048",
         "make --max-input-len smaller than --max-seq-len"),
        ({"kv_cache_tokens": 1024}, "--kv-cache-tokens=1024 cannot hold one sequence of --max-seq-len=2048",
         "pass --kv-cache-tokens 2048 or more"),
    ],
)  # fmt: skip
def test_limits_the_engine_cannot_run_are_refused_naming_the_flag_and_the_fix(limits, message, fix):
    from toolkit.errors import RepositoryError
    from toolkit.repository.limits import RepositoryLimits

    RepositoryLimits().check(max_position_embeddings=2048)  # the defaults run
    with pytest.raises(RepositoryError) as refused:
        RepositoryLimits(**limits).check(max_position_embeddings=2048)
    assert refused.value.message == message and refused.value.hint == fix


def test_bad_limits_name_the_flag(tiny, tmp_path):
    result = build(tiny, tmp_path / "r", "--max-seq-len", "100000")
    assert (
        result.exit_code == 1
        and "--max-seq-len=100000" in result.output
        and "max_position_embeddings 512" in result.output
    )
    result = CliRunner().invoke(
        cli, ["build", "--model", str(tiny), "--output", str(tmp_path / "r"), "--tp", "2"]
    )
    assert result.exit_code == 1
    assert "--tp does not apply to --target cpu (only to gpu targets)" in result.output
    assert (
        "fix: drop --tp, or build for a target it applies to (--target h100-sxm)" in result.output
    )


def test_serve_refuses_missing_foreign_and_stale_repositories(tiny, tmp_path):
    result = CliRunner().invoke(cli, ["serve", "--repo", str(tmp_path / "absent")])
    assert (
        result.exit_code == 1
        and "does not exist" in result.output
        and "toolkit build" in result.output
    )
    (tmp_path / "foreign").mkdir()
    result = CliRunner().invoke(cli, ["serve", "--repo", str(tmp_path / "foreign")])
    assert result.exit_code == 1 and "not a toolkit model repository" in result.output
    build(tiny, tmp_path / "repo")
    manifest = json.loads((tmp_path / "repo" / "manifest.json").read_text())
    manifest["sources_digest"] = "0" * 16
    (tmp_path / "repo" / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(
        RepositoryError, match="(?s)other model sources.*rebuild: toolkit build --target cpu"
    ):
        check_repository(tmp_path / "repo")


def test_serve_refuses_a_repository_whose_files_were_replaced_and_names_them(tiny, tmp_path):
    """A stock postprocessing swapped in, weights truncated: serve names each changed file and refuses,
    unless told --allow-modified. Size and mtime are compared first; the hash decides."""
    import os

    build(tiny, tmp_path / "repo")
    repo = tmp_path / "repo"
    check_repository(repo)  # as built: accepted
    post = repo / "postprocessing" / "1" / "model.py"
    stat = post.stat()
    post.write_text(post.read_text().replace("TritonPythonModel", "TritonPythonModeL"))
    # same size and mtime: only the hash tells
    os.utime(post, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    weights = next((repo / "tensorrt_llm" / "1").rglob("*.safetensors"))
    with weights.open("r+b") as handle:
        handle.truncate(16)
    with pytest.raises(RepositoryError) as refused:
        check_repository(repo)
    message = str(refused.value.message)
    assert "postprocessing/1/model.py (modified)" in message
    assert f"{weights.relative_to(repo)} (" in message
    assert "--allow-modified" in refused.value.hint
    assert check_repository(repo, allow_modified=True).path == repo
    result = CliRunner().invoke(cli, ["serve", "--repo", str(repo)])
    assert result.exit_code == 1 and "postprocessing/1/model.py" in result.output


def serve_on_a_busy_port(repo: Path, option: str):
    """`toolkit serve --repo REPO OPTION PORT` while a listening socket holds PORT: (PORT, result)."""
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        return port, CliRunner().invoke(cli, ["serve", "--repo", str(repo), option, str(port)])


def test_serve_refuses_a_port_in_use(tiny, tmp_path):
    build(tiny, tmp_path / "repo")
    port, result = serve_on_a_busy_port(tmp_path / "repo", "--grpc-port")
    assert result.exit_code == 1
    assert (
        f"port {port} on 127.0.0.1 (--grpc-port) is in use" in result.output
        and "pass a free port with --grpc-port" in result.output
    )


def test_a_busy_openai_port_is_named_before_tritonserver_starts(tiny, tmp_path, monkeypatch):
    import toolkit.serve.lifecycle as lifecycle

    build(tiny, tmp_path / "repo")
    started = []
    monkeypatch.setattr(lifecycle, "launch_server", lambda *a, **k: started.append(a))
    port, result = serve_on_a_busy_port(tmp_path / "repo", "--openai-port")
    assert result.exit_code == 1 and not started
    assert f"port {port} on 127.0.0.1 (--openai-port) is in use" in result.output
    assert "pass a free port with --openai-port" in result.output


@pytest.mark.skipif(not socket.has_ipv6, reason="no IPv6 on this machine")
def test_ports_on_ipv6_hosts_are_checked_on_ipv6(tmp_path):
    from toolkit.errors import ServerError
    from toolkit.serve.net import check_port_free

    try:
        busy = socket.socket(socket.AF_INET6)
        busy.bind(("::1", 0))
    except OSError:
        pytest.skip("::1 cannot be bound here")
    with busy:
        busy.listen()
        port = busy.getsockname()[1]
        with pytest.raises(ServerError, match=f"port {port} on ::1 .--http-port. is in use"):
            check_port_free("::1", port, "--http-port")
    check_port_free("::1", port, "--http-port")  # free again: no false "in use" for IPv6
    check_port_free("::", port, "--http-port")
    with pytest.raises(ServerError, match="not an address or a name") as refused:
        check_port_free("no-such-host.invalid", port, "--http-port")
    assert "--host" in refused.value.hint


def test_triton_gets_ipv4_addresses_and_clients_get_bracketed_urls():
    from toolkit.errors import ServerError
    from toolkit.serve.net import client_host, triton_address

    assert triton_address("::", "--host") == "0.0.0.0"
    assert triton_address("::1", "--host") == "127.0.0.1"
    assert triton_address("10.0.0.5", "--host") == "10.0.0.5"
    with pytest.raises(
        ServerError, match="--metrics-host 2001:db8::5: tritonserver listens on IPv4"
    ):
        triton_address("2001:db8::5", "--metrics-host")
    assert client_host("::1") == "[::1]" and client_host("::") == "[::1]"
    assert client_host("0.0.0.0") == "127.0.0.1" and client_host("10.0.0.5") == "10.0.0.5"


@pytest.mark.server
@pytest.mark.skipif(not socket.has_ipv6, reason="no IPv6 on this machine")
def test_serve_on_ipv6_loopback_keeps_triton_on_ipv4_and_the_api_on_ipv6(tiny, tmp_path):
    """tritonserver 2.51 exits at start when given ::1 (its gRPC server cannot parse it)."""
    import json as jsonlib
    import os
    import signal
    import subprocess
    import urllib.request

    from toolkit.serve.net import free_port

    try:
        with socket.socket(socket.AF_INET6) as probe:
            probe.bind(("::1", 0))
    except OSError:
        pytest.skip("::1 cannot be bound here")
    repo = tmp_path / "repo"
    build(tiny, repo)
    ports = {name: free_port() for name in ("http", "grpc", "metrics", "openai")}
    argv = [sys.executable, "-m", "toolkit.cli.main", "serve", "--repo", str(repo), "--host", "::1"]
    argv += [arg for name, port in ports.items() for arg in (f"--{name}-port", str(port))]
    argv += ["--background", "--json", "--log-file", str(tmp_path / "triton.log")]
    started = subprocess.run(argv, capture_output=True, text=True, timeout=300)
    assert started.returncode == 0, started.stderr
    endpoints = jsonlib.loads(started.stdout)
    try:
        assert endpoints["http"] == f"127.0.0.1:{ports['http']}"
        assert endpoints["openai"] == f"http://[::1]:{ports['openai']}/v1"
        with urllib.request.urlopen(f"http://[::1]:{ports['openai']}/health", timeout=10) as r:
            assert r.status == 200
        url = f"http://127.0.0.1:{ports['http']}/v2/health/ready"
        with urllib.request.urlopen(url, timeout=10) as r:
            assert r.status == 200
    finally:
        for pid in (endpoints["pid"], endpoints["openai_pid"]):
            os.kill(pid, signal.SIGTERM)


def test_serve_errors_on_files_it_cannot_write_or_read_are_clean(tiny, tmp_path):
    build(tiny, tmp_path / "repo")
    keys = tmp_path / "keys"
    keys.write_bytes(b"\xff\xfe not text")
    result = CliRunner().invoke(
        cli, ["serve", "--repo", str(tmp_path / "repo"), "--api-key-file", str(keys)]
    )
    assert result.exit_code == 1 and "is not UTF-8 text" in result.output, result.output
    assert isinstance(result.exception, SystemExit), result.exception


def test_an_output_in_a_folder_that_cannot_be_made_is_a_clean_error(tmp_path):
    """A parent path that is a file (as root, the one unwritable folder a test can make)."""
    parent = tmp_path / "notes.txt"
    parent.write_text("mine\n")
    result = CliRunner().invoke(cli, ["build", "-t", "synthetic", "-o", str(parent / "repo")])
    assert result.exit_code == 1 and f"cannot write in {parent}" in result.output, result.output
    assert isinstance(result.exception, SystemExit), result.exception
    assert parent.read_text() == "mine\n"


@pytest.mark.server
def test_a_model_that_fails_to_load_exits_with_the_log_tail(tiny, tmp_path):
    build(tiny, tmp_path / "repo")
    (tmp_path / "repo" / "postprocessing" / "1" / "model.py").write_text(
        "raise RuntimeError('broken on purpose')\n"
    )
    from toolkit.errors import ServerError
    from toolkit.serve.net import free_port

    config = ServerConfig(
        repo=tmp_path / "repo",
        http_port=free_port(),
        grpc_port=free_port(),
        metrics_port=free_port(),
        ready_timeout_s=120,
        allow_modified=True,
    )
    with pytest.raises(ServerError, match="(?s)exited with code.*broken on purpose"):
        launch_server(config)


# --- detokenization: streamed pieces are bytes that always rejoin to the full decode -------------
@pytest.fixture(scope="module")
def codec(tiny):
    return TextCodec(tiny)


@settings(max_examples=200, deadline=None)
@given(st.text(min_size=1, max_size=40))
def test_streamed_bytes_rejoin_to_the_full_decode(codec_and_tokenizer, text):
    codec, tokenizer = codec_and_tokenizer
    ids = codec.encode(text)
    pieces = [codec.decode_bytes([i]) for i in ids]
    assert b"".join(pieces) == codec.decode_bytes(ids)
    assert (
        b"".join(pieces).decode("utf-8") == tokenizer.decode(ids, skip_special_tokens=True) == text
    )


@pytest.fixture(scope="module")
def codec_and_tokenizer(tiny):
    from transformers import PreTrainedTokenizerFast

    return TextCodec(tiny), PreTrainedTokenizerFast(tokenizer_file=str(tiny / "tokenizer.json"))


def test_special_tokens_are_skipped(codec):
    assert codec.decode_bytes([2, 1, 0]) == b""


def test_serve_refuses_the_same_port_twice_and_out_of_range_ports(tiny, tmp_path):
    build(tiny, tmp_path / "repo")
    result = CliRunner().invoke(
        cli,
        ["serve", "--repo", str(tmp_path / "repo"), "--http-port", "9123", "--grpc-port", "9123"],
    )
    assert result.exit_code == 1 and "--http-port and --grpc-port are both 9123" in result.output
    result = CliRunner().invoke(
        cli, ["serve", "--repo", str(tmp_path / "repo"), "--http-port", "0"]
    )
    assert result.exit_code == 1 and "'--http-port': 0 is not in the range" in result.output
