"""`toolkit build`: checkpoint -> Triton model repository, for every target (toolkit.build does the work)."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from toolkit.build import BuildRequest, build_repository, plan_build
from toolkit.cli.options import (
    dry_run_option,
    json_option,
    model_option,
    output_option,
    pop_settings,
    setting_options,
)
from toolkit.cli.render import emit_json, emit_table, note, plan_rows
from toolkit.model.spec import EMBEDDED_DEFAULT
from toolkit.plan.memory import MemoryPlan
from toolkit.targets import DEFAULT_TARGET, TARGET_NAMES


@click.command("build")
@model_option(
    f"{EMBEDDED_DEFAULT}, a catalog name, hf:ORG/NAME[@REV], ORG/NAME, or a local folder [default: the "
    f"recipe's, else {EMBEDDED_DEFAULT}].",
    default=None,
)
@click.option(
    "-t",
    "--target",
    default=None,
    help=f"One of: {', '.join(TARGET_NAMES)} [default: the recipe's, else {DEFAULT_TARGET}].",
)
@click.option(
    "-r",
    "--recipe",
    default=None,
    help="A recipe name from build/ or a YAML path; it names the model and target.",
)
@output_option(
    Path("model_repository"),
    "Repository folder to write (only an empty folder or a toolkit repository is replaced).",
)
@setting_options()
@click.option(
    "--discard-changes",
    is_flag=True,
    help="Rebuild over a repository whose files were edited, added or removed since it was built "
    "(those changes are lost; without this flag the build refuses and lists them).",
)
@click.option(
    "--allow-pickle",
    is_flag=True,
    help="Accept .bin/.pt weights (pickles can run code when loaded).",
)
@dry_run_option("Print the plan (and, for GPUs, the exact commands); write nothing.")
@json_option
def command(model, target, recipe, output, discard_changes, allow_pickle, dry_run, as_json, **rest):
    """Build a Triton model repository from a checkpoint: a CPU engine, the synthetic engine,
    or TensorRT-LLM engines."""
    request = BuildRequest(
        output=output,
        model=model,
        target=target,
        recipe=recipe,
        settings=pop_settings(rest),
        allow_pickle=allow_pickle,
        discard_changes=discard_changes,
    )
    if dry_run:
        data = {"dry_run": True, **plan_build(request).to_dict()}
        return emit_json(data) if as_json else _print(data, "build plan (dry run)")
    bars = sys.stderr.isatty() and not as_json  # download and conversion bars only on a terminal
    result = build_repository(request, progress=note, bars=bars)
    data = result.to_dict()
    if result.repository.interrupted_after_swap:
        note("[yellow]interrupted after the new repository was in place: it is complete[/]")
    if as_json:
        return emit_json(data)
    if result.repository.skipped:
        note(
            f"{result.repository.path} is up to date (build key {result.repository.key}); nothing to do"
        )
    _print(data, "repository")
    note(f"serve it with: toolkit serve --repo {result.repository.path}")


def _print(data: dict, title: str) -> None:
    commands = [*(data.pop("commands", None) or ()), *data.pop("lora_conversion", ())]
    adapters = data.pop("adapters", ())
    hidden = ("plan", "settings", "capabilities")
    emit_table(title, [(key, value) for key, value in data.items() if key not in hidden])
    if adapters:
        emit_table("LoRA adapters", [(a["name"], _adapter_line(a)) for a in adapters])
    if "plan" in data:
        emit_table("memory plan", plan_rows(MemoryPlan(**data["plan"])))
    for argv in commands or ():
        note("$ " + " ".join(argv))


def _adapter_line(adapter: dict) -> str:
    revision = f"@{adapter['revision']}" if adapter.get("revision") else ""
    return (
        f"task id {adapter['task_id']}, rank {adapter['rank']} (alpha {adapter['alpha']:g}), "
        f"{', '.join(adapter['target_modules'])}: {adapter['source']}{revision}"
    )
