"""Shared rendering: JSON on stdout for machines, rich tables for people, notes on stderr."""

from __future__ import annotations

import json
from typing import Any

import click
from rich.console import Console
from rich.table import Table

from toolkit.plan.estimate import PerformanceEstimate
from toolkit.plan.gpus import GB
from toolkit.plan.memory import MemoryPlan

stderr_console = Console(stderr=True)
stdout_console = Console()


def emit_json(data: Any) -> None:
    click.echo(json.dumps(data, indent=2, sort_keys=False, default=str))


def emit_table(title: str, rows: list[tuple[str, Any]]) -> None:
    table = Table(title=title, show_header=False)
    table.add_column("key", style="bold")
    table.add_column("value")
    for key, value in rows:
        table.add_row(key, str(value))
    stdout_console.print(table)


def note(message: str) -> None:
    stderr_console.print(message, highlight=False, soft_wrap=True)  # a note is one line, never cut


def plan_rows(plan: MemoryPlan) -> list[tuple[str, str]]:
    gb = lambda n: f"{n / GB:.2f} GB"  # noqa: E731
    experts = (
        [
            (
                "experts",
                f"{plan.num_experts} per layer, all resident; {plan.experts_per_token} routed per token "
                f"({plan.active_parameter_count:,} active parameters)",
            )
        ]
        if plan.num_experts
        else []
    )
    windows = (
        [("max_attention_window_size", ",".join(str(w) for w in plan.max_attention_window_size))]
        if plan.max_attention_window_size
        else []
    )
    lora = (
        [
            (
                "LoRA cache",
                f"{gb(plan.lora_cache_bytes)} per GPU (out of the KV pool; "
                f"{plan.lora_cache_gpu_memory_fraction:g} of the free memory) = {plan.lora_cache_adapters} "
                f"adapters of rank {plan.lora_max_rank} at {gb(plan.lora_adapter_bytes)} each; host: "
                f"{gb(plan.lora_host_cache_bytes)}",
            )
        ]
        if plan.lora_cache_adapters
        else []
    )
    return [
        ("parameters", f"{plan.parameter_count:,}"),
        *experts,
        *windows,
        ("weights", f"{gb(plan.weights_bytes)} ({gb(plan.weights_bytes_per_gpu)} per GPU)"),
        (
            "GPU memory",
            f"{gb(plan.gpu_memory_bytes)} per GPU, of which {gb(plan.activation_reserve_bytes)} held back "
            "(CUDA context, workspaces, activations)",
        ),
        (
            "KV cache per token",
            f"{plan.kv_bytes_per_token:,} bytes ({plan.kv_bytes_per_token_per_gpu:,} per GPU)",
        ),
        (
            "KV pool (planned)",
            f"{gb(plan.kv_pool_bytes)} per GPU = {plan.kv_cache_tokens:,} tokens",
        ),
        (
            "KV pool the runtime takes",
            f"{plan.runtime_kv_cache_tokens:,} tokens: {plan.kv_cache_free_gpu_mem_fraction:g} of what "
            f"{gb(plan.weights_bytes_per_gpu)} of weights and {gb(plan.runtime_reserve_bytes)} of runtime "
            "buffers leave (no token cap)",
        ),
        *lora,
        (
            "sequences of max_seq_len",
            f"{plan.max_sequences_at_max_seq_len:,} x {plan.max_seq_len:,} tokens",
        ),
        ("max_batch_size / max_num_tokens", f"{plan.max_batch_size} / {plan.max_num_tokens}"),
        ("  from", plan.batch_limits_from),
        ("KV tokens per request at max batch", f"{plan.kv_tokens_per_request_at_max_batch:,}"),
        (
            "decode step lower bound (batch 1)",
            f"{plan.decode_step_ms_lower_bound:.2f} ms -> at most "
            f"{plan.decode_tokens_per_s_per_stream_ceiling:,.0f} tokens/s per stream",
        ),
        (
            "decode ceiling at max batch",
            f"{plan.decode_step_ms_at_max_batch:.2f} ms per step -> at most "
            f"{plan.decode_tokens_per_s_ceiling:,.0f} tokens/s in all",
        ),
        (
            "prefill compute bound",
            f"{plan.prefill_tokens_per_s_upper_bound:,.0f} tokens/s "
            f"({plan.prefill_ms_lower_bound:.1f} ms per {plan.max_num_tokens}-token chunk)",
        ),
        ("smallest TP that fits", str(plan.min_tp_that_fits)),
    ]


def estimate_rows(estimate: PerformanceEstimate) -> list[tuple[str, str]]:
    e = estimate
    return [
        (
            "estimate",
            f"{e.concurrency} requests in flight, {e.input_len} in / {e.output_len} out tokens each",
        ),
        (
            "  time to first token",
            f"{e.ttft_ms:,.1f} ms (its prompt's step {e.prefill_step_ms:,.1f} ms)",
        ),
        (
            "  time per output token",
            f"{e.tpot_ms:,.2f} ms (a decode step {e.decode_step_ms:,.2f} ms, limited by {e.limited_by})",
        ),
        (
            "  output tokens/s",
            f"{e.output_tokens_per_s:,.0f} in all ({e.output_tokens_per_s_per_gpu:,.0f} per GPU)",
        ),
    ]
