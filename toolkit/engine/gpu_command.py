"""What `toolkit build --target <gpu>` does: plan, then (unless --dry-run) build; a dict for JSON or tables."""

from __future__ import annotations

from pathlib import Path

from toolkit.engine.build import Progress, execute_engine_build
from toolkit.engine.build_plan import plan_engine_build
from toolkit.engine.recipe import BuildRecipe


def build_gpu_command_result(
    model: str | None = None,
    target: str | None = None,
    *,
    recipe: str | Path | BuildRecipe | None = None,
    dtype: str | None = None,
    kv_dtype: str | None = None,
    tp: int | None = None,
    pp: int | None = None,
    max_seq_len: int | None = None,
    max_input_len: int | None = None,
    max_batch_size: int | None = None,
    max_num_tokens: int | None = None,
    output_dir: str | Path | None = None,
    dry_run: bool = False,
    progress: Progress | None = None,
) -> dict:
    """Plan the engine build and, unless dry_run, run it. Keys: dry_run, plan, commands, engine_dir, result."""
    plan = plan_engine_build(
        model, target, recipe=recipe, output_dir=output_dir,
        dtype=dtype, kv_dtype=kv_dtype, tp=tp, pp=pp, max_seq_len=max_seq_len, max_input_len=max_input_len,
        max_batch_size=max_batch_size, max_num_tokens=max_num_tokens,
    )
    data = plan.to_dict()
    summary = {
        "dry_run": dry_run,
        "model": plan.model,
        "target": plan.target,
        "trtllm_version_pinned": plan.trtllm_version_pinned,
        "container": plan.container,
        "engine_dir": plan.engine_dir,
        "plan": data["memory"],
        "recipe": data["recipe"],
        "steps": data["step_names"],
        "commands": data["commands"],
    }
    if not dry_run:
        summary["result"] = execute_engine_build(plan, progress=progress).to_dict()
    return summary
