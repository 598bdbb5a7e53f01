"""The `cpu` target: transformers' continuous batching over a paged KV cache, in Triton's Python backend."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from toolkit.build_settings import BuildSettings
from toolkit.capabilities import Capabilities
from toolkit.fsutil import copy_file
from toolkit.repository.engine import checkpoint_files
from toolkit.targets.base import HOST_OVERHEAD_BYTES, Resources
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

    def capabilities(self, settings: BuildSettings) -> Capabilities:
        not_yet = "the CPU engine does not implement it; " + GPU_HINT
        return Capabilities(
            target=self.name,
            streaming=bool(settings.decoupled),
            enable={
                "guided_decoding": not_yet,
                "logprobs": not_yet,
                "top_logprobs": not_yet,
                "prompt_logprobs": not_yet,
                "n": not_yet,
                "beam_width": "the CPU engine has no beam search; " + GPU_HINT,
                "penalties": not_yet,
                "logit_bias": not_yet,
                "bad_words": not_yet,
                "lora": not_yet,
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
