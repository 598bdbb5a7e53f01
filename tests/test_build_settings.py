"""Build settings: one declaration each (toolkit/build_settings.py), and everything derived from it agrees:
the options, the recipe keys, the manifest's settings and the arguments that rebuild a repository."""

from __future__ import annotations

import json
import shlex
from dataclasses import fields

import pytest
from click.testing import CliRunner

from toolkit.build import BuildRequest, plan_build
from toolkit.build_settings import RECIPE_KEYS, SETTINGS, BuildSettings
from toolkit.cli.cmd_build import command as build_command
from toolkit.cli.main import cli
from toolkit.cli.options import pop_settings
from toolkit.errors import RecipeError
from toolkit.recipes import list_recipes, load_recipe, recipe_from_dict


def test_every_field_is_declared_once_and_options_do_not_collide():
    assert set(SETTINGS) == {f.name for f in fields(BuildSettings)}
    options = [o for p in build_command.params for o in (*p.opts, *p.secondary_opts)]
    assert len(options) == len(set(options)), "two options share a name"
    for row in SETTINGS.values():
        assert row.help and row.default and row.targets, row.name
        assert (row.kind is bool) == (row.negation is not None), row.name
        assert f"--{row.option}" in options, row.name
    assert len(RECIPE_KEYS) == len([r for r in SETTINGS.values() if r.recipe_key])


def _bad_value(row):
    """A value the row refuses, as text for the command line and as YAML for a recipe."""
    if row.choices:
        return "nonsense" if row.kind is str else "3", "nonsense" if row.kind is str else 3
    if row.minimum is not None:
        return str(int(row.minimum) - 1), int(row.minimum) - 1
    if row.above is not None:
        return str(row.above), row.above
    return None


@pytest.mark.parametrize("name", [n for n in SETTINGS if _bad_value(SETTINGS[n])])
def test_the_command_line_and_a_recipe_refuse_a_bad_value_with_the_same_rule(name, tmp_path):
    row = SETTINGS[name]
    text, value = _bad_value(row)
    target = "h100-sxm" if "gpu" in row.targets else sorted(row.targets)[0]
    result = CliRunner().invoke(cli, ["build", "-t", target, f"--{row.option}", text, "--dry-run"])
    assert result.exit_code != 0 and row.expected() in result.output, result.output
    section, key = row.recipe_key.split(".")
    with pytest.raises(RecipeError) as refused:
        recipe_from_dict(
            {"model": "m", "target": target, section: {key: value}}, tmp_path / "r.yaml"
        )
    assert row.expected() in refused.value.message and row.recipe_key in refused.value.message


def _rebuilt(plan) -> BuildSettings:
    """The settings a `toolkit build` with the plan's rebuild arguments resolves to."""
    args = ["--model", plan.recipe.model or "smollm2-135m-instruct", "--target", plan.target.name]
    args += plan.planned.settings.rebuild_arguments()
    params = dict(build_command.make_context("build", args).params)
    again = plan_build(
        BuildRequest(model=params["model"], target=params["target"], settings=pop_settings(params))
    )
    return again.planned.settings


@pytest.mark.parametrize("recipe", list_recipes())
def test_the_rebuild_arguments_of_each_recipe_plan_the_same_build(recipe, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # catalog models plan from the toolkit's own configs
    plan = plan_build(BuildRequest(recipe=recipe))
    resolved = plan.planned.settings.given()
    again = _rebuilt(plan).given()
    resolved.pop("engine_dir", None), again.pop("engine_dir", None)  # where it goes, not what it is
    assert again == resolved
    # Settings that only a recipe used to carry (no flag before) are among them on GPU targets.
    if plan.target.kind == "gpu":
        assert {"batch_scheduler_policy", "enable_kv_cache_reuse", "calib_size"} <= set(again)


def test_a_recipe_s_settings_survive_in_the_rebuild_hint(tmp_path):
    """serve's and the reader's hint rebuilt the cpu recipe's repository with the defaults (batch 8 -> 64,
    output 512 -> 1024, KV 16k -> 32k, queue 64 -> 256)."""
    from toolkit.repository.reader import rebuild_command

    plan = plan_build(BuildRequest(recipe="smollm2-135m-instruct-cpu", output=tmp_path / "r"))
    hint = rebuild_command(
        {
            "model": {"source": plan.model.source},
            "target": "cpu",
            "settings": plan.planned.settings.to_dict(),
        },
        tmp_path / "r",
    )
    words = shlex.split(hint)
    recipe = load_recipe("smollm2-135m-instruct-cpu").settings
    for flag, value in (
        ("--max-batch-size", recipe.max_batch_size),
        ("--max-output-len", recipe.max_output_len),
        ("--kv-cache-tokens", recipe.kv_cache_tokens),
        ("--max-queue-size", recipe.max_queue_size),
    ):
        assert words[words.index(flag) + 1] == str(value), hint


def test_a_setting_given_for_a_target_it_does_not_apply_to_is_named_with_its_targets():
    result = CliRunner().invoke(
        cli, ["build", "-t", "synthetic", "--num-threads", "2", "--dry-run"]
    )
    assert result.exit_code == 1
    assert (
        "--num-threads does not apply to --target synthetic (only to cpu targets)" in result.output
    )
    assert "fix: drop --num-threads" in result.output


def test_no_option_reads_an_environment_variable_it_does_not_declare():
    """click's auto_envvar_prefix made every option an environment variable no help showed."""
    env = {"TOOLKIT_BUILD_MAX_BATCH_SIZE": "3", "TOOLKIT_BUILD_TARGET": "synthetic"}
    result = CliRunner().invoke(cli, ["build", "--dry-run", "--json"], env=env)
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["target"] == "cpu" and data["limits"]["max_batch_size"] == 64
    shown = CliRunner().invoke(cli, ["serve", "-h"]).output
    assert "TOOLKIT_REPO" in shown and "TOOLKIT_API_HEADER_TIMEOUT" in shown
