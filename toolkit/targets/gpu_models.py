"""Which checkpoints the GPU targets' engine flow (TensorRT-LLM, the pinned release) builds, at which precision.

The model families (toolkit.model.architectures) say what the pinned release's converters take; this module
turns that into the GPU target's decisions: refuse a family the engine flow cannot build (naming the release
that first builds it and the way out), plan a pre-quantized checkpoint with its stored precision (or refuse a
format its converter cannot take, naming the format), and refuse quantizations the family's docs do not
cover or a pipeline its converter does not build.
"""

from __future__ import annotations

from toolkit.build_settings import SETTINGS, BuildSettings
from toolkit.errors import RecipeError, UnsupportedModelError
from toolkit.model.architectures import PINNED_ENGINE_FLOW
from toolkit.model.facts import ModelFacts
from toolkit.plan.precisions import DEFAULT_DTYPE, DEFAULT_KV_DTYPE


def check_buildable(facts: ModelFacts, settings: BuildSettings) -> None:
    """UnsupportedModelError / RecipeError for what the pinned engine flow cannot build as asked."""
    family = facts.family
    if family.not_built is not None:
        why = family.not_built
        raise UnsupportedModelError(
            f"{facts.architecture} ({family.name}) is not built by {PINNED_ENGINE_FLOW}: {why.reason}; it is "
            f"first built by {why.first_release}",
            hint=why.way_out,
            value=facts.architecture,
        )
    if (settings.pp or 1) > 1 and family.converter is not None and family.converter.pp is None:
        raise RecipeError(
            f"--pp {settings.pp}: the TensorRT-LLM {family.name} converter builds tensor parallelism only "
            f"({family.converter.script})",
            hint="drop --pp (parallelism.pp in a recipe) and use --tp",
            value=settings.pp,
        )
    refusal = family.quantize_refusals.get(settings.dtype or "")
    if refusal and facts.quantization is None:
        raise RecipeError(
            f"--dtype {settings.dtype} for {facts.architecture}: {refusal}",
            hint="use --dtype fp8 or bf16",
            value=settings.dtype,
        )


def weight_dtype(facts: ModelFacts, settings: BuildSettings) -> str:
    """The engine's weight precision: the checkpoint's own when it is pre-quantized (never re-quantized),
    else --dtype (bf16 by default)."""
    stored = facts.quantization
    if stored is None:
        return settings.dtype or DEFAULT_DTYPE
    converter = facts.family.converter
    taken = converter.prequantized if converter is not None else {}
    if stored.precision is None or stored.precision not in taken:
        raise UnsupportedModelError(
            f"the checkpoint is pre-quantized as {stored.description}, which the TensorRT-LLM "
            f"{facts.family.name} converter of {PINNED_ENGINE_FLOW} cannot take",
            hint="build from the unquantized (bf16) checkpoint and let the build quantize it "
            "(--dtype fp8 or int4-awq), or serve this one with trtllm-serve or vLLM",
            value=stored.method,
        )
    if settings.dtype is not None and settings.dtype != stored.precision:
        raise RecipeError(
            f"{SETTINGS['dtype'].flag} {settings.dtype}: the checkpoint is stored as {stored.description} "
            f"({stored.precision}), and a pre-quantized checkpoint is converted as it is",
            hint=f"drop --dtype (or pass --dtype {stored.precision}), or build from the unquantized checkpoint",
            value=settings.dtype,
        )
    return stored.precision


def kv_dtype(facts: ModelFacts, settings: BuildSettings) -> str:
    """--kv-dtype, else fp8 for a pre-quantized checkpoint that carries FP8 KV-cache scales, else bf16.
    An fp8 KV cache from a pre-quantized checkpoint needs those scales (its converter does not calibrate)."""
    stored = facts.quantization
    if settings.kv_dtype is None:
        return "fp8" if stored is not None and stored.kv_cache == "fp8" else DEFAULT_KV_DTYPE
    if settings.kv_dtype == "fp8" and stored is not None and stored.kv_cache != "fp8":
        raise RecipeError(
            f"--kv-dtype fp8: the pre-quantized checkpoint ({stored.description}) carries no FP8 KV-cache "
            "scales, and its conversion does not calibrate any",
            hint="use --kv-dtype bf16, or a checkpoint exported with kv_cache_quant_algo FP8",
            value=settings.kv_dtype,
        )
    return settings.kv_dtype
