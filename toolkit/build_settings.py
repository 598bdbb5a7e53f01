"""Build settings, one declaration each: type, default, validation, help, recipe key, manifest key, targets.

Every field of `BuildSettings` is declared once with `setting(...)`; everything else derives from
that declaration: the `toolkit build` (and `toolkit plan`) options (toolkit.cli.options), the recipe
schema (toolkit.recipes), the manifest's `settings` section (the values a build resolved), and
the arguments that build the same repository again (serve's rebuild hints, deploy's build Job).
None means "not given": the recipe's value, else the planner's or the target's default.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from toolkit.errors import RecipeError
from toolkit.plan.precisions import KV_DTYPES, WEIGHT_DTYPES

# Target kinds a setting applies to (toolkit.targets: every GPU profile is of kind "gpu").
CPU, SYNTHETIC, GPU = "cpu", "synthetic", "gpu"
KINDS = (CPU, SYNTHETIC, GPU)
PYTHON_KINDS = frozenset({CPU, SYNTHETIC})
ALL_KINDS = frozenset(KINDS)
EXAMPLE_TARGET = {CPU: "cpu", SYNTHETIC: "synthetic", GPU: "h100-sxm"}  # for hints
POLICIES = ("max_utilization", "guaranteed_no_evict")
# The CPU engine runs fp32 weights and KV cache; GPU targets take the precisions of toolkit.plan.precisions.
CPU_PRECISION = "fp32"
TP_CHOICES = (1, 2, 4, 8)


@dataclass(frozen=True)
class Setting:
    """How one build setting is given, checked and recorded."""

    name: str  # the BuildSettings field (and the manifest's settings key)
    kind: type  # int, float, str, bool, Path, or dict (NAME=PATH pairs, repeatable: --lora)
    help: str
    targets: frozenset[str]  # target kinds it applies to
    recipe_key: str | None  # section.key in a recipe (None: command line only)
    default: str  # what None becomes, as help shows it
    choices: tuple[Any, ...] = ()
    minimum: float | None = None  # inclusive
    above: float | None = None  # exclusive lower bound
    maximum: float | None = None  # inclusive
    short: str | None = None  # e.g. "-x"
    # bool settings: the option pair, e.g. ("kv-cache-reuse", "no-kv-cache-reuse")
    negation: str | None = None
    rebuild: bool = True  # whether a resolved value goes into the rebuild arguments

    @property
    def option(self) -> str:
        """The option's name without dashes (bool settings: the positive one)."""
        if self.negation is not None:
            return self.negation.removeprefix("no-")
        return self.name.replace("_", "-")

    @property
    def flag(self) -> str:
        """How messages name the option: --max-batch-size, --kv-cache-reuse/--no-kv-cache-reuse."""
        if self.negation is not None:
            return f"--{self.option}/--{self.negation}"
        return f"--{self.option}"

    @property
    def manifest_key(self) -> str:
        return f"settings.{self.name}"

    @property
    def multiple(self) -> bool:
        """Whether the option is repeatable (NAME=PATH pairs: the value is a tuple of (name, path))."""
        return self.kind is dict

    def applies_to(self, kind: str) -> bool:
        return kind in self.targets

    def expected(self) -> str:
        """What a valid value is, in words."""
        if self.multiple:
            return (
                "NAME=PATH (NAME: a letter or digit, then up to 63 of letters, digits, '.', '_', '-'; PATH: "
                "a PEFT adapter folder or hf:ORG/NAME[@REV]), each NAME once"
            )
        if self.choices:
            return "one of " + ", ".join(str(c) for c in self.choices)
        if self.kind is bool:
            return "true or false"
        noun = {int: "an integer", float: "a number", str: "a non-empty string", Path: "a path"}[
            self.kind
        ]
        bounds = []
        if self.above is not None:
            bounds.append(f"> {self.above:g}")
        if self.minimum is not None:
            bounds.append(f">= {self.minimum:g}")
        if self.maximum is not None:
            bounds.append(f"<= {self.maximum:g}")
        return noun + (f" {' and '.join(bounds)}" if bounds else "")

    def problem(self, value: Any) -> str | None:
        """None when `value` is valid; else what it must be."""
        if self.multiple:
            return _pairs_problem(value, self.expected())
        if self.kind is bool:
            return None if isinstance(value, bool) else self.expected()
        if isinstance(value, bool):
            return self.expected()
        if self.kind is int and not isinstance(value, int):
            return self.expected()
        if self.kind is float and not (
            isinstance(value, (int, float)) and math.isfinite(float(value))
        ):
            return self.expected()
        if self.kind in (str, Path) and not (isinstance(value, (str, Path)) and str(value).strip()):
            return self.expected()
        if self.choices and value not in self.choices:
            return self.expected()
        number = value if isinstance(value, (int, float)) else None
        if number is not None and (
            (self.minimum is not None and number < self.minimum)
            or (self.above is not None and number <= self.above)
            or (self.maximum is not None and number > self.maximum)
        ):
            return self.expected()
        return None

    def parse_text(self, text: str) -> Any:
        """A value from the command line or an environment variable; ValueError naming what it must be.
        A repeatable setting parses one NAME=PATH item into a (name, path) pair."""
        if self.multiple:
            name, sep, path = text.partition("=")
            pair = (name.strip(), path.strip())
            if not sep or _pairs_problem((pair,), "") is not None:
                raise ValueError(f"{text!r} is not {self.expected()}")
            return pair
        try:
            value: Any = {int: int, float: float, str: str, Path: Path}[self.kind](text)
        except ValueError:
            raise ValueError(f"{text!r} is not {self.expected()}") from None
        if self.kind is float:
            value = float(value)
        problem = self.problem(value)
        if problem is not None:
            raise ValueError(f"{text!r} is not {problem}")
        return value

    def argv(self, value: Any) -> list[str]:
        """The command-line form of `value` (rebuild arguments)."""
        if self.kind is bool:
            return [f"--{self.option}" if value else f"--{self.negation}"]
        if self.multiple:
            return [word for name, path in value for word in (f"--{self.option}", f"{name}={path}")]
        text = repr(float(value)) if self.kind is float else str(value)
        return [f"--{self.option}", text]


