"""`toolkit build`: checkpoint -> Triton model repository."""

from __future__ import annotations

from pathlib import Path

import click

from toolkit.cli.render import emit_json, emit_table, note
from toolkit.model.sources import EMBEDDED_DEFAULT, resolve_model
from toolkit.repository.writer import RepositoryLimits, plan_repository, write_repository

PYTHON_TARGETS = ("cpu", "synthetic")


@click.command("build")
@click.option("-m", "--model", default=None, help=f"hf:ORG/NAME[@REV], ORG/NAME, a local folder, or {EMBEDDED_DEFAULT} [default for cpu; GPU: the recipe's].")
@click.option("-t", "--target", default="cpu", help="cpu, synthetic, or a GPU (h100-sxm, h100-pcie, h100-nvl, h200, a100-80gb, l40s).")
@click.option("-o", "--output", type=click.Path(path_type=Path), default=Path("model_repository"), help="Repository folder to write.")
@click.option("--allow-pickle", is_flag=True, help="Accept .bin/.pt weights (pickles can run code when loaded).")
@click.option("-r", "--recipe", default=None, help="Build recipe: a name from build/ or a YAML path (GPU targets).")
@click.option("--dtype", type=click.Choice(["bf16", "fp8", "int4-awq"]), default=None, help="GPU: weight precision (default: recipe or planner).")
@click.option("--kv-dtype", type=click.Choice(["bf16", "fp8"]), default=None, help="GPU: KV cache precision.")
@click.option("--tp", type=click.IntRange(min=1), default=None, help="GPU: tensor-parallel ranks (default: smallest that fits).")
@click.option("--pp", type=click.IntRange(min=1), default=None, help="GPU: pipeline-parallel ranks.")
@click.option("--engine-dir", type=click.Path(path_type=Path), default=None, help="GPU: where engines go (default: the build cache).")
@click.option("--max-batch-size", type=int, default=None, help="Requests per batch [cpu: 64; GPU: from the plan].")
@click.option("--max-input-len", type=int, default=None, help="Longest prompt, in tokens [cpu: 1536].")
@click.option("--max-output-len", type=int, default=None, help="Most tokens one request may generate [cpu: 1024].")
@click.option("--max-seq-len", type=int, default=None, help="Prompt + output limit, in tokens [cpu: 2048].")
@click.option("--max-num-tokens", type=int, default=None, help="Tokens per engine step [cpu: 256].")
@click.option("--kv-cache-tokens", type=int, default=32768, help="CPU engine: paged KV pool size, in tokens (bounds its memory).")
@click.option("--num-threads", type=click.IntRange(min=0), default=0, help="CPU engine: torch threads (0: torch's default).")
@click.option("--step-time-ms", type=click.FloatRange(min=0), default=0.0, help="Synthetic engine: time per decode step.")
@click.option("--dry-run", is_flag=True, help="Print the plan; write nothing.")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
def command(model, target, output, allow_pickle, recipe, dtype, kv_dtype, tp, pp, engine_dir, max_batch_size, max_input_len, max_output_len, max_seq_len,
            max_num_tokens, kv_cache_tokens, num_threads, step_time_ms, dry_run, as_json):
    """Build a Triton model repository from a checkpoint."""
    if target not in PYTHON_TARGETS:
        from toolkit.cli.gpu_build import build_gpu

        return build_gpu(model=model, target=target, output=output, recipe=recipe, dtype=dtype, kv_dtype=kv_dtype, tp=tp, pp=pp,
                         max_seq_len=max_seq_len, max_input_len=max_input_len, max_batch_size=max_batch_size,
                         max_num_tokens=max_num_tokens, engine_dir=engine_dir, dry_run=dry_run, as_json=as_json,
                         allow_pickle=allow_pickle)
    gpu_only = {"--recipe": recipe, "--dtype": dtype, "--kv-dtype": kv_dtype, "--tp": tp, "--pp": pp, "--engine-dir": engine_dir}
    given = [flag for flag, value in gpu_only.items() if value is not None]
    if given:
        raise click.UsageError(f"{', '.join(given)} only apply to GPU targets, not --target {target}")
    defaults = RepositoryLimits()
    limits = RepositoryLimits(
        max_batch_size=max_batch_size or defaults.max_batch_size, max_input_len=max_input_len or defaults.max_input_len,
        max_output_len=max_output_len or defaults.max_output_len, max_seq_len=max_seq_len or defaults.max_seq_len,
        max_num_tokens=max_num_tokens or defaults.max_num_tokens, kv_cache_tokens=kv_cache_tokens,
    )
    engine = {"num_threads": num_threads} if target == "cpu" else {"step_time_ms": step_time_ms}
    resolved = resolve_model(model or EMBEDDED_DEFAULT, allow_pickle=allow_pickle, progress=not as_json)
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
