"""FP8 / int4-awq calibration: a local dataset instead of the hub's cnn_dailymail, and the bf16 checkpoint
spread over the GPUs of the build, with its memory in the plan."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from toolkit.build_settings import SETTINGS
from toolkit.cli.main import cli
from toolkit.errors import EngineBuildError

from fakes import fake_checkpoint, install_fake_trtllm
from fakes.upstream_argparse import upstream_flags
from repos import gpu_engine_plan
from tiny import make_tiny_checkpoint

DATA = Path(__file__).parent / "data"
LLAMA_8B = DATA / "llama-3.1-8b-instruct" / "config.json"
LLAMA_70B = "llama-3.1-70b-instruct"


@pytest.fixture
def dataset(tmp_path) -> Path:
    """A local calibration set as quantize.py reads one: a folder datasets.load_dataset opens, with a
    `text` column in its train split."""
    folder = tmp_path / "calibration"
    folder.mkdir()
    rows = [{"text": f"calibration sample {i}: the quick brown fox"} for i in range(8)]
    (folder / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return folder


def _quantize_argv(plan) -> list[str]:
    return next(list(argv) for argv in plan.commands if argv[1].endswith("quantize.py"))


def _value(argv: list[str], flag: str) -> str | None:
    return argv[argv.index(flag) + 1] if flag in argv else None


def test_calib_dataset_is_one_build_setting_and_the_quantizer_reads_it_offline(dataset):
    row = SETTINGS["calib_dataset"]
    assert row.kind is Path and row.recipe_key == "quantization.calib_dataset"
    assert upstream_flags("quantize.py")["calib_dataset"]["default"] == "cnn_dailymail"
    plan = gpu_engine_plan(
        str(LLAMA_8B), "h100-sxm", dtype="fp8", kv_dtype="fp8", calib_dataset=dataset
    )
    argv = _quantize_argv(plan)
    assert _value(argv, "--calib_dataset") == str(dataset.resolve())
    # the quantize step runs with the hub and datasets offline: it can reach no network
    env = dict(plan.step_environment[plan.step_names.index("quantize")])
    assert env["HF_DATASETS_OFFLINE"] == "1" and env["HF_HUB_OFFLINE"] == "1"


def test_without_a_dataset_calibration_downloads_cnn_dailymail_and_offline_that_is_refused_first(
    monkeypatch, tmp_path
):
    """The plan says where the calibration data comes from; a build with the hub offline is refused in
    its preflight, before the checkpoint's download and before any tool runs."""
    plan = gpu_engine_plan(str(LLAMA_8B), "h100-sxm", dtype="fp8", kv_dtype="fp8")
    assert "--calib_dataset" not in _quantize_argv(plan)  # quantize.py's default: the hub's
    assert (plan.calibration.dataset, plan.calibration.offline) == ("cnn_dailymail", False)
    calls = install_fake_trtllm(monkeypatch, tmp_path)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    downloads: list = []
    monkeypatch.setattr("toolkit.build.resolve_model", lambda spec, **_: downloads.append(spec))
    args = ["build", "-t", "h100-sxm", "-m", "llama-3.1-8b-instruct", "--dtype", "fp8"]
    result = CliRunner().invoke(cli, [*args, "-o", str(tmp_path / "repo")])
    assert result.exit_code == 1 and downloads == [] and not calls.exists()
    assert "cnn_dailymail" in result.stderr and "HF_HUB_OFFLINE" in result.stderr
    assert "--calib-dataset" in result.stderr
    # a bf16 build calibrates nothing
    assert gpu_engine_plan(str(LLAMA_8B), "h100-sxm", dtype="bf16").calibration is None


@pytest.mark.parametrize(
    ("make", "said"),
    [
        (lambda base: base / "missing", "does not exist"),
        (lambda base: _file(base / "one.jsonl", '{"text": "x"}\n'), "not a folder"),
        (lambda base: _folder(base / "no-text", "train.jsonl", '{"prompt": "x"}\n'), "text"),
        (lambda base: _folder(base / "empty", "notes.md", "# nothing\n"), "no data file"),
        (
            lambda base: _folder(base / "my_cnn_dailymail_copy", "train.jsonl", '{"text": "x"}\n'),
            "cnn_dailymail",
        ),
    ],
)
def test_a_calibration_dataset_quantize_py_could_not_read_is_refused_naming_it(
    tmp_path, make, said
):
    path = make(tmp_path)
    with pytest.raises(EngineBuildError) as err:
        gpu_engine_plan(str(LLAMA_8B), "h100-sxm", dtype="fp8", calib_dataset=path)
    assert str(path) in err.value.message and said in err.value.message
    assert err.value.hint


def _file(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def _folder(path: Path, name: str, text: str) -> Path:
    path.mkdir()
    (path / name).write_text(text)
    return path


def test_an_offline_fp8_build_with_a_local_dataset_runs_and_records_it(
    monkeypatch, tmp_path, dataset
):
    """Through the fake tools (which, like the real quantize.py, cannot fetch cnn_dailymail offline)."""
    calls = install_fake_trtllm(monkeypatch, tmp_path)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    checkpoint = fake_checkpoint(tmp_path, LLAMA_8B)
    tiny = make_tiny_checkpoint(tmp_path / "tiny")
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (checkpoint / name).write_bytes((tiny / name).read_bytes())
    out = tmp_path / "repo"
    args = ["build", "-t", "h100-sxm", "-m", str(checkpoint), "-o", str(out), "--dtype", "fp8"]
    refused = CliRunner().invoke(cli, args)
    assert refused.exit_code == 1 and "cnn_dailymail" in refused.stderr
    assert not calls.exists()  # refused before any tool ran
    result = CliRunner().invoke(cli, [*args, "--calib-dataset", str(dataset)])
    assert result.exit_code == 0, result.output
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["settings"]["calib_dataset"] == str(dataset.resolve())


def test_calibration_spreads_the_checkpoint_over_the_builds_gpus_and_the_plan_says_how_much_each_holds():
    plan = gpu_engine_plan(LLAMA_70B, "h100-sxm", dtype="fp8", kv_dtype="fp8", tp=4)
    calibration = plan.calibration
    assert calibration.gpus == 4 and _value(_quantize_argv(plan), "--device_map") == "auto"
    checkpoint = plan.memory.parameter_count * 2  # bf16
    assert calibration.checkpoint_bytes == checkpoint
    assert calibration.bytes_per_gpu >= checkpoint / 4
    assert calibration.bytes_per_gpu < plan.memory.gpu_memory_bytes


def test_a_calibration_that_cannot_fit_on_the_builds_gpus_is_refused_with_the_gpus_it_needs():
    """70B at TP 1: 141 GB of bf16 weights to calibrate, one 85.5 GB card."""
    with pytest.raises(EngineBuildError) as err:
        gpu_engine_plan(LLAMA_70B, "h100-sxm", dtype="fp8", kv_dtype="fp8", tp=1)
    assert "141.1" in err.value.message and "1 GPU" in err.value.message
    assert "--calib-gpus 2" in err.value.hint
    plan = gpu_engine_plan(LLAMA_70B, "h100-sxm", dtype="fp8", kv_dtype="fp8", tp=1, calib_gpus=2)
    assert plan.calibration.gpus == 2 and plan.memory.world_size == 1
    recipe = gpu_engine_plan(LLAMA_70B, None, recipe="llama-3.1-70b-instruct-h100-sxm-fp8")
    assert recipe.memory.tp_size == 1 and recipe.calibration.gpus == 2