# The name of one item of a NAME=PATH setting (a LoRA adapter: a model id of the OpenAI API).
PAIR_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")


def _pairs_problem(value: Any, expected: str) -> str | None:
    """None when `value` is a tuple of (NAME, PATH) pairs with valid, distinct names and non-empty paths."""
    if not isinstance(value, tuple) or not all(
        isinstance(pair, tuple) and len(pair) == 2 and all(isinstance(v, str) for v in pair)
        for pair in value
    ):
        return expected
    names = [name for name, _ in value]
    if any(not PAIR_NAME.match(name) for name in names) or len(set(names)) != len(names):
        return expected
    if any(not path.strip() for _, path in value):
        return expected
    return None


def pairs_from_mapping(value: Any) -> Any:
    """A recipe's or a manifest's {NAME: PATH} mapping as the setting's (name, path) pairs (other values
    unchanged, for the row's check to refuse)."""
    if isinstance(value, Mapping):
        return tuple((str(k), v) for k, v in value.items())
    return value


def setting(
    help: str,
    *,
    kind: type,
    targets: frozenset[str],
    recipe: str | None,
    default: str,
    **options: Any,
) -> Any:
    """A BuildSettings field: None by default, its declaration in the field's metadata."""
    return field(
        default=None,
        metadata={
            "setting": {
                "help": help,
                "kind": kind,
                "targets": targets,
                "recipe_key": recipe,
                "default": default,
                **options,
            }
        },
    )


_GPU = frozenset({GPU})
_CPU = frozenset({CPU})
_SYN = frozenset({SYNTHETIC})


