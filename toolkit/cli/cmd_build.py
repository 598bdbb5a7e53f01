"""`toolkit build`: checkpoint -> Triton model repository, for every target (toolkit.build does the work)."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from toolkit.build import BuildRequest, build_repository, plan_build
from toolkit.cli.render import emit_json, emit_table, note, plan_rows
from toolkit.engine.recipe import TARGETS
from toolkit.model.spec import EMBEDDED_DEFAULT
from toolkit.plan.memory import MemoryPlan


@click.command("build")
@click.option(
    "-m",
    "--model",
    default=None,
    help=f"{EMBEDDED_DEFAULT}, a catalog name, hf:ORG/NAME[@REV], ORG/NAME, or a local folder [default: the "
    f"recipe's, else {EMBEDDED_DEFAULT}].",
)
@click.option(
    "-t",
    "--target",
    default=None,
    help=f"One of: {', '.join(TARGETS)} [default: the recipe's, else cpu].",
)
@click.option(
    "-r",
    "--recipe",
    default=None,
    help="A recipe name from build/ or a YAML path; it names the model and target.",
)
@click.option(
    "-o",
    "--output",
    type=click.Path(path_type=Path),
    default=Path("model_repository"),
    help="Repository folder to write (only an empty folder or a toolkit repository is replaced).",
)
@click.option(
    "--dtype",
    type=click.Choice(["bf16", "fp8", "int4-awq"]),
    default=None,
    help="GPU: weight precision [default: recipe, else bf16].",
)
@click.option(
    "--kv-dtype",
    type=click.Choice(["bf16", "fp8"]),
    default=None,
    help="GPU: KV cache precision [default: recipe, else bf16].",
)
@click.option(
    "--tp",
    type=click.IntRange(min=1),
    default=None,
    help="GPU: tensor-parallel ranks [default: recipe, else the smallest that fits].",
)
@click.option(
    "--pp",
    type=click.IntRange(min=1),
    default=None,
    help="GPU: pipeline-parallel ranks [default: 1].",
)
@click.option(
    "--engine-dir",
    type=click.Path(path_type=Path),
    default=None,
    help="GPU: where engines go [default: the build cache].",
)
@click.option(
    "--max-batch-size",
    type=click.IntRange(min=1),
    default=None,
    help="Requests per batch [cpu: 64; GPU: the plan].",
)
@click.option(
    "--max-input-len",
    type=click.IntRange(min=1),
    default=None,
    help="Longest prompt, in tokens [cpu: 1536; GPU: max-seq-len - 1].",
)
@click.option(
    "--max-output-len",
    type=click.IntRange(min=1),
    default=None,
    help="Most tokens one request may generate [cpu: 1024; GPU: max-seq-len - 1].",
)
@click.option(
    "--max-seq-len",
    type=click.IntRange(min=2),
    default=None,
    help="Prompt + output limit, in tokens [cpu: 2048; GPU: min(model, 8192)].",
)
@click.option(
    "--max-num-tokens",
    type=click.IntRange(min=1),
    default=None,
    help="Tokens per engine step [cpu: 256; GPU: the plan].",
)
@click.option(
    "--target-input-len",
    type=click.IntRange(min=1),
    default=None,
    help="GPU: typical prompt tokens the batch limits are sized for [1024].",
)
@click.option(
    "--target-output-len",
    type=click.IntRange(min=1),
    default=None,
    help="GPU: typical output tokens the batch limits are sized for [512].",
)
@click.option(
    "--max-queue-size",
    type=click.IntRange(min=0),
    default=None,
    help="Requests waiting for a batch slot before more are refused (0: no bound) [256].",
)
@click.option(
    "--kv-cache-tokens",
    type=click.IntRange(min=1),
    default=None,
    help="CPU engine: paged KV pool size, in tokens (bounds its memory) [32768].",
)
@click.option(
    "--num-threads",
    type=click.IntRange(min=0),
    default=None,
    help="CPU engine: torch threads (0: torch's default).",
)
@click.option(
    "--step-time-ms",
    type=click.FloatRange(min=0),
    default=None,
    help="Synthetic engine: time per decode step.",
)
@click.option(
    "--decoupled/--no-decoupled",
    default=True,
    help="Stream responses (decoupled models); --no-decoupled serves unary ModelInfer / HTTP infer clients.",
)
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
@click.option(
    "--dry-run",
    is_flag=True,
    help="Print the plan (and, for GPUs, the exact commands); write nothing.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
def command(
    model,
    target,
    recipe,
    output,
    dtype,
    kv_dtype,
    tp,
    pp,
    engine_dir,
    max_batch_size,
    max_input_len,
    max_output_len,
    max_seq_len,
    max_num_tokens,
    max_queue_size,
    target_input_len,
    target_output_len,
    kv_cache_tokens,
    num_threads,
    step_time_ms,
    decoupled,
    discard_changes,
    allow_pickle,
    dry_run,
    as_json,
):
    """Build a Triton model repository from a checkpoint: a CPU engine, the synthetic engine,
    or TensorRT-LLM engines."""
    request = BuildRequest(
        output=output,
        model=model,
        target=target,
        recipe=recipe,
        dtype=dtype,
        kv_dtype=kv_dtype,
        tp=tp,
        pp=pp,
        max_batch_size=max_batch_size,
        max_input_len=max_input_len,
        max_output_len=max_output_len,
        max_seq_len=max_seq_len,
        max_num_tokens=max_num_tokens,
        max_queue_size=max_queue_size,
        target_input_len=target_input_len,
        target_output_len=target_output_len,
        kv_cache_tokens=kv_cache_tokens,
        num_threads=num_threads,
        step_time_ms=step_time_ms,
        engine_dir=engine_dir,
        decoupled=decoupled,
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
    commands = data.pop("commands", None)
    emit_table(title, [(key, value) for key, value in data.items() if key != "plan"])
    if "plan" in data:
        emit_table("memory plan", plan_rows(MemoryPlan(**data["plan"])))
    for argv in commands or ():
        note("$ " + " ".join(argv))
