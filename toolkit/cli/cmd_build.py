"""`toolkit build`: checkpoint -> Triton model repository."""

from __future__ import annotations

from pathlib import Path

import click

from toolkit.cli.render import emit_json, emit_table, note
from toolkit.model.sources import EMBEDDED_DEFAULT, resolve_model
from toolkit.repository.writer import RepositoryLimits, plan_repository, write_repository

PYTHON_TARGETS = ("cpu", "synthetic")


@click.command("build")
@click.option("-m", "--model", default=EMBEDDED_DEFAULT, help="hf:ORG/NAME[@REV], ORG/NAME, a local folder, or the embedded default.")
@click.option("-t", "--target", default="cpu", help="cpu, synthetic, or a GPU (h100-sxm, h200, ...).")
@click.option("-o", "--output", type=click.Path(path_type=Path), default=Path("model_repository"), help="Repository folder to write.")
@click.option("--allow-pickle", is_flag=True, help="Accept .bin/.pt weights (pickles can run code when loaded).")
@click.option("--max-batch-size", type=int, default=64, help="Requests per batch Triton may form.")
@click.option("--max-input-len", type=int, default=1536, help="Longest prompt, in tokens.")
@click.option("--max-output-len", type=int, default=1024, help="Most tokens one request may generate.")
@click.option("--max-seq-len", type=int, default=2048, help="Prompt + output limit, in tokens.")
@click.option("--max-num-tokens", type=int, default=256, help="Tokens per engine step (prefill chunk + decodes).")
@click.option("--kv-cache-tokens", type=int, default=32768, help="CPU engine: paged KV pool size, in tokens (bounds its memory).")
@click.option("--num-threads", type=int, default=0, help="CPU engine: torch threads (0: torch's default).")
@click.option("--step-time-ms", type=float, default=0.0, help="Synthetic engine: time per decode step.")
@click.option("--dry-run", is_flag=True, help="Print the plan; write nothing.")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
def command(model, target, output, allow_pickle, max_batch_size, max_input_len, max_output_len, max_seq_len,
            max_num_tokens, kv_cache_tokens, num_threads, step_time_ms, dry_run, as_json):
    """Build a Triton model repository from a checkpoint."""
    if target not in PYTHON_TARGETS:
        from toolkit.cli.gpu_build import build_gpu

        return build_gpu(model=model, target=target, output=output, dry_run=dry_run, as_json=as_json, allow_pickle=allow_pickle)
    limits = RepositoryLimits(max_batch_size=max_batch_size, max_input_len=max_input_len, max_output_len=max_output_len,
                              max_seq_len=max_seq_len, max_num_tokens=max_num_tokens, kv_cache_tokens=kv_cache_tokens)
    engine = {"num_threads": num_threads} if target == "cpu" else {"step_time_ms": step_time_ms}
    resolved = resolve_model(model, allow_pickle=allow_pickle, progress=not as_json)
    plan = plan_repository(resolved, target, output, limits, engine)
    summary = {"output": str(plan.output), "target": target, "model": resolved.source, "revision": resolved.revision,
               "architecture": plan.facts.architecture, "parameters": plan.facts.parameter_count, "limits": limits.__dict__}
    if dry_run:
        return emit_json({"dry_run": True, **summary}) if as_json else emit_table("build plan (dry run)", list(summary.items()))
    result = write_repository(plan, progress=lambda step: note(f"writing {step}..."))
    summary.update({"skipped": result.skipped, "build_key": result.key})
    if as_json:
        return emit_json(summary)
    if result.skipped:
        note(f"{result.path} is up to date (build key {result.key}); nothing to do")
    emit_table("repository", list(summary.items()))
    note(f"serve it with: toolkit serve --repo {result.path}")