@dataclass(frozen=True)
class BuildSettings:
    """Everything a build can be told besides its model, target, recipe and output folder."""

    # --- precision
    dtype: str | None = setting(
        "Weight precision (GPU: bf16, fp8 or int4-awq; the CPU engine runs fp32).",
        kind=str,
        targets=ALL_KINDS,
        recipe="quantization.dtype",
        default="bf16 (cpu: fp32)",
        choices=(*WEIGHT_DTYPES, CPU_PRECISION),
    )
    kv_dtype: str | None = setting(
        "KV cache precision (GPU: bf16 or fp8; the CPU engine runs fp32).",
        kind=str,
        targets=ALL_KINDS,
        recipe="quantization.kv_cache_dtype",
        default="bf16 (cpu: fp32)",
        choices=(*KV_DTYPES, CPU_PRECISION),
    )
    calib_size: int | None = setting(
        "GPU: calibration samples for fp8 / int4-awq quantization.",
        kind=int,
        targets=_GPU,
        recipe="quantization.calib_size",
        default="512",
        minimum=1,
    )
    calib_dataset: Path | None = setting(
        "GPU: calibration set for fp8 / int4-awq, a local folder (a `text` column in its train split, "
        "read with datasets.load_dataset); the quantizer then runs offline.",
        kind=Path,
        targets=_GPU,
        recipe="quantization.calib_dataset",
        default="cnn_dailymail, downloaded from the Hugging Face hub",
    )
    calib_gpus: int | None = setting(
        "GPU: GPUs the calibration spreads the bf16 checkpoint over (the build machine needs them).",
        kind=int,
        targets=_GPU,
        recipe="quantization.calib_gpus",
        default="TP x PP",
        minimum=1,
        maximum=64,
    )
    awq_block_size: int | None = setting(
        "GPU: int4-awq group size.",
        kind=int,
        targets=_GPU,
        recipe="quantization.awq_block_size",
        default="128",
        choices=(64, 128),
    )
    # --- parallelism
    tp: int | None = setting(
        "GPU: tensor-parallel ranks.",
        kind=int,
        targets=_GPU,
        recipe="parallelism.tp",
        default="the smallest that fits",
        choices=TP_CHOICES,
    )
    moe_ep_size: int | None = setting(
        "GPU, mixture-of-experts models: expert-parallel ranks (whole experts per rank); the TP ranks left "
        "shard each expert (TensorRT-LLM's --moe_ep_size / --moe_tp_size).",
        kind=int,
        targets=_GPU,
        recipe="parallelism.moe_ep",
        default="1 (experts sharded over the TP ranks)",
        choices=TP_CHOICES,
    )
    pp: int | None = setting(
        "GPU: pipeline-parallel ranks.",
        kind=int,
        targets=_GPU,
        recipe="parallelism.pp",
        default="1",
        minimum=1,
        maximum=64,
    )
    # --- limits
    max_seq_len: int | None = setting(
        "Prompt + output limit, in tokens.",
        kind=int,
        targets=ALL_KINDS,
        recipe="limits.max_seq_len",
        default="cpu: 2048; GPU: min(model, 8192)",
        minimum=2,
    )
    max_input_len: int | None = setting(
        "Longest prompt, in tokens.",
        kind=int,
        targets=ALL_KINDS,
        recipe="limits.max_input_len",
        default="cpu: 1536; GPU: max-seq-len - 1",
        minimum=1,
    )
    max_output_len: int | None = setting(
        "Most tokens one request may generate.",
        kind=int,
        targets=ALL_KINDS,
        recipe="limits.max_output_len",
        default="cpu: 1024; GPU: max-seq-len - 1",
        minimum=1,
    )
    # --- batching
    max_batch_size: int | None = setting(
        "Requests per batch.",
        kind=int,
        targets=ALL_KINDS,
        recipe="batching.max_batch_size",
        default="cpu: 64; GPU: the plan",
        minimum=1,
    )
    max_num_tokens: int | None = setting(
        "Tokens per engine step.",
        kind=int,
        targets=ALL_KINDS,
        recipe="batching.max_num_tokens",
        default="cpu: 256; GPU: the plan",
        minimum=1,
    )
    max_queue_size: int | None = setting(
        "Requests waiting for a batch slot before more are refused (0: no bound).",
        kind=int,
        targets=ALL_KINDS,
        recipe="batching.max_queue_size",
        default="256",
        minimum=0,
    )
    target_input_len: int | None = setting(
        "GPU: typical prompt tokens the batch limits are sized for (trtllm-bench's --target_input_len).",
        kind=int,
        targets=_GPU,
        recipe="batching.target_input_len",
        default="1024",
        minimum=1,
    )
    target_output_len: int | None = setting(
        "GPU: typical output tokens the batch limits are sized for (trtllm-bench's --target_output_len).",
        kind=int,
        targets=_GPU,
        recipe="batching.target_output_len",
        default="512",
        minimum=1,
    )
    batch_scheduler_policy: str | None = setting(
        "GPU: the batch scheduler's policy.",
        kind=str,
        targets=_GPU,
        recipe="batching.batch_scheduler_policy",
        default="max_utilization",
        choices=POLICIES,
    )
    # --- KV cache
    kv_cache_tokens: int | None = setting(
        "CPU/synthetic engine: paged KV pool size, in tokens (bounds the CPU engine's memory).",
        kind=int,
        targets=PYTHON_KINDS,
        recipe="kv_cache.tokens",
        default="32768",
        minimum=1,
    )
    kv_block_size: int | None = setting(
        "CPU/synthetic engine: tokens per KV page.",
        kind=int,
        targets=PYTHON_KINDS,
        recipe="kv_cache.block_size",
        default="64",
        minimum=1,
    )
    kv_cache_free_gpu_mem_fraction: float | None = setting(
        "GPU: share of the memory left after weights and activations that the runtime gives the KV pool.",
        kind=float,
        targets=_GPU,
        recipe="kv_cache.free_gpu_mem_fraction",
        default="0.9",
        above=0,
        maximum=1,
    )
    enable_kv_cache_reuse: bool | None = setting(
        "GPU: reuse the KV blocks of prompt prefixes already computed.",
        kind=bool,
        targets=_GPU,
        recipe="kv_cache.enable_block_reuse",
        default="on",
        negation="no-kv-cache-reuse",
    )
    enable_chunked_context: bool | None = setting(
        "GPU: split long prompts over engine steps of max-num-tokens.",
        kind=bool,
        targets=_GPU,
        recipe="kv_cache.enable_chunked_context",
        default="on",
        negation="no-chunked-context",
    )
    gather_generation_logits: bool | None = setting(
        "GPU: build the engine with --gather_generation_logits, so that requests can ask for top_logprobs "
        "(the backend then returns each step's logits; its logits buffer is counted in the memory plan).",
        kind=bool,
        targets=_GPU,
        recipe="engine.gather_generation_logits",
        default="off",
        negation="no-gather-generation-logits",
    )
    # --- engine
    num_threads: int | None = setting(
        "CPU engine: torch threads (0: the CPUs the server may use, but one: the rest of the server "
        "needs one; on a busy host fewer threads are faster).",
        kind=int,
        targets=_CPU,
        recipe="engine.num_threads",
        default="0",
        minimum=0,
    )
    step_time_ms: float | None = setting(
        "Synthetic engine: time per decode step, in milliseconds.",
        kind=float,
        targets=_SYN,
        recipe="engine.step_time_ms",
        default="0",
        minimum=0,
    )
    synthetic_output: str | None = setting(
        "Synthetic engine: the text every request is answered with, then the end token (tokenized with the "
        "repository's tokenizer, special tokens included), to test what reads the output (tool-call "
        "parsers, stop strings); default: plain words up to max_tokens.",
        kind=str,
        targets=_SYN,
        recipe="engine.synthetic_output",
        default="plain words",
    )
    # FP8 / tensor-parallel fusions (trtllm-build flags; their upstream conditions: toolkit.engine.fusions)
    reduce_fusion: bool | None = setting(
        "GPU: fuse each all-reduce with the residual add and norm after it (TP > 1, Llama).",
        kind=bool,
        targets=_GPU,
        recipe="engine.reduce_fusion",
        default="off",
        negation="no-reduce-fusion",
    )
    user_buffer: bool | None = setting(
        "GPU: all-reduce from user buffers, one copy less (needs --reduce-fusion; FP8 Llama).",
        kind=bool,
        targets=_GPU,
        recipe="engine.user_buffer",
        default="off",
        negation="no-user-buffer",
    )
    gemm_swiglu_plugin: bool | None = setting(
        "GPU: one FP8 kernel for the gate/up GEMM and SwiGLU (Hopper; drops one quantization scale).",
        kind=bool,
        targets=_GPU,
        recipe="engine.gemm_swiglu_plugin",
        default="off",
        negation="no-gemm-swiglu-plugin",
    )
    low_latency_gemm_plugin: bool | None = setting(
        "GPU: FP8 low-latency GEMM kernels (pays with --gemm-swiglu-plugin, NVIDIA's FP8 study).",
        kind=bool,
        targets=_GPU,
        recipe="engine.low_latency_gemm_plugin",
        default="off",
        negation="no-low-latency-gemm-plugin",
    )
    engine_dir: Path | None = setting(
        "GPU: where the engine goes.",
        kind=Path,
        targets=_GPU,
        recipe=None,
        default="the build cache",
        rebuild=False,
    )
    # --- serving
    decoupled: bool | None = setting(
        "Stream responses (decoupled models); --no-decoupled serves unary ModelInfer / HTTP infer clients.",
        kind=bool,
        targets=ALL_KINDS,
        recipe="serving.decoupled",
        default="on",
        negation="no-decoupled",
    )
    # --- LoRA adapters (toolkit.model.adapters checks them against the base model)
    lora: tuple[tuple[str, str], ...] | None = setting(
        "A LoRA adapter served beside the base model as model id NAME (repeatable): PATH is a Hugging "
        "Face PEFT adapter folder (adapter_config.json + adapter_model.safetensors) or hf:ORG/NAME[@REV]; "
        "checked against the base model before anything is built.",
        kind=dict,
        targets=ALL_KINDS,
        recipe="lora",
        default="none",
    )
    max_lora_rank: int | None = setting(
        "GPU: the largest LoRA rank the engine takes (trtllm-build's --max_lora_rank); room for adapters "
        "sent at run time (lora_weights) with a larger rank than the built ones.",
        kind=int,
        targets=_GPU,
        recipe="engine.max_lora_rank",
        default="the largest --lora rank",
        minimum=1,
    )
    lora_cache_adapters: int | None = setting(
        "GPU: adapters of the maximum rank the GPU's LoRA cache holds at once (its memory is counted in the "
        "plan, out of the KV cache); the host cache holds one more. Leave room to add adapters later "
        "without a new engine.",
        kind=int,
        targets=_GPU,
        recipe="engine.lora_cache_adapters",
        default="the number of --lora adapters",
        minimum=1,
    )

    def given(self) -> dict[str, Any]:
        """The settings that are set (not None)."""
        return {name: value for name, value in asdict(self).items() if value is not None}

    def overridden(self, other: BuildSettings) -> BuildSettings:
        """These settings with every value `other` sets replaced."""
        return replace(self, **other.given())

    def to_dict(self) -> dict[str, Any]:
        """JSON values: paths as text, NAME=PATH pairs as a {NAME: PATH} object."""
        return {
            name: str(v) if isinstance(v, Path) else dict(v) if SETTINGS[name].multiple else v
            for name, v in self.given().items()
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], where: str = "the manifest") -> BuildSettings:
        """Settings a manifest recorded; RecipeError for an unknown name or a wrong value."""
        values: dict[str, Any] = {}
        for name, value in data.items():
            row = SETTINGS.get(name)
            if row is None:
                raise RecipeError(
                    f"{where} records an unknown build setting {name!r}",
                    hint="rebuild it with this toolkit",
                    value=name,
                )
            if row.multiple:
                value = pairs_from_mapping(value)
            values[name] = Path(value) if row.kind is Path and value is not None else value
        settings = cls(**values)
        check_values(settings, where, key=lambda row: row.manifest_key)
        return settings

    def rebuild_arguments(self) -> list[str]:
        """`toolkit build` arguments that set every recorded setting again (the resolved values)."""
        args: list[str] = []
        for name, value in self.given().items():
            row = SETTINGS[name]
            if row.rebuild:
                args += row.argv(value)
        return args


