"""`toolkit plan`: how a model fits on a GPU, and how fast it can be at best."""

from __future__ import annotations

import click

from toolkit.cli.render import emit_json, emit_table
from toolkit.plan.gpus import GB, GPU_PROFILES, get_gpu
from toolkit.plan.memory import KV_DTYPES, WEIGHT_DTYPES, MemoryPlan, plan_memory
from toolkit.plan.source import load_model_for_plan


@click.command("plan")
@click.option(
    "-m",
    "--model",
    required=True,
    help="config.json, a checkpoint folder, hf:ORG/NAME, or smollm2-135m-instruct (no weights needed).",
)
@click.option(
    "-g", "--gpu", type=click.Choice(list(GPU_PROFILES)), default="h100-sxm", help="GPU profile."
)
@click.option("--dtype", type=click.Choice(WEIGHT_DTYPES), default="bf16", help="Weight precision.")
@click.option(
    "--kv-dtype", type=click.Choice(KV_DTYPES), default="bf16", help="KV cache precision."
)
@click.option("--tp", type=click.IntRange(1, 8), default=1, help="Tensor-parallel GPUs.")
@click.option("--pp", type=click.IntRange(1, 64), default=1, help="Pipeline-parallel stages.")
@click.option(
    "--max-seq-len",
    type=click.IntRange(2),
    default=None,
    help="Prompt + output tokens per sequence [default: min(model limit, 8192)].",
)
@click.option(
    "--max-batch-size",
    type=click.IntRange(1),
    default=None,
    help="Override the planned batch size.",
)
@click.option(
    "--max-num-tokens",
    type=click.IntRange(1),
    default=None,
    help="Tokens per engine step [default: 8192].",
)
@click.option("--json", "as_json", is_flag=True, help="Print the plan as JSON.")
def command(
    model, gpu, dtype, kv_dtype, tp, pp, max_seq_len, max_batch_size, max_num_tokens, as_json
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
    )
    if as_json:
        emit_json(plan.to_dict())
    else:
        emit_table(
            f"{plan.model} on {plan.gpu} ({plan.dtype}, KV {plan.kv_dtype}, TP={plan.tp_size} PP={plan.pp_size})",
            _rows(plan),
        )


def _rows(plan: MemoryPlan) -> list[tuple[str, str]]:
    return [
        ("parameters", f"{plan.parameter_count:,}"),
        (
            "weights",
            f"{plan.weights_bytes / GB:.2f} GB ({plan.weights_bytes_per_gpu / GB:.2f} GB per GPU)",
        ),
        (
            "KV cache per token",
            f"{plan.kv_bytes_per_token:,} bytes ({plan.kv_bytes_per_token_per_gpu:,} per GPU)",
        ),
        ("activation reserve", f"{plan.activation_reserve_bytes / GB:.2f} GB per GPU"),
        ("KV pool", f"{plan.kv_pool_bytes / GB:.2f} GB per GPU = {plan.kv_cache_tokens:,} tokens"),
        (
            "sequences of max_seq_len",
            f"{plan.max_sequences_at_max_seq_len:,} x {plan.max_seq_len:,} tokens",
        ),
        ("max_batch_size / max_num_tokens", f"{plan.max_batch_size} / {plan.max_num_tokens}"),
        (
            "decode step lower bound",
            f"{plan.decode_step_ms_lower_bound:.2f} ms -> at most "
            f"{plan.decode_tokens_per_s_per_stream_ceiling:,.0f} tokens/s per stream",
        ),
        (
            "prefill compute bound",
            f"{plan.prefill_tokens_per_s_upper_bound:,.0f} tokens/s ({plan.prefill_ms_lower_bound:.1f} ms per "
            f"{plan.max_num_tokens}-token chunk)",
        ),
        ("smallest TP that fits", str(plan.min_tp_that_fits)),
    ]
