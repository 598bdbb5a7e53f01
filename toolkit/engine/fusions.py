"""The FP8 / tensor-parallel fusions of trtllm-build, one build setting each, with the conditions under
which the pinned release keeps them.

trtllm-build drops a fusion it cannot apply with only a warning ("Overriding reduce_fusion to False"),
so an engine would silently lack what a recipe asked for: the plan refuses such a request instead,
naming the condition. Conditions, with their sources (tests/data/upstream/trtllm_tools.json,
trtllm-build.builder_rules):
- reduce_fusion: kept only at TP > 1 for LlamaForCausalLM / Gemma2ForCausalLM / MedusaForCausalLM
  checkpoints (tensorrt_llm/builder.py, build());
- user_buffer: kept only with reduce_fusion (same place); NVIDIA documents it for FP8 Llama only;
- gemm_swiglu_plugin: an fp8-only plugin, applied where the gated MLP is fused (use_fused_mlp) and, per
  NVIDIA's FP8 guide, on Hopper only;
- low_latency_gemm_plugin: an fp8-only plugin, not to be combined with --gemm_plugin fp8.
NVIDIA's FP8 case study (Llama 70B TP4 on H100) measured all four together at +14 % tokens/s.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from toolkit.build_settings import SETTINGS, BuildSettings
from toolkit.errors import EngineBuildError
from toolkit.plan.memory import MemoryPlan
from toolkit.plan.precisions import WEIGHT_PRECISIONS

# Checkpoint architectures trtllm-build keeps reduce_fusion for (those of our families among them).
REDUCE_FUSION_ARCHITECTURES = ("LlamaForCausalLM", "Gemma2ForCausalLM", "MedusaForCausalLM")
HOPPER_SM = "9.0"


@dataclass(frozen=True)
class Fusion:
    setting: str  # the BuildSettings field
    flag: str  # trtllm-build's
    value: str  # what the flag is given when on
    # Why the pinned release would drop it for this build (None: it keeps it).
    problem: Callable[[MemoryPlan, BuildSettings, str], str | None]


def _reduce_fusion(memory: MemoryPlan, settings: BuildSettings, sm: str) -> str | None:
    if memory.tp_size == 1:
        return "it fuses the all-reduce that only TP > 1 has, and trtllm-build turns it off at TP 1"
    if memory.architecture not in REDUCE_FUSION_ARCHITECTURES:
        return (
            f"trtllm-build keeps it only for {', '.join(REDUCE_FUSION_ARCHITECTURES)} checkpoints, "
            f"and this one is {memory.architecture}"
        )
    return None


def _user_buffer(memory: MemoryPlan, settings: BuildSettings, sm: str) -> str | None:
    if not settings.reduce_fusion:
        return "trtllm-build turns it off without --reduce-fusion (engine.reduce_fusion)"
    return _needs_fp8(memory, "NVIDIA supports user buffers for FP8 Llama only")


def _gemm_swiglu(memory: MemoryPlan, settings: BuildSettings, sm: str) -> str | None:
    problem = _needs_fp8(memory, "the GEMM + SwiGLU plugin runs FP8 only")
    if problem is None and not WEIGHT_PRECISIONS[memory.dtype].fused_mlp:
        problem = "it replaces the fused gate/up GEMM, which this precision does not build"
    if problem is None and sm != HOPPER_SM:
        problem = f"NVIDIA supports it on Hopper (SM {HOPPER_SM}) only, and {memory.gpu} is SM {sm}"
    return problem


def _low_latency_gemm(memory: MemoryPlan, settings: BuildSettings, sm: str) -> str | None:
    return _needs_fp8(memory, "the low-latency GEMM plugin runs FP8 only")


def _needs_fp8(memory: MemoryPlan, why: str) -> str | None:
    if WEIGHT_PRECISIONS[memory.dtype].tensor_cores != "fp8":
        return f"{why}, and the weights are --dtype {memory.dtype}"
    return None


FUSIONS: tuple[Fusion, ...] = (
    Fusion("reduce_fusion", "--reduce_fusion", "enable", _reduce_fusion),
    Fusion("user_buffer", "--user_buffer", "enable", _user_buffer),
    Fusion("gemm_swiglu_plugin", "--gemm_swiglu_plugin", "fp8", _gemm_swiglu),
    Fusion("low_latency_gemm_plugin", "--low_latency_gemm_plugin", "fp8", _low_latency_gemm),
)


def chosen_fusions(settings: BuildSettings) -> tuple[str, ...]:
    """The settings of the fusions asked for, in FUSIONS' order."""
    return tuple(f.setting for f in FUSIONS if getattr(settings, f.setting))


def check_fusions(memory: MemoryPlan, settings: BuildSettings, gpu_sm: str) -> None:
    """Refuse a fusion the pinned trtllm-build would turn off for this engine."""
    for fusion in FUSIONS:
        if not getattr(settings, fusion.setting):
            continue
        problem = fusion.problem(memory, settings, gpu_sm)
        if problem is not None:
            row = SETTINGS[fusion.setting]
            raise EngineBuildError(
                f"--{row.option} ({row.recipe_key} in a recipe) for {memory.model} at TP "
                f"{memory.tp_size}: {problem}",
                hint=f"drop --{row.option} (or set {row.recipe_key}: false)",
                value=fusion.setting,
            )


def fusion_argv(fusions: tuple[str, ...]) -> list[str]:
    """trtllm-build's flags for the fusions named (settings fields)."""
    argv: list[str] = []
    for fusion in FUSIONS:
        if fusion.setting in fusions:
            argv += [fusion.flag, fusion.value]
    return argv