def _table() -> dict[str, Setting]:
    table = {}
    for f in fields(BuildSettings):
        row = Setting(name=f.name, **f.metadata["setting"])
        if (row.kind is bool) != (row.negation is not None):
            raise TypeError(
                f"build setting {f.name}: a bool setting needs its negation, no other does"
            )
        table[f.name] = row
    return table


SETTINGS: dict[str, Setting] = _table()
RECIPE_KEYS: dict[str, Setting] = {
    row.recipe_key: row for row in SETTINGS.values() if row.recipe_key is not None
}


def rows(names: tuple[str, ...] | None = None) -> Iterator[Setting]:
    for name in names or tuple(SETTINGS):
        yield SETTINGS[name]


def check_values(settings: BuildSettings, where: str, key: Callable[[Setting], str] | None = None):
    """Refuse a value its row does not allow; `key` names the setting as the caller's user wrote it."""
    for name, value in settings.given().items():
        row = SETTINGS[name]
        problem = row.problem(value)
        if problem is not None:
            named = key(row) if key else row.flag
            raise RecipeError(
                f"{where}: {named} must be {problem}, got {value!r}",
                hint=f"fix {named}",
                value=value,
            )


def check_applies(settings: BuildSettings, kind: str, target: str, named: Callable[[Setting], str]):
    """Refuse a setting given for a target it does not apply to, naming it and the targets it does."""
    wrong = [SETTINGS[name] for name in settings.given() if not SETTINGS[name].applies_to(kind)]
    if wrong:
        listed = ", ".join(named(row) for row in wrong)
        scopes = sorted({"/".join(sorted(row.targets)) for row in wrong})
        kinds = sorted({k for row in wrong for k in row.targets})
        examples = " or ".join(f"--target {EXAMPLE_TARGET[k]}" for k in kinds)
        raise RecipeError(
            f"{listed} {'does' if len(wrong) == 1 else 'do'} not apply to --target {target} (only to "
            f"{' and '.join(scopes)} targets)",
            hint=f"drop {listed}, or build for a target {'it applies' if len(wrong) == 1 else 'they apply'} "
            f"to ({examples})",
            value=[row.name for row in wrong],
        )
