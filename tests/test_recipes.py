"""Build recipes in build/: all valid; unknown or wrong keys are named with the file."""

from __future__ import annotations

import re

import pytest

from toolkit.errors import RecipeError
from toolkit.recipes import list_recipes, load_recipe


def test_the_checked_in_recipes_load():
    names = list_recipes()
    assert {
        "llama-3.1-8b-instruct-h100-sxm-fp8",
        "llama-3.1-8b-instruct-h100-sxm-bf16",
        "smollm2-135m-instruct-cpu",
    } <= set(names)
    for name in names:
        load_recipe(name)
    fp8 = load_recipe("llama-3.1-8b-instruct-h100-sxm-fp8")
    settings = fp8.settings
    assert (fp8.target, settings.dtype, settings.kv_dtype, settings.tp, settings.max_seq_len) == (
        "h100-sxm",
        "fp8",
        "fp8",
        1,
        8192,
    )
    assert settings.max_batch_size is None  # left to the planner
    assert load_recipe("smollm2-135m-instruct-cpu").target == "cpu"


def write(tmp_path, text):
    path = tmp_path / "r.yaml"
    path.write_text(text)
    return path


def test_unknown_key_is_named_with_the_file(tmp_path):
    path = write(tmp_path, "model: x\ntarget: h100-sxm\nbatching:\n  max_batchsize: 8\n")
    with pytest.raises(RecipeError) as err:
        load_recipe(path)
    assert "'batching.max_batchsize'" in err.value.message and str(path) in err.value.message


def test_unknown_top_level_key(tmp_path):
    with pytest.raises(RecipeError, match="unknown key 'quantisation'"):
        load_recipe(write(tmp_path, "model: x\ntarget: h100-sxm\nquantisation: {dtype: fp8}\n"))


def test_wrong_value_is_named(tmp_path):
    with pytest.raises(RecipeError, match=r"quantization.dtype must be one of .* got 'int8'"):
        load_recipe(write(tmp_path, "model: x\ntarget: h100-sxm\nquantization: {dtype: int8}\n"))
    with pytest.raises(RecipeError, match="parallelism.tp must be"):
        load_recipe(write(tmp_path, "model: x\ntarget: h100-sxm\nparallelism: {tp: 3}\n"))
    with pytest.raises(RecipeError, match="target must be one of"):
        load_recipe(write(tmp_path, "model: x\ntarget: h800\n"))


def test_missing_model_and_inconsistent_values(tmp_path):
    with pytest.raises(RecipeError, match="missing required key 'model'"):
        load_recipe(write(tmp_path, "target: h100-sxm\n"))
    with pytest.raises(RecipeError, match="no FP8"):
        load_recipe(write(tmp_path, "model: x\ntarget: a100-80gb\nquantization: {dtype: fp8}\n"))
    with pytest.raises(RecipeError, match="cpu target"):
        load_recipe(write(tmp_path, "model: x\ntarget: cpu\nquantization: {dtype: fp8}\n"))


def test_unknown_recipe_name_lists_the_known_ones():
    with pytest.raises(RecipeError) as err:
        load_recipe("nope")
    assert "llama-3.1-8b-instruct-h100-sxm-fp8" in err.value.hint


def test_what_a_recipe_comment_says_the_planner_picks_is_what_it_picks(monkeypatch):
    """A recipe without tp that names the TP the planner takes in its comment must name the right one."""
    from toolkit.build import BuildRequest, plan_build
    from toolkit.recipes import recipes_dir

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    checked = 0
    for name in list_recipes():
        text = (recipes_dir() / f"{name}.yaml").read_text()
        header = " ".join(line.lstrip("# ") for line in text.splitlines() if line.startswith("#"))
        said = re.search(r"smallest tensor-parallel size that fits \((\d+) here", header)
        if said:
            plan = plan_build(BuildRequest.make(recipe=name)).planned.memory
            assert plan.tp_size == int(said.group(1)), (
                f"{name}: the comment says TP {said.group(1)}"
            )
            checked += 1
    assert checked
