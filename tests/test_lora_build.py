"""LoRA adapters at build time (issue 19): --lora NAME=PATH and recipes' `lora:`, each adapter checked
against the base model before anything slow, the manifest's `adapters` section, capabilities.lora, and
the CPU/synthetic repositories' lora/<task id>/ folders and engine parameters. Adapters are made in the
test with peft (tests/lora_adapters.py) on the tiny checkpoint of tests/tiny.py."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from toolkit.build import BuildRequest, plan_build
from toolkit.build_settings import SETTINGS, BuildSettings
from toolkit.cli.main import cli
from toolkit.errors import AdapterError, RecipeError
from toolkit.model.adapters import Adapter
from toolkit.recipes import load_recipe
from toolkit.repository.reader import open_repository

from lora_adapters import make_lora_adapter, make_two_adapters
from repos import write_test_repository
from tiny import make_tiny_checkpoint, tiny_llama_config


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    """A tiny checkpoint, two adapters of it, and an adapter of another (wider) checkpoint."""
    root = tmp_path_factory.mktemp("lora")
    checkpoint = make_tiny_checkpoint(root / "checkpoint")
    adapters = make_two_adapters(checkpoint, root / "adapters")
    other = _wider_checkpoint(root / "other")
    return checkpoint, adapters, make_lora_adapter(other, root / "other-adapter")


def _wider_checkpoint(folder: Path) -> Path:
    """The tiny checkpoint with hidden size 48: an adapter of it has other shapes."""
    import torch
    from transformers import LlamaForCausalLM

    config = tiny_llama_config(64, hidden_size=48)
    torch.manual_seed(0)
    LlamaForCausalLM(config).save_pretrained(folder)
    return folder


def _pairs(adapters: dict[str, Path]) -> tuple[tuple[str, str], ...]:
    return tuple((name, str(folder)) for name, folder in adapters.items())


def _copy(adapter: Path, folder: Path) -> Path:
    shutil.copytree(adapter, folder)
    return folder


def _plan(checkpoint: Path, lora, target: str = "cpu"):
    return plan_build(BuildRequest.make(model=str(checkpoint), target=target, lora=lora))


@pytest.fixture(scope="module")
def repo(made, tmp_path_factory):
    checkpoint, adapters, _ = made
    return write_test_repository(
        checkpoint, tmp_path_factory.mktemp("repo") / "repo", lora=_pairs(adapters)
    )


# --- the repository ---------------------------------------------------------------------------
def test_a_cpu_repository_carries_each_adapter_in_its_task_folder_with_the_engine_parameters(
    repo, made
):
    _, adapters, _ = made
    opened = open_repository(repo)
    assert [(a.name, a.task_id) for a in opened.adapters] == [("alpha", 1), ("beta", 2)]
    alpha, beta = opened.adapters
    assert (alpha.rank, alpha.alpha, alpha.target_modules) == (4, 8.0, ("q_proj", "v_proj"))
    assert beta.rank == 8 and set(beta.target_modules) == {
        "q_proj",
        "k_proj",
        "v_proj",
        "o_proj",
        "gate_proj",
        "up_proj",
        "down_proj",
    }
    assert alpha.source == f"local:{adapters['alpha']}" and alpha.revision is None
    for adapter in opened.adapters:
        folder = repo / "tensorrt_llm" / "1" / "lora" / str(adapter.task_id)
        assert sorted(p.name for p in folder.iterdir()) == sorted(adapter.files)
        source = adapters[adapter.name]
        for name, digest in adapter.files.items():
            assert (folder / name).read_bytes() == (source / name).read_bytes()
            assert (
                opened.manifest.files[f"tensorrt_llm/1/lora/{adapter.task_id}/{name}"].sha256
                == digest
            )
    assert not (repo / "lora").exists()  # Triton would take a root folder for a model
    assert opened.capabilities.lora == ("alpha", "beta") and opened.capabilities.supports("lora")
    parameters = _parameters(repo / "tensorrt_llm" / "config.pbtxt")
    assert parameters["lora_dir"] == "lora"
    assert json.loads(parameters["lora_adapters"]) == {"1": "alpha", "2": "beta"}
    assert parameters["lora_max_rank"] == "8"
    assert not opened.file_changes()


def _parameters(config: Path) -> dict[str, str]:
    from google.protobuf import text_format
    from tritonclient.grpc import model_config_pb2 as mc

    parsed = text_format.Parse(config.read_text(), mc.ModelConfig())
    return {key: value.string_value for key, value in parsed.parameters.items()}


def test_a_repository_without_adapters_says_how_to_add_one(made, tmp_path):
    checkpoint, _, _ = made
    repo = write_test_repository(checkpoint, tmp_path / "repo")
    opened = open_repository(repo)
    assert opened.adapters == () and opened.capabilities.lora == ()
    assert not opened.capabilities.supports("lora")
    assert "--lora NAME=PATH" in opened.capabilities.refusal("lora")
    parameters = _parameters(repo / "tensorrt_llm" / "config.pbtxt")
    assert (parameters["lora_adapters"], parameters["lora_max_rank"]) == ("{}", "0")


def test_the_synthetic_target_accepts_the_adapter_ids(made, tmp_path):
    checkpoint, adapters, _ = made
    repo = write_test_repository(
        checkpoint, tmp_path / "syn", synthetic=True, lora=_pairs(adapters)
    )
    opened = open_repository(repo)
    assert opened.capabilities.lora == ("alpha", "beta")
    assert (repo / "tensorrt_llm" / "1" / "lora" / "2" / "adapter_config.json").is_file()
    assert json.loads(_parameters(repo / "tensorrt_llm" / "config.pbtxt")["lora_adapters"]) == {
        "1": "alpha",
        "2": "beta",
    }


def test_a_changed_adapter_file_changes_the_build_key(made, tmp_path):
    checkpoint, adapters, _ = made
    alpha = _copy(adapters["alpha"], tmp_path / "alpha")
    first = write_test_repository(checkpoint, tmp_path / "repo", lora=(("alpha", str(alpha)),))
    key = open_repository(first).manifest.build_key
    make_lora_adapter(checkpoint, tmp_path / "alpha2", seed=9)
    shutil.copy(tmp_path / "alpha2" / "adapter_model.safetensors", alpha)
    again = write_test_repository(checkpoint, tmp_path / "repo", lora=(("alpha", str(alpha)),))
    assert open_repository(again).manifest.build_key != key


def test_the_manifest_adapter_record_round_trips():
    record = Adapter("a", 1, "hf:org/x", "0" * 40, 16, 32.0, ("q_proj",), {"f": "d"})
    assert Adapter.from_dict(json.loads(json.dumps(record.to_dict()))) == record


# --- the setting: command line, recipes, rebuild arguments --------------------------------------
def test_the_command_line_takes_repeated_lora_options_and_shows_the_adapters_in_the_dry_run(made):
    checkpoint, adapters, _ = made
    args = ["build", "-t", "cpu", "-m", str(checkpoint), "--dry-run", "--json"]
    for name, folder in adapters.items():
        args += ["--lora", f"{name}={folder}"]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output
    shown = json.loads(result.output)
    assert [a["name"] for a in shown["adapters"]] == ["alpha", "beta"]
    assert shown["settings"]["lora"] == {n: str(f) for n, f in adapters.items()}
    assert shown["capabilities"]["lora"] == ["alpha", "beta"]


@pytest.mark.parametrize("value", ["alpha", "=x", "-bad=x", "a b=x", "alpha="])
def test_a_malformed_lora_option_names_the_form(value):
    result = CliRunner().invoke(cli, ["build", "-t", "cpu", "--lora", value, "--dry-run"])
    assert result.exit_code != 0 and "NAME=PATH" in result.output, result.output


def test_the_same_name_twice_is_refused(made):
    checkpoint, adapters, _ = made
    with pytest.raises(RecipeError, match="each NAME once"):
        _plan(checkpoint, (("a", str(adapters["alpha"])), ("a", str(adapters["beta"]))))


def test_the_rebuild_arguments_give_the_same_adapters(made):
    checkpoint, adapters, _ = made
    settings = _plan(checkpoint, _pairs(adapters)).planned.settings
    words = settings.rebuild_arguments()
    assert words[words.index("--lora") : words.index("--lora") + 4] == [
        "--lora",
        f"alpha={adapters['alpha']}",
        "--lora",
        f"beta={adapters['beta']}",
    ]
    assert BuildSettings.from_dict(json.loads(json.dumps(settings.to_dict()))) == settings


def test_a_recipe_lists_adapters_by_name_relative_to_its_folder(made, tmp_path):
    checkpoint, adapters, _ = made
    _copy(adapters["alpha"], tmp_path / "adapters" / "alpha")
    recipe = tmp_path / "r.yaml"
    recipe.write_text(
        f"model: {checkpoint}\ntarget: cpu\nlora:\n  alpha: adapters/alpha\n  beta: {adapters['beta']}\n"
    )
    loaded = load_recipe(str(recipe))
    assert loaded.settings.lora == (
        ("alpha", str(tmp_path / "adapters" / "alpha")),
        ("beta", str(adapters["beta"])),
    )
    planned = plan_build(BuildRequest(recipe=str(recipe))).planned
    assert [a.adapter.name for a in planned.adapters] == ["alpha", "beta"]


def test_a_recipe_lora_that_is_not_a_mapping_is_refused(tmp_path):
    recipe = tmp_path / "r.yaml"
    recipe.write_text("model: m\ntarget: cpu\nlora: [a, b]\n")
    with pytest.raises(RecipeError, match="lora must be NAME=PATH"):
        load_recipe(str(recipe))


def test_the_setting_is_declared_once():
    row = SETTINGS["lora"]
    assert row.multiple and row.recipe_key == "lora" and row.flag == "--lora"
    assert row.parse_text(" a = /x ") == ("a", "/x")


# --- checked against the base model before anything slow ---------------------------------------
def _refused(checkpoint: Path, name: str, folder: Path, tmp_path: Path) -> AdapterError:
    """The error of a build with this adapter: raised by the plan, before any output is written."""
    output = tmp_path / "never-written"
    with pytest.raises(AdapterError) as refused:
        from toolkit.build import build_repository

        build_repository(
            BuildRequest.make(
                model=str(checkpoint), target="cpu", output=output, lora=((name, str(folder)),)
            )
        )
    assert not output.exists()
    assert refused.value.hint and f"--lora {name}=" in refused.value.message
    return refused.value


def _edit_config(folder: Path, **changes) -> None:
    path = folder / "adapter_config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), **changes}))


def test_an_adapter_of_another_base_model_is_refused_naming_both(made, tmp_path):
    checkpoint, adapters, _ = made
    folder = _copy(adapters["alpha"], tmp_path / "a")
    _edit_config(folder, base_model_name_or_path="meta-llama/Llama-3.1-8B-Instruct")
    error = _refused(checkpoint, "a", folder, tmp_path)
    assert "meta-llama/Llama-3.1-8B-Instruct" in error.message and str(checkpoint) in error.message
    assert "--model meta-llama/Llama-3.1-8B-Instruct" in error.hint


def test_an_adapter_of_other_hidden_sizes_is_refused_naming_the_shapes(made, tmp_path):
    checkpoint, _, other = made
    folder = _copy(other, tmp_path / "o")
    _edit_config(
        folder, base_model_name_or_path=str(checkpoint)
    )  # a name that fits, shapes that do not
    error = _refused(checkpoint, "o", folder, tmp_path)
    assert "lora_A has shape [4, 48]" in error.message and "[4, 32]" in error.message


def test_a_rank_other_than_the_config_says_is_refused(made, tmp_path):
    checkpoint, adapters, _ = made
    folder = _copy(adapters["alpha"], tmp_path / "a")
    _edit_config(folder, r=2)
    error = _refused(checkpoint, "a", folder, tmp_path)
    assert "r = 2" in error.message and "[4, 32]" in error.message


def test_a_target_module_the_base_model_lacks_is_refused(made, tmp_path):
    from safetensors.numpy import load_file, save_file

    checkpoint, adapters, _ = made
    folder = _copy(adapters["alpha"], tmp_path / "a")
    weights = folder / "adapter_model.safetensors"
    renamed = {k.replace("q_proj", "qkv_proj"): v for k, v in load_file(weights).items()}
    save_file(renamed, weights)
    error = _refused(checkpoint, "a", folder, tmp_path)
    assert "'qkv_proj'" in error.message and "q_proj" in error.hint


@pytest.mark.parametrize("damage", ["truncated", "garbage", "missing", "pickle-only"])
def test_a_corrupt_or_missing_weights_file_is_refused(made, tmp_path, damage):
    checkpoint, adapters, _ = made
    folder = _copy(adapters["alpha"], tmp_path / "a")
    weights = folder / "adapter_model.safetensors"
    if damage == "truncated":
        weights.write_bytes(weights.read_bytes()[:-100])
    elif damage == "garbage":
        weights.write_bytes(b"\x00" * 64)
    else:
        weights.unlink()
        if damage == "pickle-only":
            (folder / "adapter_model.bin").write_bytes(b"pickle")
    error = _refused(checkpoint, "a", folder, tmp_path)
    assert "adapter_model.safetensors" in error.message
    if damage == "pickle-only":
        assert "pickle" in error.message and "safe_serialization" in error.hint


@pytest.mark.parametrize(
    "change,named",
    [
        ({"use_dora": True}, "use_dora"),
        ({"peft_type": "IA3"}, "IA3"),
        ({"r": "four"}, "r = 'four'"),
        ({"bias": "all"}, "bias"),
        ({"modules_to_save": ["lm_head"]}, "modules_to_save"),
    ],
)
def test_adapter_configs_no_target_serves_are_refused(made, tmp_path, change, named):
    checkpoint, adapters, _ = made
    folder = _copy(adapters["alpha"], tmp_path / "a")
    _edit_config(folder, **change)
    assert named in _refused(checkpoint, "a", folder, tmp_path).message


def test_a_broken_config_a_missing_folder_and_the_base_models_own_name_are_refused(made, tmp_path):
    checkpoint, adapters, _ = made
    folder = _copy(adapters["alpha"], tmp_path / "a")
    (folder / "adapter_config.json").write_text("{not json")
    assert "not valid JSON" in _refused(checkpoint, "a", folder, tmp_path).message
    assert "does not exist" in _refused(checkpoint, "a", tmp_path / "nowhere", tmp_path).message
    # the tiny checkpoint is served as model id "checkpoint" (its folder's name)
    error = _refused(checkpoint, "checkpoint", adapters["alpha"], tmp_path)
    assert "base model's own model id" in error.message


def test_the_cli_prints_the_error_and_the_fix(made, tmp_path):
    checkpoint, adapters, _ = made
    folder = _copy(adapters["alpha"], tmp_path / "a")
    _edit_config(folder, base_model_name_or_path="org/other-model")
    result = CliRunner().invoke(
        cli, ["build", "-t", "cpu", "-m", str(checkpoint), "--lora", f"a={folder}", "--dry-run"]
    )
    assert result.exit_code == 1
    assert "Error: --lora a=" in result.output and "org/other-model" in result.output
    assert "fix: " in result.output


# --- deploy: the fingerprint covers the adapters, the build Job cannot reach local ones -------------
def test_the_fingerprint_covers_the_adapters_files_and_the_job_refuses_local_adapters(
    repo, made, tmp_path
):
    from toolkit.deploy.fingerprint import fingerprint
    from toolkit.deploy.reproduce import check_adapters_reachable
    from toolkit.errors import DeployError

    checkpoint, adapters, _ = made
    opened = open_repository(repo)
    alpha = _copy(adapters["alpha"], tmp_path / "alpha")
    beta = make_lora_adapter(checkpoint, tmp_path / "beta", rank=8, seed=5)  # other weights
    other = write_test_repository(
        checkpoint, tmp_path / "other", lora=(("alpha", str(alpha)), ("beta", str(beta)))
    )
    assert fingerprint(open_repository(other).manifest) != fingerprint(opened.manifest)
    with pytest.raises(DeployError) as refused:
        check_adapters_reachable(opened)  # (the local base model is refused too, before)
    assert "alpha (local:" in refused.value.message and "hf:ORG/NAME@REV" in refused.value.hint


def test_a_hub_adapter_is_fetched_at_its_revision_and_recorded_with_the_commit(
    made, tmp_path, monkeypatch
):
    """hf:ORG/NAME@REV: the two adapter files are fetched (the hub is faked: its snapshot folder is named by the
    commit, as huggingface_hub's cache names it), the manifest records the commit, the rebuild pins it."""
    import toolkit.model.sources as sources

    checkpoint, adapters, _ = made
    commit = "a" * 40
    snapshot = _copy(adapters["alpha"], tmp_path / "snapshots" / commit)
    asked = []

    def fake_download(repo_id, revision, patterns):
        asked.append((repo_id, revision, sorted(patterns)))
        return snapshot

    monkeypatch.setattr(sources, "download_snapshot", fake_download)
    planned = _plan(checkpoint, (("alpha", "hf:org/tiny-alpha@main"),)).planned
    assert asked == [
        ("org/tiny-alpha", "main", ["adapter_config.json", "adapter_model.safetensors"])
    ]
    adapter = planned.adapters[0].adapter
    assert (adapter.source, adapter.revision) == ("hf:org/tiny-alpha", commit)
    assert planned.settings.lora == (("alpha", f"hf:org/tiny-alpha@{commit}"),)
    with pytest.raises(AdapterError, match="not a Hugging Face id"):
        _plan(checkpoint, (("alpha", "hf:not an id"),))
