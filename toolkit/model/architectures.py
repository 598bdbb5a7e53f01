"""Model families, one spec each: shape arithmetic, TensorRT-LLM converter, and what changes a build.

The planner (weights and KV bytes), the engine build (which converter, called how), the repository
(facts in the manifest) and deploy sizing (the CPU engine's KV pool) read these specs, so a family's
arithmetic is written once. A new family is one more `ModelFamily` here.

Sources of the per-family facts (TensorRT-LLM at the pinned release's engine flow):
- converters and their CLIs: tests/data/upstream/trtllm_tools.json (each script's argparse, with the
  commit it was read at); which flags convert a pre-quantized checkpoint: TensorRT-LLM's CLI-flow accuracy
  harness (tests/integration/defs/accuracy/accuracy_core.py, CliFlowAccuracyTestHarness.convert).
- Gemma: examples/models/core/gemma/README.md (Gemma 2 from HF checkpoints only, "maximum sequence length
  allowed is 4096"; Gemma 3 local windows given at runtime as --max_attention_window_size); its converter
  builds tensor parallelism only ("We don't support pipeline parallelism yet for Gemma").
- Phi: examples/models/core/phi/convert_checkpoint.py asserts pp_size == 1.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from toolkit.errors import UnsupportedModelError

if TYPE_CHECKING:
    from toolkit.model.facts import ModelFacts

# TensorRT-LLM example scripts of the pinned release, relative to its examples/ folder (moved under
# examples/models/core/ in 0.19).
LLAMA_CONVERTER = "models/core/llama/convert_checkpoint.py"
QWEN_CONVERTER = "models/core/qwen/convert_checkpoint.py"
GEMMA_CONVERTER = "models/core/gemma/convert_checkpoint.py"
PHI_CONVERTER = "models/core/phi/convert_checkpoint.py"
PINNED_ENGINE_FLOW = "TensorRT-LLM 0.20's TensorRT engine flow"

# How a pre-quantized checkpoint of each stored precision is converted by the Llama-style converters
# (the accuracy harness's flags for a checkpoint that already holds its quantization): ModelOpt FP8
# --use_fp8, NVFP4 --use_nvfp4, GPTQ int4 --use_weight_only --weight_only_precision int4_gptq --per_group,
# AutoAWQ int4 nothing (the converter reads its quantization_config itself).
_GPTQ = ("--use_weight_only", "--weight_only_precision", "int4_gptq", "--per_group")
LLAMA_PREQUANTIZED = {
    "fp8": ("--use_fp8",),
    "nvfp4": ("--use_nvfp4",),
    "int4-awq": (),
    "int4-gptq": _GPTQ,
}
QWEN_PREQUANTIZED = {"int4-awq": (), "int4-gptq": _GPTQ}


@dataclass(frozen=True)
class ConverterCli:
    """How one TensorRT-LLM checkpoint converter is called (its argparse, transcribed in the upstream record)."""

    script: str  # relative to examples/
    model_dir: str = "--model_dir"
    output_dir: str = "--output_dir"
    tp: str = "--tp_size"
    pp: str | None = "--pp_size"  # None: the converter builds no pipeline parallelism
    workers: bool = True
    moe: bool = False  # --moe_tp_size / --moe_ep_size
    fixed: tuple[str, ...] = ()  # arguments it always needs (gemma: --ckpt-type hf)
    # Stored weight precision -> the flags that convert such a pre-quantized checkpoint; absent: refused.
    prequantized: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    fp8_kv_cache: str | None = (
        None  # the flag that keeps a pre-quantized checkpoint's FP8 KV scales
    )
    group_size: str | None = None  # the flag for a GPTQ checkpoint's group size

    @property
    def tool(self) -> str:
        """The key of its flag list (toolkit.engine.trtllm_flags.TOOL_FLAGS): `llama/convert_checkpoint.py`."""
        return "/".join(self.script.split("/")[-2:])


LLAMA_CLI = ConverterCli(
    LLAMA_CONVERTER,
    moe=True,
    prequantized=LLAMA_PREQUANTIZED,
    fp8_kv_cache="--fp8_kv_cache",
    group_size="--group_size",
)
QWEN_CLI = ConverterCli(
    QWEN_CONVERTER, moe=True, prequantized=QWEN_PREQUANTIZED, group_size="--group_size"
)
GEMMA_CLI = ConverterCli(
    GEMMA_CONVERTER,
    model_dir="--model-dir",
    output_dir="--output-model-dir",
    tp="--world-size",
    pp=None,
    workers=False,
    fixed=("--ckpt-type", "hf"),
)
PHI_CLI = ConverterCli(PHI_CONVERTER, pp=None, moe=True)


@dataclass(frozen=True)
class NotBuilt:
    """Why the pinned engine flow cannot build a family, where it is built, and what to do instead."""

    reason: str
    first_release: str
    way_out: str


@dataclass(frozen=True)
class ParameterSplit:
    """Parameter counts by how they are stored and sharded."""

    linear: int  # attention and MLP matrices of all layers (all experts): quantized, TP-sharded, PP-split
    layer_norms: int
    embedding: int
    lm_head: int  # stored even when tied: TensorRT-LLM keeps its own LM head copy
    final_norm: int
    linear_active: int = -1  # the linear parameters one token reads (MoE: its routed experts only)

    def total(self, tied_embeddings: bool) -> int:
        """Parameters of the checkpoint (a tied LM head is the embedding's)."""
        lm_head = 0 if tied_embeddings else self.lm_head
        return self.linear + self.layer_norms + self.embedding + lm_head + self.final_norm

    def active(self, tied_embeddings: bool) -> int:
        """Parameters one token's forward pass reads (all of them, but for unrouted experts)."""
        return self.total(tied_embeddings) - self.linear + self.routed_linear

    @property
    def routed_linear(self) -> int:
        return self.linear if self.linear_active < 0 else self.linear_active


# --- which layers attend through a sliding window -------------------------------------------------
def _no_windows(config: dict, layers: int) -> tuple[bool, ...]:
    return ()


def _every_layer(config: dict, layers: int) -> tuple[bool, ...]:
    """Mistral, Mixtral, Phi-3: every layer is windowed when `sliding_window` is set."""
    return (True,) * layers if config.get("sliding_window") else ()


def _qwen2_layers(config: dict, layers: int) -> tuple[bool, ...]:
    """Qwen2: only with use_sliding_window, from layer max_window_layers on (transformers' Qwen2Config)."""
    if not (config.get("use_sliding_window") and config.get("sliding_window")):
        return ()
    first = config.get("max_window_layers", layers)
    return tuple(i >= first for i in range(layers))


def _alternating(config: dict, layers: int) -> tuple[bool, ...]:
    """Gemma 2: even layers local, odd layers global (transformers' Gemma2Config layer_types)."""
    return tuple((i + 1) % 2 == 1 for i in range(layers)) if config.get("sliding_window") else ()


def _pattern(config: dict, layers: int) -> tuple[bool, ...]:
    """Gemma 3: `sliding_window_pattern - 1` local layers, then one global (default pattern 6)."""
    pattern = config.get("sliding_window_pattern") or 6
    return (
        tuple((i + 1) % pattern != 0 for i in range(layers)) if config.get("sliding_window") else ()
    )


def sliding_layers(rule: Callable[[dict, int], tuple[bool, ...]], config: dict) -> tuple[bool, ...]:
    """Per layer, whether it is windowed: transformers 5's `layer_types` when present, else the family's rule."""
    layers = config.get("num_hidden_layers") or 0
    types = config.get("layer_types")
    if isinstance(types, list) and len(types) == layers and config.get("sliding_window"):
        return tuple(t == "sliding_attention" for t in types)
    windowed = rule(config, layers)
    return windowed if any(windowed) else ()


@dataclass(frozen=True)
class ModelFamily:
    name: str
    architectures: tuple[str, ...]  # config.json "architectures" values of this family
    converter: ConverterCli | None  # its TensorRT-LLM checkpoint converter; None with `not_built`
    # q/k/v projections carry a bias when config.json has no `attention_bias` key (Qwen2 has none,
    # and its modeling code always adds them).
    default_attention_bias: bool = False
    # The embedding is the LM head when config.json has no `tie_word_embeddings` key (Gemma's configs
    # leave it out; their transformers configs default it to true).
    default_tied_embeddings: bool = False
    norms_per_layer: int = 2  # RMS norms of hidden_size per layer (Gemma 2/3: pre and post, 4)
    qk_norm: bool = False  # per-head q and k norms of head_dim (Gemma 3, Qwen3)
    window_rule: Callable[[dict, int], tuple[bool, ...]] = _no_windows
    # The longest sequence the pinned engine flow builds it for, and where that limit is stated.
    max_seq_len: int | None = None
    max_seq_len_source: str = ""
    not_built: NotBuilt | None = None  # the pinned engine flow cannot build it (other targets may)
    # --dtype values the pinned release's docs do not quantize this family to, and why.
    quantize_refusals: Mapping[str, str] = field(default_factory=dict)

    def split(self, facts: ModelFacts) -> ParameterSplit:
        """A gated-MLP decoder with grouped-query attention; MoE layers hold `num_experts` such MLPs and a
        router, of which `experts_per_token` run per token."""
        h, kv = facts.hidden_size, facts.num_kv_heads * facts.head_dim
        q = facts.num_attention_heads * facts.head_dim
        attention = h * q + 2 * h * kv + q * h + ((q + 2 * kv) if facts.attention_bias else 0)
        mlp = routed = 3 * h * facts.intermediate_size
        if facts.num_experts:
            expert = 3 * h * (facts.moe_intermediate_size or facts.intermediate_size)
            router = h * facts.num_experts
            mlp = facts.num_experts * expert + router
            routed = facts.experts_per_token * expert + router
        norms = self.norms_per_layer * h + (2 * facts.head_dim if self.qk_norm else 0)
        return ParameterSplit(
            linear=facts.num_layers * (attention + mlp),
            layer_norms=facts.num_layers * norms,
            embedding=facts.vocab_size * h,
            lm_head=facts.vocab_size * h,
            final_norm=h,
            linear_active=facts.num_layers * (attention + routed),
        )

    def parameter_count(self, facts: ModelFacts) -> int:
        return self.split(facts).total(facts.tie_word_embeddings)

    def active_parameter_count(self, facts: ModelFacts) -> int:
        return self.split(facts).active(facts.tie_word_embeddings)

    def kv_bytes_per_token(
        self,
        facts: ModelFacts,
        element_bytes: int,
        *,
        layers: int | None = None,
        kv_heads: int | None = None,
    ) -> int:
        """K and V for one token, in bytes: 2 x layers x KV heads x head_dim x element bytes
        (`layers` / `kv_heads`: one pipeline stage's layers, one tensor-parallel rank's heads). Every layer
        counts, windowed or not: TensorRT-LLM 0.20 sizes its KV pool as if all layers were global
        (kvCacheManager.cpp, calculateMaxNumBlocks)."""
        layers = facts.num_layers if layers is None else layers
        heads = facts.num_kv_heads if kv_heads is None else kv_heads
        return 2 * layers * heads * facts.head_dim * element_bytes

    def attention_windows(self, facts: ModelFacts, max_seq_len: int) -> tuple[int, ...]:
        """Per layer, the tokens it attends to in a `max_seq_len` engine (one value when all layers share it);
        () when every layer attends to all of them (a window at least max_seq_len long changes nothing)."""
        if not facts.sliding_layers or not facts.sliding_window:
            return ()
        window = min(facts.sliding_window, max_seq_len)
        if window >= max_seq_len:
            return ()
        per_layer = tuple(window if local else max_seq_len for local in facts.sliding_layers)
        # One value applies to every layer (the Llama README's Mistral setting); a mix is listed per layer.
        return per_layer[:1] if len(set(per_layer)) == 1 else per_layer


_RELEASE_1_0 = "TensorRT-LLM 1.0 (release notes: Qwen3 / Qwen3 MoE in the TensorRT backend)"
_PYTORCH_ONLY = (
    "TensorRT-LLM's PyTorch backend (trtllm-serve); no TensorRT engine release builds it"
)
_TO_CPU = "build it for --target cpu (transformers' continuous batching runs it)"

FAMILIES: tuple[ModelFamily, ...] = (
    ModelFamily("llama", ("LlamaForCausalLM",), LLAMA_CLI),
    ModelFamily("mistral", ("MistralForCausalLM",), LLAMA_CLI, window_rule=_every_layer),
    ModelFamily(
        "mixtral",
        ("MixtralForCausalLM",),
        LLAMA_CLI,
        window_rule=_every_layer,
        quantize_refusals={
            "int4-awq": "TensorRT-LLM's Mixtral README (examples/models/core/mixtral/README.md @ 10c1d59) takes "
            "INT4 AWQ only from an AutoAWQ checkpoint through convert_checkpoint.py, not from quantize.py",
        },
    ),
    ModelFamily(
        "qwen2",
        ("Qwen2ForCausalLM",),
        QWEN_CLI,
        default_attention_bias=True,
        window_rule=_qwen2_layers,
    ),
    ModelFamily(
        "phi3",
        ("Phi3ForCausalLM",),
        PHI_CLI,
        window_rule=_every_layer,
        quantize_refusals={
            "int4-awq": "TensorRT-LLM's Phi README (examples/models/core/phi/README.md @ 2bf8c59) quantizes "
            "Phi-3/3.5/4 to FP8 and INT8 SmoothQuant, not INT4 AWQ",
        },
    ),
    ModelFamily(
        "gemma2",
        ("Gemma2ForCausalLM",),
        GEMMA_CLI,
        default_tied_embeddings=True,
        norms_per_layer=4,
        window_rule=_alternating,
        max_seq_len=4096,
        max_seq_len_source="examples/models/core/gemma/README.md: for Gemma 2 'the maximum sequence "
        "length allowed is 4096' (its engine has no per-layer window)",
    ),
    ModelFamily(
        "gemma3_text",
        ("Gemma3ForCausalLM",),
        GEMMA_CLI,
        default_tied_embeddings=True,
        norms_per_layer=4,
        qk_norm=True,
        window_rule=_pattern,
    ),
    ModelFamily(
        "qwen3",
        ("Qwen3ForCausalLM",),
        None,
        qk_norm=True,
        not_built=NotBuilt(
            "its converter asserts 'Unsupported Qwen type: qwen3' (PyTorch backend only at 0.20)",
            _RELEASE_1_0,
            _TO_CPU + ", or serve it with trtllm-serve / vLLM on the GPU",
        ),
    ),
    ModelFamily(
        "qwen3_moe",
        ("Qwen3MoeForCausalLM",),
        None,
        qk_norm=True,
        not_built=NotBuilt(
            "no converter or model class takes it (Qwen3MoeForCausalLM is not in MODEL_MAP)",
            _RELEASE_1_0,
            _TO_CPU + ", or serve it with trtllm-serve / vLLM on the GPU",
        ),
    ),
    ModelFamily(
        "gpt_oss",
        ("GptOssForCausalLM",),
        None,
        not_built=NotBuilt(
            "MoE with MXFP4 experts, attention sinks and alternating 128-token windows: not in MODEL_MAP",
            "TensorRT-LLM 1.1, PyTorch backend only (trtllm-serve); no TensorRT engine release builds it",
            "serve it with trtllm-serve (TensorRT-LLM >= 1.1) or vLLM on the GPU",
        ),
    ),
)
# Refused on every target: what neither the engine flow nor the CPU engine serves as a text model.
UNSERVED: dict[str, NotBuilt] = {
    "DeepseekV3ForCausalLM": NotBuilt(
        "multi-head latent attention and 671B parameters (16 x H100 at FP8)",
        _PYTORCH_ONLY,
        "serve it with trtllm-serve (TensorRT-LLM's PyTorch backend), vLLM or SGLang",
    ),
    "Gemma3ForConditionalGeneration": NotBuilt(
        "multimodal Gemma 3 (4B and up: SigLIP vision tower + text decoder); the gemma converter takes "
        "model_type gemma, gemma2 and gemma3_text only",
        _PYTORCH_ONLY,
        "use a text-only Gemma 3 (Gemma3ForCausalLM: gemma-3-1b-it, gemma-3-270m), or serve the multimodal "
        "one with trtllm-serve or vLLM",
    ),
}
_BY_ARCHITECTURE = {arch: family for family in FAMILIES for arch in family.architectures}
SUPPORTED_ARCHITECTURES = tuple(sorted(_BY_ARCHITECTURE))


def family_for(architectures: list[str] | tuple[str, ...], source: str) -> ModelFamily:
    """The family of the first architecture we know; UnsupportedModelError naming the known ones."""
    for name in architectures:
        if name in _BY_ARCHITECTURE:
            return _BY_ARCHITECTURE[name]
        if name in UNSERVED:
            raise unserved_error(name, UNSERVED[name], source)
    raise UnsupportedModelError(
        f"architecture {list(architectures) or '(none)'!r} in {source} is not supported",
        hint=f"use a checkpoint of one of: {', '.join(SUPPORTED_ARCHITECTURES)}",
        value=list(architectures),
    )


def unserved_error(architecture: str, why: NotBuilt, where: str) -> UnsupportedModelError:
    return UnsupportedModelError(
        f"{architecture} ({where}) is not served by this toolkit: {why.reason}; it is built by {why.first_release}",
        hint=why.way_out,
        value=architecture,
    )


def family_named(architecture: str) -> ModelFamily:
    return family_for([architecture], "the plan")
