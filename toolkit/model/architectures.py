"""Model families, one spec each: shape arithmetic, TensorRT-LLM converter, and what changes a build.

The planner (weights and KV bytes), the engine build (which converter), the repository (facts in
the manifest) and deploy sizing (the CPU engine's KV pool) read these specs, so a family's
arithmetic is written once. A new family is one more `ModelFamily` here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from toolkit.errors import UnsupportedModelError

if TYPE_CHECKING:
    from toolkit.model.facts import ModelFacts

# TensorRT-LLM example scripts of the pinned release, relative to its examples/ folder (moved under
# examples/models/core/ in 0.19). One converter per family: the Llama one knows nothing of Qwen2's
# q/k/v biases and would drop them.
LLAMA_CONVERTER = "models/core/llama/convert_checkpoint.py"
QWEN_CONVERTER = "models/core/qwen/convert_checkpoint.py"


@dataclass(frozen=True)
class ParameterSplit:
    """Parameter counts by how they are stored and sharded."""

    linear: int  # attention and MLP matrices of all layers: quantized, TP-sharded, PP-split
    layer_norms: int
    embedding: int
    lm_head: int  # stored even when tied: TensorRT-LLM keeps its own LM head copy
    final_norm: int

    def total(self, tied_embeddings: bool) -> int:
        """Parameters of the checkpoint (a tied LM head is the embedding's)."""
        lm_head = 0 if tied_embeddings else self.lm_head
        return self.linear + self.layer_norms + self.embedding + lm_head + self.final_norm


@dataclass(frozen=True)
class ModelFamily:
    name: str
    architectures: tuple[str, ...]  # config.json "architectures" values of this family
    converter: str  # its TensorRT-LLM checkpoint converter (LLAMA_CONVERTER, ...)
    # q/k/v projections carry a bias when config.json has no `attention_bias` key (Qwen2 has none,
    # and its modeling code always adds them).
    default_attention_bias: bool = False

    def split(self, facts: ModelFacts) -> ParameterSplit:
        """A gated-MLP decoder with grouped-query attention and two RMS norms per layer."""
        h, kv = facts.hidden_size, facts.num_kv_heads * facts.head_dim
        q = facts.num_attention_heads * facts.head_dim
        attention = h * q + 2 * h * kv + q * h + ((q + 2 * kv) if facts.attention_bias else 0)
        mlp = 3 * h * facts.intermediate_size
        return ParameterSplit(
            linear=facts.num_layers * (attention + mlp),
            layer_norms=facts.num_layers * 2 * h,
            embedding=facts.vocab_size * h,
            lm_head=facts.vocab_size * h,
            final_norm=h,
        )

    def parameter_count(self, facts: ModelFacts) -> int:
        return self.split(facts).total(facts.tie_word_embeddings)

    def kv_bytes_per_token(
        self,
        facts: ModelFacts,
        element_bytes: int,
        *,
        layers: int | None = None,
        kv_heads: int | None = None,
    ) -> int:
        """K and V for one token, in bytes: 2 x layers x KV heads x head_dim x element bytes
        (`layers` / `kv_heads`: one pipeline stage's layers, one tensor-parallel rank's heads)."""
        layers = facts.num_layers if layers is None else layers
        heads = facts.num_kv_heads if kv_heads is None else kv_heads
        return 2 * layers * heads * facts.head_dim * element_bytes


FAMILIES: tuple[ModelFamily, ...] = (
    ModelFamily("llama", ("LlamaForCausalLM",), LLAMA_CONVERTER),
    ModelFamily("mistral", ("MistralForCausalLM",), LLAMA_CONVERTER),
    ModelFamily("qwen2", ("Qwen2ForCausalLM",), QWEN_CONVERTER, default_attention_bias=True),
)
_BY_ARCHITECTURE = {arch: family for family in FAMILIES for arch in family.architectures}
SUPPORTED_ARCHITECTURES = tuple(sorted(_BY_ARCHITECTURE))


def family_for(architectures: list[str] | tuple[str, ...], source: str) -> ModelFamily:
    """The family of the first architecture we know; UnsupportedModelError naming the known ones."""
    for name in architectures:
        if name in _BY_ARCHITECTURE:
            return _BY_ARCHITECTURE[name]
    raise UnsupportedModelError(
        f"architecture {list(architectures) or '(none)'!r} in {source} is not supported",
        hint=f"use a checkpoint of one of: {', '.join(SUPPORTED_ARCHITECTURES)}",
        value=list(architectures),
    )


def family_named(architecture: str) -> ModelFamily:
    return family_for([architecture], "the plan")
