"""build -> package -> serve pre-flight, end to end through fake TensorRT-LLM tools on the real seams."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from toolkit.build import BuildRequest, plan_build
from toolkit.engine import check_engine_compatible, execute_engine_build, read_engine_info
from toolkit.errors import EngineBuildError
from toolkit.repository import contract as c
from toolkit.repository.configs import parse_pbtxt, to_pbtxt
from toolkit.repository.limits import RepositoryLimits
from toolkit.targets import TrtllmEngine

from fakes import fake_checkpoint, install_fake_trtllm
from repos import gpu_engine_plan

DATA = Path(__file__).parent / "data"
LLAMA_8B = DATA / "llama-3.1-8b-instruct" / "config.json"
CATALOG = Path(__file__).parents[1] / "toolkit" / "model" / "catalog"


@pytest.fixture
def fakes(monkeypatch, tmp_path):
    return install_fake_trtllm(monkeypatch, tmp_path)


@pytest.fixture
def checkpoint(tmp_path):
    return fake_checkpoint(tmp_path, LLAMA_8B)


def calls(path: Path) -> int:
    return len(path.read_text().splitlines()) if path.exists() else 0


def test_dry_run_prints_plan_and_commands_and_runs_nothing(tmp_path):
    data = plan_build(
        BuildRequest.make(model=str(LLAMA_8B), target="h100-sxm", dtype="fp8", kv_dtype="fp8")
    ).to_dict()
    json.dumps(data)  # JSON-ready
    assert data["trtllm_version_pinned"] == "0.20.0"
    assert data["plan"]["kv_bytes_per_token"] == 65536
    assert [argv[0] for argv in data["commands"]] == ["python3", "trtllm-build"]
    assert all(isinstance(argv, list) for argv in data["commands"])
    assert not Path(data["engine_dir"]).exists()


def test_dry_run_from_a_recipe_with_a_model_override():
    data = plan_build(
        BuildRequest.make(model=str(LLAMA_8B), recipe="llama-3.1-8b-instruct-h100-sxm-bf16")
    ).to_dict()
    assert data["target"] == "h100-sxm" and data["plan"]["dtype"] == "bf16"
    assert round(data["plan"]["decode_step_ms_lower_bound"], 1) == 4.8
    assert data["steps"] == ["convert", "trtllm-build"]


def test_build_writes_an_engine_and_an_unchanged_rebuild_does_nothing(fakes, checkpoint):
    plan = gpu_engine_plan(str(checkpoint), "h100-sxm", dtype="fp8", kv_dtype="fp8")
    first = execute_engine_build(plan)
    assert not first.cached and calls(fakes) == 1
    engine = Path(first.engine_dir)
    config = json.loads((engine / "config.json").read_text())
    assert config["version"] == "0.20.0"
    assert config["pretrained_config"]["quantization"] == {
        "quant_algo": "FP8",
        "kv_cache_quant_algo": "FP8",
    }
    assert config["build_config"]["max_batch_size"] == plan.memory.max_batch_size
    assert (engine / "rank0.engine").is_file() and (engine / "logs" / "trtllm-build.log").is_file()
    assert not Path(plan.work_dir).exists()

    again = execute_engine_build(
        gpu_engine_plan(str(checkpoint), "h100-sxm", dtype="fp8", kv_dtype="fp8")
    )
    assert again.cached and again.cache_key == first.cache_key and calls(fakes) == 1


def test_cache_key_changes_with_weights_version_and_recipe(fakes, checkpoint):
    from toolkit.engine.cache import cache_key

    plan = gpu_engine_plan(str(checkpoint), "h100-sxm")
    key = execute_engine_build(plan).cache_key
    (checkpoint / "model.safetensors").write_bytes(b"\x01" * 64)
    assert execute_engine_build(plan).cache_key != key and calls(fakes) == 2
    assert cache_key("c", {}, "0.20.0", "9.0") != cache_key("c", {}, "0.21.0", "9.0")
    assert not execute_engine_build(
        gpu_engine_plan(str(checkpoint), "h100-sxm", max_seq_len=4096)
    ).cached


def test_build_refuses_a_trtllm_other_than_the_pin(fakes, checkpoint, monkeypatch):
    """The commands and example-script paths are the pinned release's: another release is refused, not warned."""
    monkeypatch.setenv("FAKE_TRTLLM_VERSION", "0.21.0")
    plan = gpu_engine_plan(str(checkpoint), "h100-sxm")
    with pytest.raises(EngineBuildError, match="TensorRT-LLM 0.21.0 is installed") as err:
        execute_engine_build(plan)
    assert "0.20.0" in err.value.message
    assert "nvcr.io/nvidia/tritonserver:25.06-trtllm-python-py3" in err.value.hint
    assert calls(fakes) == 0 and not Path(plan.engine_dir).exists()


