"""The `tensorrt_llm` model behind one seam: the CPU engine, the synthetic engine, or a compiled TensorRT-LLM engine.

Every other model of the repository is the same for all three. Each variant says what it installs
into the model's version folder and what its config.pbtxt is; the manifest records `describe()`,
and `engine_from_manifest` gives the variant back.
"""

from __future__ import annotations

import shutil
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import ClassVar

from tritonclient.grpc import model_config_pb2 as mc

from toolkit.errors import RepositoryError
from toolkit.fsutil import copy_file
from toolkit.model.facts import ModelFacts
from toolkit.model.tokens import TokenFacts
from toolkit.repository import configs
from toolkit.repository import contract as c
from toolkit.repository.limits import RepositoryLimits
from toolkit.repository.sources import COMMON_MODULES, model_repo_sources

CHECKPOINT_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
    "chat_template.json",
    "generation_config.json",
    "config.json",
    "tokenizer.model",
)
# The tensorrtllm backend checks for cancelled requests this often; the Python engines use the same parameter.
CANCELLATION_CHECK_PERIOD_MS = 100


def checkpoint_files(checkpoint: Path) -> list[Path]:
    """The files a repository takes from a checkpoint: safetensors weights and their index, configs, tokenizer."""
    return sorted(
        p
        for p in checkpoint.iterdir()
        if p.is_file()
        and (
            p.suffix == ".safetensors"
            or p.name in CHECKPOINT_FILES
            or p.name.endswith(".safetensors.index.json")
        )
    )


@dataclass(frozen=True)
class _PythonEngine:
    """What the CPU and synthetic engines share: a Python-backend model with the engine's tensor contract."""

    kind: ClassVar[str]
    source_folder: ClassVar[str]

    @property
    def target(self) -> str:
        return self.kind

    @property
    def world_size(self) -> int:
        return 1

    @property
    def trtllm_version(self) -> str | None:
        """The TensorRT-LLM release whose tensor names the engine reads: the pinned one."""
        return None

    def describe(self) -> dict:
        return {"kind": self.kind, **asdict(self)}

    def install(self, version: Path, checkpoint: Path) -> None:
        sources = model_repo_sources()
        shutil.copytree(
            sources / self.source_folder / "1",
            version,
            ignore=shutil.ignore_patterns("__pycache__"),
        )
        for name in COMMON_MODULES:
            shutil.copy2(sources / "common" / f"{name}.py", version / f"{name}.py")

    def config(
        self, limits: RepositoryLimits, tokens: TokenFacts, facts: ModelFacts, decoupled: bool
    ) -> mc.ModelConfig:
        parameters = {
            "max_seq_len": limits.max_seq_len,
            "max_output_len": limits.max_output_len,
            "max_num_tokens": limits.max_num_tokens,
            "max_queue_size": limits.max_queue_size,
            "end_id": tokens.end_id,
            "pad_id": tokens.pad_id,
            "exclude_input_in_output": True,
            "vocab_size": facts.vocab_size,
            "kv_block_size": limits.kv_block_size,
            "kv_cache_blocks": limits.kv_cache_blocks,
            "cancellation_check_period_ms": CANCELLATION_CHECK_PERIOD_MS,
            "decoupled": decoupled,
            **self.engine_parameters(),
        }
        return configs.python_model(
            c.ENGINE,
            c.ENGINE_INPUTS,
            c.ENGINE_OUTPUTS,
            max_batch_size=limits.max_batch_size,
            decoupled=decoupled,
            parameters=parameters,
        )

    def engine_parameters(self) -> dict:
        return {}


@dataclass(frozen=True)
class CpuEngine(_PythonEngine):
    """transformers' continuous batching over a paged KV cache, fp32 weights copied into the repository."""

    num_threads: int = 0  # torch threads; 0: torch's default
    kind: ClassVar[str] = "cpu"
    source_folder: ClassVar[str] = "tensorrt_llm_cpu"

    def install(self, version: Path, checkpoint: Path) -> None:
        super().install(version, checkpoint)
        for path in checkpoint_files(checkpoint):
            copy_file(path.resolve(), version / "weights" / path.name)

    def engine_parameters(self) -> dict:
        return {"num_threads": self.num_threads, "checkpoint_dir": "weights"}


