"""First-hour traps: what a new user meets before anything works. Every failure exits 1 with an
`Error:` line and a `fix:` line (the README promises it), including click's own option parsing."""

from __future__ import annotations

import shlex
from concurrent import futures

import pytest
from click.testing import CliRunner

from toolkit.cli.main import cli

from tiny import make_tiny_checkpoint


def invoke(*args: str):
    return CliRunner().invoke(cli, [str(a) for a in args], prog_name="toolkit")


def assert_error_with_fix(result, *needles: str) -> None:
    assert result.exit_code == 1, (result.exit_code, result.output)
    assert "Error:" in result.output and "fix:" in result.output, result.output
    assert "Traceback" not in result.output, result.output
    for needle in needles:
        assert needle in result.output, result.output


@pytest.mark.parametrize(
    ("args", "needles"),
    [
        (["build", "--bogus"], ["--bogus", "toolkit build -h"]),
        (["build", "--max-batch-size", "lots"], ["--max-batch-size", "lots"]),
        (["serve", "--http-port", "0"], ["--http-port"]),
        (["bench", "-m", "nope"], ["nope"]),
        (["biuld"], ["biuld", "toolkit -h"]),
        (["--bogus"], ["--bogus"]),
        (["generate"], ["PROMPT"]),
    ],
)
def test_option_parsing_errors_exit_1_with_a_fix_line(args, needles):
    assert_error_with_fix(invoke(*args), *needles)


def test_help_and_version_still_exit_0():
    assert invoke("--help").exit_code == 0
    assert invoke("build", "-h").exit_code == 0
    assert invoke("-V").exit_code == 0


@pytest.fixture
def grpc_only_port():
    """A gRPC server that answers nothing but HTTP/2: what Triton's --grpc-port is to an HTTP client."""
    import grpc

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    yield port
    server.stop(0)


@pytest.mark.parametrize("raw", [(), ("--raw",)])
def test_http_on_the_grpc_port_says_so(grpc_only_port, raw):
    """It printed `('Expected HTTP/', 8)`: the HTTP parser's complaint about HTTP/2 bytes."""
    result = invoke("generate", "hello", "-p", "http", "-u", f"127.0.0.1:{grpc_only_port}", *raw)
    assert_error_with_fix(result, "gRPC", "-p grpc")
    assert "Expected HTTP/" not in result.output


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return make_tiny_checkpoint(tmp_path_factory.mktemp("traps") / "ckpt")


def test_serves_rebuild_hint_for_an_edited_repository_runs_and_keeps_every_setting(tiny, tmp_path):
    from toolkit.repository.reader import open_repository

    repo = tmp_path / "repo"
    settings = ["--max-batch-size", "8", "--max-output-len", "64", "--max-seq-len", "256"]
    settings += ["--max-input-len", "128", "--kv-cache-tokens", "2048", "--max-queue-size", "16"]
    built = invoke(
        "build", "-t", "synthetic", "-m", tiny, "-o", repo, "--step-time-ms", "5", *settings
    )
    assert built.exit_code == 0, built.output
    recorded = open_repository(repo).manifest.to_dict()["settings"]
    config = repo / "postprocessing/config.pbtxt"
    config.write_text(config.read_text() + "\n# edited by hand\n")
    refused = invoke("serve", "--repo", repo)
    assert_error_with_fix(refused, "--discard-changes")
    hint = next(line for line in refused.output.splitlines() if "fix:" in line)
    command = hint[hint.index("toolkit build") : hint.rindex(")")] if ")" in hint else hint
    argv = shlex.split(command)[1:]
    rebuilt = invoke(*argv)
    assert rebuilt.exit_code == 0, (argv, rebuilt.output)
    assert open_repository(repo).manifest.to_dict()["settings"] == recorded


@pytest.fixture
def small_tmpfs(tmp_path):
    """A real filesystem that fills up (skipped where mounting is not permitted)."""
    import subprocess

    point = tmp_path / "home"
    point.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(point)],
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
    yield point
    subprocess.run(["umount", "-l", str(point)], check=False)


def test_a_full_toolkit_home_during_a_build_is_an_error_not_a_traceback(
    small_tmpfs, tmp_path, monkeypatch
):
    """The embedded model is converted into TOOLKIT_HOME on first use (~540 MB): a full one was an
    OSError traceback."""
    monkeypatch.setenv("TOOLKIT_HOME", str(small_tmpfs))
    result = invoke(
        "build", "-t", "synthetic", "-m", "smollm2-135m-instruct", "-o", tmp_path / "repo"
    )
    assert_error_with_fix(result, "MB are free", "TOOLKIT_HOME")
    assert not [p for p in (small_tmpfs / "models").iterdir() if p.name.startswith(".")]