def test_trtllm_build_keeps_its_timing_cache_out_of_the_callers_folder(
    fakes, checkpoint, tmp_path, monkeypatch
):
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    plan = gpu_engine_plan(str(checkpoint), "h100-sxm")
    build = list(plan.commands[1])
    assert Path(build[build.index("--output_timing_cache") + 1]).parent == Path(plan.work_dir)
    execute_engine_build(plan)
    assert list(cwd.iterdir()) == []


@pytest.mark.parametrize(
    ("dtype", "kv"), [("bf16", "bf16"), ("fp8", "fp8"), ("fp8", "bf16"), ("int4-awq", "bf16")]
)
def test_the_engine_keeps_paged_context_fmha_where_the_runtime_needs_it(
    fakes, checkpoint, dtype, kv
):
    """The fake trtllm-build turns paged context FMHA off as the upstream record's builder rule says; an
    engine the runtime is told to chunk or reuse for must still have it."""
    plan = gpu_engine_plan(str(checkpoint), "h100-sxm", dtype=dtype, kv_dtype=kv)
    engine = Path(execute_engine_build(plan).engine_dir)
    plugins = json.loads((engine / "config.json").read_text())["build_config"]["plugin_config"]
    runtime = read_engine_info(engine).runtime
    if runtime["enable_chunked_context"] or runtime["enable_kv_cache_reuse"]:
        assert plugins["use_paged_context_fmha"] == "enable"


def test_a_qwen2_checkpoint_builds_through_the_qwen_converter(fakes, tmp_path):
    config = tmp_path / "qwen-config.json"
    entry = json.loads((CATALOG / "qwen2.5-7b-instruct.json").read_text())
    config.write_text(json.dumps(entry["config"]))
    checkpoint = fake_checkpoint(tmp_path, config)
    plan = gpu_engine_plan(str(checkpoint), "h100-sxm", dtype="bf16")
    assert plan.commands[0][1].endswith("examples/models/core/qwen/convert_checkpoint.py")
    # the fake converter parsed it: upstream's flags
    engine = Path(execute_engine_build(plan).engine_dir)
    config = json.loads((engine / "config.json").read_text())
    assert config["pretrained_config"]["architecture"] == "Qwen2ForCausalLM"


def test_engine_dir_with_files_the_toolkit_did_not_write_is_refused(fakes, checkpoint, tmp_path):
    stuff = tmp_path / "stuff"
    stuff.mkdir()
    (stuff / "thesis.tex").write_text("years of work")
    plan = gpu_engine_plan(str(checkpoint), "h100-sxm", engine_dir=stuff)
    with pytest.raises(
        EngineBuildError, match=f"{stuff} holds files this toolkit did not write"
    ) as err:
        execute_engine_build(plan)
    assert "--engine-dir" in err.value.hint
    assert (stuff / "thesis.tex").read_text() == "years of work" and calls(fakes) == 0
    empty = tmp_path / "empty"
    empty.mkdir()
    built = execute_engine_build(gpu_engine_plan(str(checkpoint), "h100-sxm", engine_dir=empty))
    assert (Path(built.engine_dir) / "rank0.engine").is_file()
    again = gpu_engine_plan(str(checkpoint), "h100-sxm", engine_dir=empty, max_seq_len=4096)
    assert not execute_engine_build(again).cached  # our own engine there: rebuilt in place


