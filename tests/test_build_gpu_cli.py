"""`toolkit build --target h100-sxm` from the command line: dry run on any machine, and the whole
build -> package -> serve pre-flight path through the fake TensorRT-LLM tools (no GPU here)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from toolkit.bench.sweep import Expected, LoadPoint, plan_sweep
from toolkit.cli.main import cli
from toolkit.errors import ServerError
from toolkit.plan.estimate import estimate_for_plan
from toolkit.repository.configs import parse_pbtxt
from toolkit.serve.binary import find_tritonserver
from toolkit.serve.launcher import (
    ServerConfig,
    check_repository,
    launch_server,
    server_command,
)
from toolkit.serve.net import free_port
from toolkit.targets import target_for

from fakes import fake_checkpoint_with_tokenizer, install_fake_trtllm

LLAMA_8B = Path(__file__).parent / "data" / "llama-3.1-8b-instruct" / "config.json"


def invoke(*args: str):
    return CliRunner().invoke(cli, list(args))


def build_h100(model: Path, *flags: str):
    """`toolkit build --target h100-sxm --model MODEL FLAGS...` through the CLI."""
    return invoke("build", "--target", "h100-sxm", "--model", str(model), *flags)


@pytest.mark.parametrize(
    ("dtype", "kv_bytes", "first_tool"), [("bf16", 131072, "python3"), ("fp8", 65536, "python3")]
)
def test_dry_run_json_for_llama_8b_on_h100(dtype, kv_bytes, first_tool):
    result = build_h100(LLAMA_8B, "--dtype", dtype, "--kv-dtype", dtype, "--dry-run", "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["plan"]["kv_bytes_per_token"] == kv_bytes
    assert data["plan"]["tp_size"] == 1 and data["plan"]["max_seq_len"] == 8192
    assert data["commands"][0][0] == first_tool and data["commands"][-1][0] == "trtllm-build"
    if dtype == "bf16":
        assert round(data["plan"]["decode_step_ms_lower_bound"], 1) == 4.8
        assert "convert_checkpoint.py" in " ".join(data["commands"][0])
    else:
        assert {"--qformat", "fp8", "--kv_cache_dtype"} <= set(data["commands"][0])
    assert not Path(data["engine_dir"]).exists()  # nothing ran


def test_a_recipe_without_tp_plans_the_smallest_that_fits_and_tp_on_the_command_line_wins():
    """The 70B recipe names no TP: in bf16 (141 GB of weights) the plan takes TP 2 instead of refusing at
    1; --tp given on the command line is kept. A recipe names its target: no --target needed."""
    recipe = "llama-3.1-70b-instruct-h100-sxm-fp8"
    planned = invoke(
        "build", "--recipe", recipe, "--dtype", "bf16", "--kv-dtype", "bf16", "--dry-run", "--json"
    )
    assert planned.exit_code == 0, planned.output
    plan = json.loads(planned.stdout)["plan"]
    # 70.6 GB of weights per card of 85.5 GB
    assert plan["tp_size"] == plan["min_tp_that_fits"] == 2
    given = invoke("build", "--recipe", recipe, "--tp", "2", "--dry-run", "--json")
    assert given.exit_code == 0, given.output
    data = json.loads(given.stdout)
    assert data["plan"]["tp_size"] == 2 and data["plan"]["min_tp_that_fits"] == 1
    assert data["target"] == "h100-sxm"


def test_an_fp8_kv_cache_with_bf16_weights_is_refused_before_anything_runs():
    result = build_h100(LLAMA_8B, "--kv-dtype", "fp8", "--dry-run")
    assert result.exit_code == 1
    assert "Error: --kv-dtype fp8 with --dtype bf16" in result.stderr
    assert "--dtype fp8" in result.stderr and "--kv-dtype bf16" in result.stderr


def test_build_refuses_an_engine_dir_holding_other_files(monkeypatch, tmp_path, gpu_checkpoint):
    install_fake_trtllm(monkeypatch, tmp_path)
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep me")
    result = build_h100(
        gpu_checkpoint, "--output", str(tmp_path / "repo"), "--engine-dir", str(mine)
    )
    assert result.exit_code == 1
    assert f"Error: --engine-dir {mine} holds files this toolkit did not write" in result.stderr
    assert (mine / "notes.txt").read_text() == "keep me" and sorted(mine.iterdir()) == [
        mine / "notes.txt"
    ]


def test_gpu_flags_are_named_when_used_on_cpu():
    result = invoke("build", "--target", "cpu", "--dtype", "fp8")
    assert result.exit_code == 1
    assert "--dtype fp8: the cpu target runs fp32" in result.output and "fix:" in result.output
    result = invoke("build", "--target", "cpu", "--tp", "2", "--target-input-len", "64")
    assert result.exit_code == 1
    assert (
        "--tp, --target-input-len do not apply to --target cpu (only to gpu targets)"
        in result.output
    )


@pytest.fixture
def gpu_checkpoint(tmp_path):
    folder = fake_checkpoint_with_tokenizer(tmp_path, LLAMA_8B)
    (folder / "generation_config.json").write_text(json.dumps({"eos_token_id": 2}))
    return folder


@pytest.mark.server  # finds the bundled tritonserver (which refuses the engine)
@pytest.mark.parametrize("tp", [1, 2])
def test_build_packages_the_engine_and_serve_preflights_it(
    monkeypatch, tmp_path, gpu_checkpoint, tp
):
    install_fake_trtllm(monkeypatch, tmp_path)
    repo = tmp_path / "repo"
    result = build_h100(
        gpu_checkpoint,
        "--dtype",
        "fp8",
        "--kv-dtype",
        "fp8",
        "--tp",
        str(tp),
        "--output",
        str(repo),
        "--json",
    )
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["path"] == str(repo) and not data["skipped"]
    repository = check_repository(repo)
    assert repository.target == "h100-sxm"
    assert (
        repository.memory_plan.decode_step_ms_lower_bound
        == data["plan"]["decode_step_ms_lower_bound"]
    )
    # toolkit bench compares each concurrency point with the plan's estimate there
    points = (
        LoadPoint("concurrency", 1),
        LoadPoint("concurrency", 64),
        LoadPoint("request_rate", 2),
    )
    sweep = plan_sweep(
        "h:1", points, input_tokens=256, output_tokens=128, out_dir=tmp_path, repo=repo
    )
    facts, memory = repository.manifest.model.facts, repository.memory_plan
    assert sweep.expected == (
        *(Expected.from_estimate(estimate_for_plan(facts, memory, c, 256, 128)) for c in (1, 64)),
        None,
    )
    engine = parse_pbtxt((repo / "tensorrt_llm" / "config.pbtxt").read_text())
    assert engine.backend == "tensorrtllm" and engine.model_transaction_policy.decoupled
    assert engine.parameters["gpt_model_type"].string_value == "inflight_fused_batching"
    assert engine.parameters["gpt_model_path"].string_value == data["engine_dir"]
    assert engine.max_batch_size == data["plan"]["max_batch_size"]
    for name in ("ensemble", "preprocessing", "postprocessing", "tensorrt_llm_bls"):
        assert parse_pbtxt((repo / name / "config.pbtxt").read_text()).name == name
    world_size = target_for(repository).preflight(repository)
    assert world_size == tp
    config = ServerConfig(
        repo=repo, http_port=free_port(), grpc_port=free_port(), metrics_port=free_port()
    )
    argv = server_command(find_tritonserver(), config, world_size)
    if tp == 2:
        assert argv[:4] == ["mpirun", "--allow-run-as-root", "-n", "1"] and argv.count(":") == 1
        rank1 = argv[argv.index(":") + 1 :]
        assert "--load-model=tensorrt_llm" in rank1 and "--allow-http=false" in rank1
    # The tritonserver found here is pytriton's, which has no tensorrtllm backend: refused, naming the container.
    with pytest.raises(ServerError, match="(?s)no tensorrtllm backend.*trtllm-python-py3"):
        launch_server(config)


def test_serve_refuses_an_engine_from_another_trtllm_version(monkeypatch, tmp_path, gpu_checkpoint):
    install_fake_trtllm(monkeypatch, tmp_path)
    repo = tmp_path / "repo"
    assert build_h100(gpu_checkpoint, "--dtype", "bf16", "--output", str(repo)).exit_code == 0
    engine_dir = Path(
        parse_pbtxt((repo / "tensorrt_llm" / "config.pbtxt").read_text())
        .parameters["gpt_model_path"]
        .string_value
    )
    config = json.loads((engine_dir / "config.json").read_text())
    config["version"] = "0.18.0"
    (engine_dir / "config.json").write_text(json.dumps(config))
    result = invoke(
        "serve",
        "--repo",
        str(repo),
        "--grpc-port",
        str(free_port()),
        "--http-port",
        str(free_port()),
        "--metrics-port",
        str(free_port()),
    )
    assert result.exit_code == 1
    assert "0.18.0" in result.output and "rebuild" in result.output.lower()


def _no_download(monkeypatch) -> list:
    """Record any checkpoint download the build would start (there must be none before the preflight)."""
    downloads: list = []

    def resolve(spec, **_):
        downloads.append(spec)
        raise RuntimeError("the build downloaded the checkpoint before its preflight")

    monkeypatch.setattr("toolkit.build.resolve_model", resolve)
    return downloads


def test_a_gpu_build_without_tensorrt_llm_is_refused_before_it_downloads_anything(
    monkeypatch, tmp_path
):
    """16 GB (141 GB for 70B) of checkpoint before the 'use the container' error, before this fix."""
    install_fake_trtllm(monkeypatch, tmp_path, trtllm=False)
    downloads = _no_download(monkeypatch)
    args = ["build", "--target", "h100-sxm", "--model", "hf:meta-llama/Llama-3.1-8B-Instruct"]
    result = invoke(*args, "--output", str(tmp_path / "repo"))
    assert downloads == [] and result.exit_code == 1
    assert "TensorRT-LLM is not installed" in result.stderr
    assert "tritonserver:25.06-trtllm-python-py3" in result.stderr


def test_a_gpu_build_needing_more_gpus_than_the_machine_has_is_refused_before_it_downloads(
    monkeypatch, tmp_path
):
    install_fake_trtllm(monkeypatch, tmp_path)
    monkeypatch.setenv("FAKE_GPU_COUNT", "1")
    downloads = _no_download(monkeypatch)
    args = ["build", "--target", "h100-sxm", "--model", "hf:meta-llama/Llama-3.1-8B-Instruct"]
    result = invoke(*args, "--tp", "2", "--output", str(tmp_path / "repo"))
    assert downloads == [] and result.exit_code == 1
    assert "needs 2 GPUs" in result.stderr and "1" in result.stderr
    monkeypatch.setenv("FAKE_GPU_SM", "8.0")
    result = invoke(*args, "--output", str(tmp_path / "repo"))
    assert downloads == [] and result.exit_code == 1 and "SM 8.0" in result.stderr
