"""Build recipes: YAML files in build/ that fix what to build; what they leave out comes from the planner.

A recipe names its model and its target (cpu, synthetic, or a GPU). Keys that do not apply to the
recipe's target are refused by name, so a recipe always means what it says.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import yaml

from toolkit.errors import RecipeError
from toolkit.plan.gpus import GPU_PROFILES

PYTHON_TARGETS = ("cpu", "synthetic")
CPU_TARGET = "cpu"
POLICIES = ("max_utilization", "guaranteed_no_evict")
TARGETS = (*PYTHON_TARGETS, *GPU_PROFILES)


@dataclass(frozen=True)
class BuildRecipe:
    name: str
    path: str
    model: str | None
    target: str
    dtype: str | None = None  # GPU: bf16 | fp8 | int4-awq (None: bf16); cpu runs fp32
    kv_dtype: str | None = None
    tp: int | None = None  # None: the smallest TP that fits
    pp: int = 1
    max_seq_len: int | None = None
    max_input_len: int | None = None
    max_output_len: int | None = None
    max_batch_size: int | None = None
    max_num_tokens: int | None = None
    max_queue_size: int | None = None
    target_input_len: int | None = None  # GPU: the typical request the batch limits are sized for
    target_output_len: int | None = None
    kv_cache_tokens: int | None = None  # cpu: the paged KV pool, in tokens
    num_threads: int | None = None  # cpu: torch threads
    step_time_ms: float | None = None  # synthetic: time per decode step
    batch_scheduler_policy: str = "max_utilization"
    kv_cache_free_gpu_mem_fraction: float | None = None
    enable_kv_cache_reuse: bool = True
    enable_chunked_context: bool = True
    calib_size: int = 512
    awq_block_size: int = 128

    @property
    def gpu(self) -> bool:
        return self.target not in PYTHON_TARGETS

    def to_dict(self) -> dict:
        return asdict(self)

    def build_inputs(self) -> dict:
        """What decides the engine's bytes (the cache key's recipe part): not the file's name or path."""
        return {k: v for k, v in self.to_dict().items() if k not in ("name", "path")}


def _positive_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def _non_negative_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _non_negative_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value >= 0