def test_engines_with_other_limits_get_their_own_folder(fakes, checkpoint):
    """Repository A's engine stays when repository B is built with other limits (default engine dirs)."""
    a = execute_engine_build(gpu_engine_plan(str(checkpoint), "h100-sxm", max_seq_len=4096))
    b_plan = gpu_engine_plan(str(checkpoint), "h100-sxm", max_seq_len=2048, max_batch_size=16)
    assert b_plan.engine_dir != a.engine_dir
    b = execute_engine_build(b_plan)
    assert read_engine_info(Path(a.engine_dir)).max_seq_len == 4096
    assert read_engine_info(Path(b.engine_dir)).max_batch_size == 16
    assert (
        json.loads((Path(a.engine_dir) / "toolkit_build.json").read_text())["cache_key"]
        == a.cache_key
    )


def test_a_killed_build_takes_its_tool_with_it(fakes, checkpoint, tmp_path, monkeypatch):
    """SIGKILL leaves no chance to clean up: the parent-death signal ends the running trtllm-build."""
    pid_file = tmp_path / "trtllm-build.pid"
    monkeypatch.setenv("FAKE_TRTLLM_SLEEP_S", "120")
    monkeypatch.setenv("FAKE_TRTLLM_PID_FILE", str(pid_file))
    script = (
        "import sys; from toolkit.engine import execute_engine_build; "
        "sys.path.insert(0, 'tests'); from repos import gpu_engine_plan; "
        f"execute_engine_build(gpu_engine_plan({str(checkpoint)!r}, 'h100-sxm'))"
    )
    repo = Path(__file__).parents[1]
    build = subprocess.Popen([sys.executable, "-c", script], cwd=repo, env=dict(os.environ))
    tool = None
    try:
        deadline = time.monotonic() + 60
        while not pid_file.exists() and build.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        assert pid_file.exists(), f"trtllm-build never started (build exit code {build.poll()})"
        tool = int(pid_file.read_text())
        build.kill()
        build.wait(10)
        deadline = time.monotonic() + 10
        while _running(tool) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not _running(tool), "trtllm-build outlived the killed build"
    finally:
        build.kill()
        if tool is not None and _running(tool):
            os.kill(tool, signal.SIGKILL)


