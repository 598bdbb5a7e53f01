"""What the repository writer needs of a `tensorrt_llm` engine variant: the seam the targets implement.

Every other model of the repository is the same for every target. Each variant (toolkit.targets:
the CPU engine, the synthetic engine, a compiled TensorRT-LLM engine) says what it installs into the
model's version folder and what its config.pbtxt is; the manifest records its `section()`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from tritonclient.grpc import model_config_pb2 as mc

from toolkit.model.tokens import TokenFacts

if TYPE_CHECKING:
    from toolkit.model.adapters import CheckedAdapter
    from toolkit.repository.writer import RepositoryPlan

CHECKPOINT_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
    "chat_template.json",
    "generation_config.json",
    "config.json",
    "tokenizer.model",
    # Licence notices a redistribution must carry (the Gemma Terms of Use: a "Notice" file and the terms).
    "NOTICE",
    "LICENSE",
    "GEMMA_TERMS.html",
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
class EngineSection:
    """The manifest's `engine` section: what every variant has, and the variant's own settings."""

    kind: str  # cpu | synthetic | tensorrtllm
    world_size: int = 1  # ranks (GPUs) the engine runs on
    trtllm_version: str | None = (
        None  # the TensorRT-LLM release whose tensor names the engine reads
    )
    parameters: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "world_size": self.world_size,
            "trtllm_version": self.trtllm_version,
            "parameters": dict(self.parameters),
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> EngineSection:
        return cls(
            kind=str(data["kind"]),
            world_size=int(data.get("world_size", 1)),
            trtllm_version=data.get("trtllm_version"),
            parameters=dict(data.get("parameters") or {}),
        )


class EngineSpec(Protocol):
    """A `tensorrt_llm` variant, as the repository writer uses it."""

    @property
    def copies_weights(self) -> bool:
        """Whether install() copies the checkpoint's weights into the repository."""
        ...

    @property
    def trtllm_version(self) -> str | None: ...

    @property
    def lora_weights_type(self) -> str | None:
        """The data type the lora_weights input takes (None: the stock one)."""
        ...

    def section(self) -> EngineSection: ...

    def prepared(self, checkpoint: Path, tokens: TokenFacts) -> EngineSpec:
        """This engine with what it takes from the checkpoint filled in (before the build key is made)."""
        ...

    def install(self, version: Path, checkpoint: Path) -> None: ...

    def install_adapters(self, version: Path, adapters: tuple[CheckedAdapter, ...]) -> None:
        """The LoRA adapters' files in the version folder, as this engine reads them."""
        ...

    def config(self, plan: RepositoryPlan) -> mc.ModelConfig: ...
