"""`toolkit plan`: how a model fits on a GPU, and how fast it can be at best."""

from __future__ import annotations

import click

from toolkit.cli.options import json_option, model_option, pop_settings, setting_options
from toolkit.cli.render import emit_json, emit_table, estimate_rows, note, plan_rows
from toolkit.model.catalog import catalog_names
from toolkit.plan.estimate import estimate_for_plan
from toolkit.plan.gpus import GPU_PROFILES
from toolkit.plan.source import load_model_for_plan
from toolkit.targets import gpu_target

# The build settings that shape a memory plan (the rest only change the engine's build or serving).
PLAN_SETTINGS = (
    "dtype",
    "kv_dtype",
    "tp",
    "pp",
    "max_seq_len",
    "max_input_len",
    "max_batch_size",
    "max_num_tokens",
    "target_input_len",
    "target_output_len",
)


@click.command("plan")
@model_option(
    f"A catalog name ({', '.join(catalog_names())}: no network needed), config.json, a checkpoint "
    "folder, hf:ORG/NAME, or smollm2-135m-instruct. No weights are read.",
    required=True,
)
@click.option(
    "-g", "--gpu", type=click.Choice(list(GPU_PROFILES)), default="h100-sxm", help="GPU profile."
)
@setting_options(*PLAN_SETTINGS)
@click.option(
    "-c",
    "--concurrency",
    type=click.IntRange(min=1),
    default=None,
    help="Requests in flight for the estimate, each of --target-input-len prompt and "
    "--target-output-len output tokens [default: the batch the plan sizes for].",
)
@json_option
def command(model, gpu, concurrency, as_json, **rest) -> None:
    """Plan memory (weights, KV cache, batch), the speed-of-light bounds and the estimated TTFT, TPOT
    and tokens/s for MODEL on GPU."""
    settings = pop_settings(rest)
    target = gpu_target(gpu)
    target.check_settings(settings, lambda row: row.flag)
    source = load_model_for_plan(model)
    plan = target.plan_memory(settings, source)
    estimate = estimate_for_plan(source.facts, plan, concurrency)
    if as_json:
        emit_json(
            {**plan.to_dict(), "estimate": estimate.to_dict(), "config_from": source.config_from}
        )
        return
    title = f"{plan.model} on {plan.gpu} ({plan.dtype}, KV {plan.kv_dtype}, TP={plan.tp_size} PP={plan.pp_size})"
    emit_table(title, plan_rows(plan) + estimate_rows(estimate))
    for line in plan.notes:
        note(line)
    note(f"model config: {source.config_from}")
