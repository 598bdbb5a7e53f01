"""The `cpu` target: transformers' continuous batching over a paged KV cache, in Triton's Python backend."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from toolkit.build_settings import BuildSettings
from toolkit.capabilities import MAX_TOP_LOGPROBS, Capabilities
from toolkit.errors import UnsupportedModelError
from toolkit.fsutil import copy_file
from toolkit.repository.engine import checkpoint_files
from toolkit.targets.base import (
    HOST_OVERHEAD_BYTES,
    LORA_HINT,
    Resources,
    model_engine_capabilities,
)
from toolkit.targets.python import PythonEngine, PythonTarget

FP32_BYTES = 4
# The slowest CPU stream the drain is sized for, in tokens/s (measure yours with toolkit bench).
CPU_TOKENS_PER_S = 10.0
# CPUs a CPU engine replica asks for when its build left the thread count to torch.
DEFAULT_CPUS = 4
GPU_HINT = "build for a GPU target (--target h100-sxm), whose TensorRT-LLM backend honours it"


@dataclass(frozen=True)
class CpuEngine(PythonEngine):
    """transformers' continuous batching over a paged KV cache, fp32 weights copied into the repository."""

    num_threads: int = (
        0  # torch threads; 0: the usable CPUs but one (the engine decides as it loads)
    )
    kind: ClassVar[str] = "cpu"
    source_folder: ClassVar[str] = "tensorrt_llm_cpu"
    copies_weights: ClassVar[bool] = True

    def install(self, version: Path, checkpoint: Path) -> None:
        super().install(version, checkpoint)
        for path in checkpoint_files(checkpoint):
            copy_file(path.resolve(), version / "weights" / path.name)

    def engine_parameters(self) -> dict:
        return {"num_threads": self.num_threads, "checkpoint_dir": "weights"}


class CpuTarget(PythonTarget):
    name = "cpu"
    kind = "cpu"
    description = "the CPU engine (transformers' continuous batching in Triton's Python backend)"
    engine_class = CpuEngine
    engine_settings = ("num_threads",)

    def plan(self, settings: BuildSettings, model):
        if model.kind != "embedded":  # the embedded models are known to run; others are read first
            from toolkit.plan.source import load_model_for_plan

            check_model(load_model_for_plan(model).facts)
        return super().plan(settings, model)

    def capabilities(self, settings: BuildSettings) -> Capabilities:
        """What the CPU engine does for real (model_repo/tensorrt_llm_cpu/1): guided decoding of every kind
        (llguidance masks in the batch step), each token's exact log prob and its top alternatives, n > 1
        (forks of the request, one response per sequence: decoupled only), TensorRT-LLM's penalties and
        embedding_bias, prefix-cache reuse reported per request, the --lora adapters per request."""
        not_yet = "the CPU engine does not implement it; " + GPU_HINT
        return model_engine_capabilities(
            self.name,
            settings,
            top_logprobs=MAX_TOP_LOGPROBS,
            top_logprobs_source="engine",
            engine_stream_interval=True,
            enable={
                "prompt_logprobs": "the CPU engine computes log probs of generated tokens only",
                "n": "the engine answers each of n sequences on its own: rebuild without --no-decoupled",
                "beam_width": "the CPU engine has no beam search; " + GPU_HINT,
                "bad_words": not_yet,
                "lora": LORA_HINT,
                "batched_prompts": "the CPU engine takes one prompt per request: send [1, N] input_ids",
                "generation_logits": not_yet,
                "context_logits": not_yet,
                "top_p_decay": not_yet,
                "streaming": "rebuild without --no-decoupled",
            },
        )

    def slowest_stream_tokens_per_s(self, repository) -> float:
        return CPU_TOKENS_PER_S

    def resources(self, repository, load_bytes: int, world_size: int) -> Resources:
        """Its memory: the overhead, the weights twice (loading), and the fp32 KV pool."""
        engine = self.engine_from_section(repository.manifest.engine)
        facts = repository.manifest.model.facts
        pool = (
            facts.family.kv_bytes_per_token(facts, FP32_BYTES) * repository.limits.kv_cache_tokens
        )
        cpus = getattr(engine, "num_threads", 0) or DEFAULT_CPUS
        return Resources(HOST_OVERHEAD_BYTES + 2 * load_bytes + pool, cpus)

    def deploy_notes(self, repository, drain_s: int) -> list[str]:
        return [
            f"drain timeout {drain_s}s assumes at least {CPU_TOKENS_PER_S:.0f} tokens/s per stream; measure "
            "with toolkit bench and pass --drain-timeout"
        ]


def check_model(facts) -> None:
    """Refuse what transformers' continuous batching would run as a different model than the checkpoint.

    Its paged attention (integrations/eager_paged.py, transformers 5.24) ignores `softcap`, and sdpa refuses
    it: Gemma 2's attention-logit soft-capping would be silently dropped (measured: a capped tiny Gemma 2 gives
    generate()'s uncapped tokens under continuous batching). The engine loads float32 weights, so a
    pre-quantized checkpoint is not taken either.
    """
    if facts.attn_logit_softcapping:
        raise UnsupportedModelError(
            f"{facts.architecture} soft-caps its attention logits (attn_logit_softcapping="
            f"{facts.attn_logit_softcapping}); transformers' paged attention, which the CPU engine runs, drops "
            "the cap, so it would serve a different model",
            hint="build it for a GPU target (--target h100-sxm: TensorRT-LLM applies the cap as max_attn_value)",
            value=facts.attn_logit_softcapping,
        )
    if facts.quantization is not None:
        raise UnsupportedModelError(
            f"the checkpoint is pre-quantized as {facts.quantization.description}; the CPU engine runs "
            "float32 weights and does not dequantize it",
            hint="build the unquantized checkpoint for --target cpu, or this one for a GPU target",
            value=facts.quantization.method,
        )