@dataclass(frozen=True)
class SyntheticEngine(_PythonEngine):
    """Tokens without a model at a set step time, to measure the serving stack alone."""

    step_time_ms: float = 0.0
    token_ids: tuple[int, ...] = field(
        default=()
    )  # cycled through as output; plain words of the tokenizer
    kind: ClassVar[str] = "synthetic"
    source_folder: ClassVar[str] = "tensorrt_llm_synthetic"

    def describe(self) -> dict:
        return {
            "kind": self.kind,
            "step_time_ms": self.step_time_ms,
            "token_ids": list(self.token_ids),
        }

    def engine_parameters(self) -> dict:
        return {
            "step_time_ms": self.step_time_ms,
            "token_ids": ",".join(str(i) for i in self.token_ids),
            "cancel_check_steps": 64,
        }


@dataclass(frozen=True)
class TrtllmEngine:
    """A compiled TensorRT-LLM engine, served by the tensorrtllm backend from where it was built."""

    target: str  # the GPU profile it was built for
    engine_dir: str
    trtllm_version: str
    max_batch_size: int  # the engine's own build_config.max_batch_size
    world_size: int
    runtime: dict  # EngineRuntime of the build: KV pool, reuse, chunked context, scheduler policy
    kind: ClassVar[str] = "tensorrtllm"

    def describe(self) -> dict:
        return {"kind": self.kind, **asdict(self)}

    def install(self, version: Path, checkpoint: Path) -> None:
        version.mkdir(parents=True)  # the engine stays in engine_dir; gpt_model_path names it

    def config(
        self, limits: RepositoryLimits, tokens: TokenFacts, facts: ModelFacts, decoupled: bool
    ) -> mc.ModelConfig:
        config = mc.ModelConfig(
            name=c.ENGINE, backend="tensorrtllm", max_batch_size=self.max_batch_size
        )
        config.input.extend(configs.tensor_inputs(c.engine_inputs(self.trtllm_version)))
        config.output.extend(configs.tensor_outputs(c.ENGINE_OUTPUTS))
        config.model_transaction_policy.decoupled = decoupled
        config.dynamic_batching.preferred_batch_size.append(self.max_batch_size)
        if limits.max_queue_size:
            config.dynamic_batching.default_queue_policy.max_queue_size = limits.max_queue_size
        config.instance_group.append(
            mc.ModelInstanceGroup(count=1, kind=mc.ModelInstanceGroup.KIND_CPU)
        )
        configs.set_parameters(
            config,
            {
                "gpt_model_type": "inflight_fused_batching",
                "gpt_model_path": self.engine_dir,
                "max_beam_width": 1,
                # Both bounds: the runtime uses the smaller of the token count and the free-memory share.
                "max_tokens_in_paged_kv_cache": self.runtime["kv_cache_tokens"],
                "kv_cache_free_gpu_mem_fraction": self.runtime["kv_cache_free_gpu_mem_fraction"],
                "enable_kv_cache_reuse": self.runtime["enable_kv_cache_reuse"],
                "enable_chunked_context": self.runtime["enable_chunked_context"],
                "batch_scheduler_policy": self.runtime["batch_scheduler_policy"],
                "exclude_input_in_output": True,
                "cancellation_check_period_ms": CANCELLATION_CHECK_PERIOD_MS,
            },
        )
        return config

    @classmethod
    def from_engine(cls, target: str, info) -> TrtllmEngine:
        """From toolkit.engine.EngineInfo of a built engine folder (its config.json and build record)."""
        return cls(
            target=target,
            engine_dir=str(Path(info.engine_dir).resolve()),
            trtllm_version=info.trtllm_version,
            max_batch_size=info.max_batch_size,
            world_size=info.world_size,
            runtime=dict(info.runtime),
        )


EngineSpec = CpuEngine | SyntheticEngine | TrtllmEngine
_KINDS = {cls.kind: cls for cls in (CpuEngine, SyntheticEngine, TrtllmEngine)}


def engine_from_manifest(data: dict) -> EngineSpec:
    """The variant a manifest's `engine` section describes."""
    kind = data.get("kind") if isinstance(data, dict) else None
    if kind not in _KINDS:
        raise RepositoryError(
            f"the manifest names an unknown engine kind {kind!r}",
            hint="rebuild the repository with this toolkit",
        )
    values = {k: v for k, v in data.items() if k != "kind"}
    if kind == "synthetic":
        values["token_ids"] = tuple(values.get("token_ids", ()))
    try:
        return _KINDS[kind](**values)
    except TypeError as exc:
        raise RepositoryError(
            f"the manifest's engine section does not fit a {kind} engine: {exc}",
            hint="rebuild the repository",
        ) from exc
