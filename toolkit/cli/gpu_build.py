"""`toolkit build` for GPU targets: compile TensorRT-LLM engines, then package the Triton repository."""

from __future__ import annotations

from pathlib import Path

from toolkit.cli.render import emit_json, emit_table, note
from toolkit.model.sources import resolve_model
from toolkit.repository.writer import RepositoryLimits, plan_repository, write_repository


def build_gpu(*, model, target, output: Path, recipe, dtype, kv_dtype, tp, pp, max_seq_len, max_input_len,
              max_batch_size, max_num_tokens, engine_dir, dry_run: bool, as_json: bool, allow_pickle: bool) -> None:
    from toolkit.engine import build_gpu_command_result, engine_model_config

    data = build_gpu_command_result(
        model=model, target=target, recipe=recipe, dtype=dtype, kv_dtype=kv_dtype, tp=tp, pp=pp,
        max_seq_len=max_seq_len, max_input_len=max_input_len, max_batch_size=max_batch_size,
        max_num_tokens=max_num_tokens, output_dir=engine_dir, dry_run=dry_run, progress=None if as_json else note,
    )
    if not dry_run:
        data["repository"] = _package(data, output, allow_pickle, engine_model_config)
    if as_json:
        return emit_json(data)
    emit_table(f"{'build plan (dry run)' if dry_run else 'build'}: {data['model']} on {data['target']}",
               [(k, v) for k, v in data["plan"].items()] + [("engine_dir", data["engine_dir"])])
    for argv in data["commands"]:
        note("$ " + " ".join(argv))
    if not dry_run:
        note(f"serve it with: toolkit serve --repo {data['repository']['path']}")


def _package(data: dict, output: Path, allow_pickle: bool, engine_model_config) -> dict:
    """The same text models as the CPU target around the compiled engine's tensorrtllm model."""
    memory = data["plan"]
    resolved = resolve_model(data["recipe"]["model"], allow_pickle=allow_pickle)  # the spec, as given or from the recipe
    limits = RepositoryLimits(
        max_batch_size=int(memory["max_batch_size"]), max_input_len=int(memory.get("max_input_len") or memory["max_seq_len"] // 2),
        max_output_len=int(memory["max_seq_len"]) - 1, max_seq_len=int(memory["max_seq_len"]),
        max_num_tokens=int(memory["max_num_tokens"]), kv_cache_tokens=max(int(memory["kv_cache_tokens"]), int(memory["max_seq_len"])),
    )
    config = engine_model_config(Path(data["engine_dir"]))
    plan = plan_repository(resolved, data["target"], output, limits, engine_config=config, memory_plan=memory)
    result = write_repository(plan, progress=lambda step: note(f"writing {step}..."))
    return {"path": str(result.path), "skipped": result.skipped, "build_key": result.key}