def _fraction(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and 0 < value <= 1


def _one_of(*allowed: Any) -> Callable[[Any], bool]:
    return lambda value: not isinstance(value, bool) and value in allowed


def _text(value: Any) -> bool:
    return isinstance(value, str) and bool(value.strip())


ALL, GPU, CPU, SYNTHETIC, PYTHON = "all", "gpu", "cpu", "synthetic", "cpu/synthetic"
# section.key (or key at the top) -> (BuildRecipe field, validator, what the value must be, targets it applies to)
_SCHEMA: dict[str, tuple[str, Callable[[Any], bool], str, str]] = {
    "name": ("name", _text, "a non-empty string", ALL),
    "model": (
        "model",
        _text,
        "a model source (a catalog name, hf:ORG/NAME, a folder, or smollm2-135m-instruct)",
        ALL,
    ),
    "target": ("target", _one_of(*TARGETS), f"one of {', '.join(TARGETS)}", ALL),
    "quantization.dtype": (
        "dtype",
        _one_of("bf16", "fp8", "int4-awq", "fp32"),
        "one of bf16, fp8, int4-awq (fp32 on cpu)",
        ALL,
    ),
    "quantization.kv_cache_dtype": (
        "kv_dtype",
        _one_of("bf16", "fp8", "fp32"),
        "one of bf16, fp8 (fp32 on cpu)",
        ALL,
    ),
    "quantization.calib_size": ("calib_size", _positive_int, "a positive integer", GPU),
    "quantization.awq_block_size": ("awq_block_size", _one_of(64, 128), "64 or 128", GPU),
    "parallelism.tp": ("tp", _one_of(1, 2, 4, 8), "1, 2, 4 or 8", GPU),
    "parallelism.pp": ("pp", _positive_int, "a positive integer", GPU),
    "limits.max_seq_len": ("max_seq_len", _positive_int, "a positive integer", ALL),
    "limits.max_input_len": ("max_input_len", _positive_int, "a positive integer", ALL),
    "limits.max_output_len": ("max_output_len", _positive_int, "a positive integer", ALL),
    "batching.max_batch_size": ("max_batch_size", _positive_int, "a positive integer", ALL),
    "batching.max_num_tokens": ("max_num_tokens", _positive_int, "a positive integer", ALL),
    "batching.max_queue_size": (
        "max_queue_size",
        _non_negative_int,
        "a non-negative integer (0: no bound)",
        ALL,
    ),
    "batching.target_input_len": ("target_input_len", _positive_int, "a positive integer", GPU),
    "batching.target_output_len": ("target_output_len", _positive_int, "a positive integer", GPU),
    "batching.batch_scheduler_policy": (
        "batch_scheduler_policy",
        _one_of(*POLICIES),
        f"one of {', '.join(POLICIES)}",
        GPU,
    ),
    "kv_cache.tokens": ("kv_cache_tokens", _positive_int, "a positive integer", CPU),
    "kv_cache.free_gpu_mem_fraction": (
        "kv_cache_free_gpu_mem_fraction",
        _fraction,
        "a number in (0, 1]",
        GPU,
    ),
    "kv_cache.enable_block_reuse": (
        "enable_kv_cache_reuse",
        lambda v: isinstance(v, bool),
        "true or false",
        GPU,
    ),
    "kv_cache.enable_chunked_context": (
        "enable_chunked_context",
        lambda v: isinstance(v, bool),
        "true or false",
        GPU,
    ),
    "engine.num_threads": (
        "num_threads",
        _non_negative_int,
        "a non-negative integer (0: torch's default)",
        CPU,
    ),
    "engine.step_time_ms": (
        "step_time_ms",
        _non_negative_number,
        "a non-negative number of milliseconds",
        SYNTHETIC,
    ),
}
_SECTIONS = sorted({key.split(".")[0] for key in _SCHEMA if "." in key})


def recipes_dir() -> Path:
    """build/ of a source checkout, or the copy a wheel carries as toolkit/_recipes."""
    package = Path(__file__).resolve().parents[1]
    for candidate in (package.parent / "build", package / "_recipes"):
        if candidate.is_dir():
            return candidate
    return package.parent / "build"


def list_recipes() -> list[str]:
    return sorted(p.stem for p in recipes_dir().glob("*.yaml"))


def load_recipe(name_or_path: str | Path) -> BuildRecipe:
    """Load and validate a recipe by file path or by name (build/NAME.yaml)."""
    path = Path(name_or_path).expanduser()
    if not path.is_file():
        path = recipes_dir() / f"{name_or_path}.yaml"
    if not path.is_file():
        raise RecipeError(
            f"no recipe {str(name_or_path)!r}",
            hint=f"use a path to a YAML file or one of: {', '.join(list_recipes())}",
        )
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise RecipeError(f"{path} is not valid YAML: {exc}", hint="fix the YAML syntax") from exc
    return recipe_from_dict(data, path)


def recipe_from_dict(data: Any, path: Path) -> BuildRecipe:
    if not isinstance(data, dict):
        raise RecipeError(
            f"{path}: a recipe is a YAML mapping, got {type(data).__name__}",
            hint="see build/*.yaml for examples",
        )
    fields: dict[str, Any] = {"name": path.stem, "path": str(path)}
    items = _flatten(data, path)
    for key, value in items:
        field, valid, expected, _ = _SCHEMA[key]
        if not valid(value):
            raise RecipeError(
                f"{path}: {key} must be {expected}, got {value!r}", hint=f"fix {key} in {path}"
            )
        fields[field] = value
    for required in ("model", "target"):
        if required not in fields:
            raise RecipeError(
                f"{path}: missing required key {required!r}", hint=f"add `{required}:` to {path}"
            )
    recipe = BuildRecipe(**fields)
    _check_applies(recipe, [key for key, _ in items], path)
    _check_consistency(recipe, path)
    return recipe


def _flatten(data: dict, path: Path) -> list[tuple[str, Any]]:
    items = []
    for key, value in data.items():
        if key in _SECTIONS:
            if not isinstance(value, dict):
                raise RecipeError(
                    f"{path}: {key} must be a mapping, got {value!r}",
                    hint=f"write {key}: as a section with keys under it",
                )
            items += [(f"{key}.{sub}", v) for sub, v in value.items()]
        else:
            items.append((str(key), value))
    for key, _ in items:
        if key not in _SCHEMA:
            raise RecipeError(
                f"{path}: unknown key {key!r}", hint=f"allowed keys: {', '.join(_SCHEMA)}"
            )
    return items


def _check_applies(recipe: BuildRecipe, keys: list[str], path: Path) -> None:
    for key in keys:
        scope = _SCHEMA[key][3]
        applies = scope == ALL or (scope == GPU and recipe.gpu) or scope == recipe.target
        if not applies:
            raise RecipeError(
                f"{path}: {key} does not apply to target {recipe.target} (only to {scope} targets)",
                hint=f"remove {key} from {path}",
            )


def _check_consistency(recipe: BuildRecipe, path: Path) -> None:
    precisions = {recipe.dtype, recipe.kv_dtype} - {None}
    if recipe.gpu and "fp32" in precisions:
        raise RecipeError(
            f"{path}: fp32 is for the cpu target only",
            hint="use bf16, fp8 or int4-awq on a GPU target",
        )
    if not recipe.gpu and precisions - {"fp32"}:
        raise RecipeError(
            f"{path}: the {recipe.target} target runs fp32 weights and KV cache, not "
            f"{', '.join(sorted(precisions - {'fp32'}))}",
            hint=f"drop quantization from the {recipe.target} recipe (or write fp32)",
        )
    if recipe.gpu and "fp8" in precisions and not GPU_PROFILES[recipe.target].supports_fp8:
        raise RecipeError(
            f"{path}: {recipe.target} has no FP8 support",
            hint="use bf16 or int4-awq for this target",
        )
    if recipe.max_input_len and recipe.max_seq_len and recipe.max_input_len >= recipe.max_seq_len:
        raise RecipeError(
            f"{path}: limits.max_input_len {recipe.max_input_len} leaves no room to generate within "
            f"limits.max_seq_len {recipe.max_seq_len}",
            hint="make max_input_len smaller than max_seq_len",
        )


def command_line_recipe(model: str | None, target: str) -> BuildRecipe:
    """The recipe of a build given only on the command line."""
    if target not in TARGETS:
        raise RecipeError(f"unknown --target {target!r}", hint=f"use one of: {', '.join(TARGETS)}")
    return BuildRecipe(name="command-line", path="", model=model, target=target)