def _running(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


def test_tp2_writes_one_engine_per_rank_and_serve_sees_world_size_2(fakes, checkpoint):
    result = execute_engine_build(gpu_engine_plan(str(checkpoint), "h100-sxm", tp=2))
    info = read_engine_info(Path(result.engine_dir))
    assert (info.tp_size, info.pp_size, info.world_size) == (2, 1, 2)
    assert {p.name for p in Path(result.engine_dir).glob("rank*.engine")} == {
        "rank0.engine",
        "rank1.engine",
    }


def test_tensorrt_llm_model_config_parses_and_matches_the_plan(fakes, checkpoint):

    plan = gpu_engine_plan(str(checkpoint), "h100-sxm", dtype="fp8", kv_dtype="fp8")
    engine = Path(execute_engine_build(plan).engine_dir)
    from toolkit.build_settings import BuildSettings
    from toolkit.model.sources import ResolvedModel
    from toolkit.repository.writer import plan_repository
    from toolkit.targets import get_target

    spec = TrtllmEngine.from_engine("h100-sxm", read_engine_info(engine))
    settings = BuildSettings(decoupled=True)
    repo_plan = plan_repository(
        ResolvedModel(checkpoint, f"local:{checkpoint}", None),
        spec,
        checkpoint.parent / "repo",
        RepositoryLimits.from_memory_plan(plan.memory),
        target="h100-sxm",
        settings=settings,
        capabilities=get_target("h100-sxm").capabilities(settings),
    )
    config = spec.config(repo_plan)
    parsed = parse_pbtxt(to_pbtxt(config))
    params = {k: v.string_value for k, v in parsed.parameters.items()}
    assert parsed.name == c.ENGINE and parsed.backend == "tensorrtllm"
    assert (
        parsed.max_batch_size
        == json.loads((engine / "config.json").read_text())["build_config"]["max_batch_size"]
    )
    assert parsed.model_transaction_policy.decoupled
    assert [i.name for i in parsed.input] == [t.name for t in c.ENGINE_INPUTS]
    assert [o.name for o in parsed.output] == [t.name for t in c.ENGINE_OUTPUTS]
    assert params["gpt_model_type"] == "inflight_fused_batching"
    assert params["gpt_model_path"] == str(engine.resolve())
    # the runtime sizes the pool (test_gpu_runtime)
    assert "max_tokens_in_paged_kv_cache" not in params
    assert params["kv_cache_free_gpu_mem_fraction"] == "0.9"
    assert params["enable_kv_cache_reuse"] == "true" and params["enable_chunked_context"] == "true"
    assert (
        params["batch_scheduler_policy"] == "max_utilization"
        and params["exclude_input_in_output"] == "true"
    )
    assert spec.runtime == plan.runtime.to_dict()  # the build record carries what the plan decided


def test_serve_preflight_accepts_a_matching_engine_and_refuses_others(
    fakes, checkpoint, monkeypatch
):
    engine = Path(execute_engine_build(gpu_engine_plan(str(checkpoint), "h100-sxm")).engine_dir)
    assert check_engine_compatible(engine).world_size == 1
    monkeypatch.setenv("FAKE_TRTLLM_VERSION", "0.19.0")
    with pytest.raises(
        EngineBuildError, match="built by TensorRT-LLM 0.20.0; this machine has 0.19.0"
    ) as err:
        check_engine_compatible(engine)
    assert "rebuild" in err.value.hint
    monkeypatch.setenv("FAKE_TRTLLM_VERSION", "0.20.0")
    monkeypatch.setenv("FAKE_GPU_SM", "8.0")
    with pytest.raises(EngineBuildError, match="built for GPU SM 9.0; this GPU is SM 8.0"):
        check_engine_compatible(engine)


def test_serve_preflight_without_trtllm_names_the_container(
    fakes, checkpoint, monkeypatch, tmp_path
):
    engine = Path(execute_engine_build(gpu_engine_plan(str(checkpoint), "h100-sxm")).engine_dir)
    bare = tmp_path / "bare"
    bare.mkdir()
    install_fake_trtllm(monkeypatch, bare, trtllm=False)
    with pytest.raises(EngineBuildError, match="TensorRT-LLM is not installed here") as err:
        check_engine_compatible(engine)
    assert "nvcr.io/nvidia/tritonserver:25.06-trtllm-python-py3" in err.value.hint


def test_build_refuses_without_trtllm_or_on_the_wrong_gpu(monkeypatch, tmp_path, checkpoint):
    install_fake_trtllm(monkeypatch, tmp_path, trtllm=False)
    plan = gpu_engine_plan(str(checkpoint), "h100-sxm")
    with pytest.raises(EngineBuildError, match="not installed") as err:
        execute_engine_build(plan)
    assert "trtllm-python-py3" in err.value.hint
    again = tmp_path / "with-trtllm"
    again.mkdir()
    install_fake_trtllm(monkeypatch, again, trtllm=True)
    monkeypatch.setenv("FAKE_GPU_SM", "8.0")
    with pytest.raises(
        EngineBuildError, match="--target h100-sxm is SM 9.0, but this machine's GPU is SM 8.0"
    ):
        execute_engine_build(plan)


def test_a_failing_tool_reports_its_log_tail(fakes, checkpoint, monkeypatch):
    plan = gpu_engine_plan(str(checkpoint), "h100-sxm", max_input_len=100, max_seq_len=200)
    # argparse keeps the last value: the fake trtllm-build then refuses input longer than max_seq_len
    bad = plan.commands[1] + ("--max_input_len", "300")
    broken = type(plan)(**{**plan.__dict__, "commands": (plan.commands[0], bad)})
    with pytest.raises(EngineBuildError, match="trtllm-build failed with exit code 1") as err:
        execute_engine_build(broken)
    assert "max_input_len must not exceed max_seq_len" in err.value.message
    assert not Path(plan.engine_dir).exists()


def test_config_only_checkpoint_cannot_be_built(fakes):
    plan = gpu_engine_plan(str(LLAMA_8B), "h100-sxm")
    with pytest.raises(Exception, match="no weights"):
        execute_engine_build(plan)
