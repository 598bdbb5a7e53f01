"""`toolkit plan`: how a model fits on a GPU, and how fast it can be at best."""

from __future__ import annotations

import click

from toolkit.cli.render import emit_json, emit_table, note, plan_rows
from toolkit.model.catalog import catalog_names
from toolkit.plan.gpus import GPU_PROFILES, get_gpu
from toolkit.plan.memory import (
    DEFAULT_TARGET_INPUT_LEN,
    DEFAULT_TARGET_OUTPUT_LEN,
    KV_DTYPES,
    WEIGHT_DTYPES,
    plan_memory,
)
from toolkit.plan.source import load_model_for_plan


@click.command("plan")
@click.option(
    "-m",
    "--model",
    required=True,
    help=f"A catalog name ({', '.join(catalog_names())}: no network needed), config.json, a checkpoint "
    "folder, hf:ORG/NAME, or smollm2-135m-instruct. No weights are read.",
)
@click.option(
    "-g", "--gpu", type=click.Choice(list(GPU_PROFILES)), default="h100-sxm", help="GPU profile."
)
@click.option("--dtype", type=click.Choice(WEIGHT_DTYPES), default="bf16", help="Weight precision.")
@click.option(
    "--kv-dtype", type=click.Choice(KV_DTYPES), default="bf16", help="KV cache precision."
)
@click.option(
    "--tp",
    type=click.IntRange(1, 8),
    default=None,
    help="Tensor-parallel GPUs [default: the smallest that fits].",
)
@click.option("--pp", type=click.IntRange(1, 64), default=1, help="Pipeline-parallel stages.")
@click.option(
    "--max-seq-len",
    type=click.IntRange(2),
    default=None,
    help="Prompt + output tokens per sequence [default: min(model limit, 8192)].",
)
@click.option(
    "--target-input-len",
    type=click.IntRange(1),
    default=DEFAULT_TARGET_INPUT_LEN,
    help="Typical prompt tokens the batch limits are sized for (trtllm-bench's --target_input_len).",
)
@click.option(
    "--target-output-len",
    type=click.IntRange(1),
    default=DEFAULT_TARGET_OUTPUT_LEN,
    help="Typical output tokens the batch limits are sized for (trtllm-bench's --target_output_len).",
)
@click.option(
    "--max-batch-size",
    type=click.IntRange(1),
    default=None,
    help="Requests per engine step [default: as trtllm-bench sizes it for the target lengths].",
)
@click.option(
    "--max-num-tokens",
    type=click.IntRange(1),
    default=None,
    help="Tokens per engine step [default: as trtllm-bench sizes it for the target lengths].",
)
@click.option("--json", "as_json", is_flag=True, help="Print the plan as JSON.")
def command(
    model,
    gpu,
    dtype,
    kv_dtype,
    tp,
    pp,
    max_seq_len,
    target_input_len,
    target_output_len,
    max_batch_size,
    max_num_tokens,
    as_json,
) -> None:
    """Plan memory (weights, KV cache, batch) and the speed-of-light bounds for MODEL on GPU."""
    source = load_model_for_plan(model)
    plan = plan_memory(
        source.facts,
        get_gpu(gpu),
        model=source.name,
        dtype=dtype,
        kv_dtype=kv_dtype,
        tp=tp,
        pp=pp,
        max_seq_len=max_seq_len,
        max_batch_size=max_batch_size,
        max_num_tokens=max_num_tokens,
        target_input_len=target_input_len,
        target_output_len=target_output_len,
    )
    if as_json:
        emit_json({**plan.to_dict(), "config_from": source.config_from})
        return
    title = f"{plan.model} on {plan.gpu} ({plan.dtype}, KV {plan.kv_dtype}, TP={plan.tp_size} PP={plan.pp_size})"
    emit_table(title, plan_rows(plan))
    note(f"model config: {source.config_from}")
