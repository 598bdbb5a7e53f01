"""Model facts read from a checkpoint's config.json: shapes, sizes and the parameter count."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields
from pathlib import Path

from toolkit.errors import UnsupportedModelError
from toolkit.model.architectures import ModelFamily, family_for, family_named, sliding_layers
from toolkit.model.quantization import StoredQuantization, read_quantization

_DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2}


@dataclass(frozen=True)
class ModelFacts:
    architecture: str
    model_type: str
    num_layers: int
    hidden_size: int
    intermediate_size: int
    num_attention_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    max_position_embeddings: int
    dtype: str
    tie_word_embeddings: bool
    attention_bias: bool
    bos_token_id: int | None
    eos_token_ids: tuple[int, ...]
    # Sliding-window attention: the window (tokens) and, per layer, whether it is windowed (() for none).
    sliding_window: int | None = None
    sliding_layers: tuple[bool, ...] = ()
    # Mixture of experts: experts per MoE layer (0: dense), routed per token, and each expert's MLP width.
    num_experts: int = 0
    experts_per_token: int = 0
    moe_intermediate_size: int = 0
    attn_logit_softcapping: float | None = None  # Gemma 2: tanh cap of attention scores
    final_logit_softcapping: float | None = None
    rope_scaling_type: str | None = None  # llama3, longrope, yarn, linear, ...
    partial_rotary_factor: float = 1.0  # the share of head_dim that is rotated (Phi-4-mini: 0.75)
    quantization: StoredQuantization | None = None  # pre-quantized weights (quantization_config)
    # The reasoning format of its answers ("deepseek_r1": a <think> ... </think> part first), if any.
    reasoning_parser: str | None = None

    @property
    def family(self) -> ModelFamily:
        return family_named(self.architecture)

    @property
    def parameter_count(self) -> int:
        return self.family.parameter_count(self)

    @property
    def active_parameter_count(self) -> int:
        """Parameters one token reads (MoE: the routed experts only; dense models: all)."""
        return self.family.active_parameter_count(self)

    def to_dict(self) -> dict:
        data = asdict(self)
        data["eos_token_ids"] = list(self.eos_token_ids)
        data["sliding_layers"] = list(self.sliding_layers)
        data["parameter_count"] = self.parameter_count
        return data

    @classmethod
    def from_dict(cls, data: dict) -> ModelFacts:
        """The facts a manifest recorded (to_dict's derived `parameter_count` is left out)."""
        known = {f.name for f in fields(cls)}
        values = {k: v for k, v in data.items() if k in known}
        values["eos_token_ids"] = tuple(values.get("eos_token_ids", ()))
        values["sliding_layers"] = tuple(values.get("sliding_layers", ()))
        values["quantization"] = StoredQuantization.from_dict(values.get("quantization"))
        return cls(**values)


def read_model_facts(checkpoint: Path) -> ModelFacts:
    """Read config.json from a checkpoint folder (or the file itself) into ModelFacts."""
    path = checkpoint / "config.json" if checkpoint.is_dir() else checkpoint
    if not path.is_file():
        raise UnsupportedModelError(
            f"no config.json in {checkpoint}",
            hint="point --model at a Hugging Face checkpoint folder (config.json, *.safetensors, tokenizer.json)",
        )
    try:
        config = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise UnsupportedModelError(
            f"{path} is not valid JSON: {exc}", hint="re-download the checkpoint"
        ) from exc
    return facts_from_config(
        config,
        source=str(path),
        folder=path.parent,
        reasoning_parser=detect_reasoning_parser(path.parent),
    )


def facts_from_config(
    config: dict,
    source: str = "config.json",
    *,
    folder: Path | None = None,
    reasoning_parser: str | None = None,
) -> ModelFacts:
    """`folder`: the checkpoint folder (ModelOpt's hf_quant_config.json may sit there); `reasoning_parser`:
    what the tokenizer (or the catalog) says of its answers' format."""
    family = family_for(config.get("architectures") or [config.get("model_type") or ""], source)
    architecture = next(a for a in config.get("architectures") or () if a in family.architectures)
    heads = _required(config, "num_attention_heads", source)
    hidden = _required(config, "hidden_size", source)
    eos = config.get("eos_token_id")
    eos_ids = tuple(eos) if isinstance(eos, list) else ((eos,) if eos is not None else ())
    return ModelFacts(
        architecture=architecture,
        model_type=config.get("model_type", family.name),
        num_layers=_required(config, "num_hidden_layers", source),
        hidden_size=hidden,
        intermediate_size=_required(config, "intermediate_size", source),
        num_attention_heads=heads,
        num_kv_heads=config.get("num_key_value_heads") or heads,
        head_dim=config.get("head_dim") or hidden // heads,
        vocab_size=_required(config, "vocab_size", source),
        max_position_embeddings=config.get("max_position_embeddings", 4096),
        dtype=_dtype(config),
        tie_word_embeddings=bool(config.get("tie_word_embeddings", family.default_tied_embeddings)),
        attention_bias=bool(config.get("attention_bias", family.default_attention_bias)),
        bos_token_id=config.get("bos_token_id"),
        eos_token_ids=eos_ids,
        **_attention_facts(family, config),
        **_expert_facts(config),
        rope_scaling_type=_rope_type(config),
        partial_rotary_factor=float(config.get("partial_rotary_factor") or 1.0),
        quantization=read_quantization(config, folder),
        reasoning_parser=reasoning_parser,
    )


def _attention_facts(family: ModelFamily, config: dict) -> dict:
    layers = sliding_layers(family.window_rule, config)
    return {
        "sliding_window": config.get("sliding_window") if layers else None,
        "sliding_layers": layers,
        "attn_logit_softcapping": config.get("attn_logit_softcapping"),
        "final_logit_softcapping": config.get("final_logit_softcapping"),
    }


def _expert_facts(config: dict) -> dict:
    """Mixtral and GPT-OSS: num_local_experts; Qwen3-MoE: num_experts and moe_intermediate_size."""
    experts = config.get("num_local_experts") or config.get("num_experts") or 0
    if not experts:
        return {}
    return {
        "num_experts": experts,
        "experts_per_token": config.get("num_experts_per_tok") or 0,
        "moe_intermediate_size": config.get("moe_intermediate_size") or 0,
    }


def _rope_type(config: dict) -> str | None:
    scaling = config.get("rope_scaling") or config.get("rope_parameters") or {}
    if not isinstance(scaling, dict):
        return None
    kind = scaling.get("rope_type") or scaling.get("type")
    return None if kind in (None, "default") else str(kind)


# Reasoning models open their answer with a <think> part (DeepSeek-R1 and its distills, as vLLM's
# deepseek_r1 reasoning parser reads them): their tokenizer holds both tags as tokens.
THINK_TOKENS = ("<think>", "</think>")


def detect_reasoning_parser(folder: Path) -> str | None:
    """ "deepseek_r1" when the checkpoint's tokenizer has <think> and </think> tokens, else None."""
    path = folder / "tokenizer.json"
    if not path.is_file():
        return None
    try:
        added = json.loads(path.read_text(encoding="utf-8")).get("added_tokens") or []
    except (json.JSONDecodeError, UnicodeDecodeError, AttributeError):
        return None
    contents = {t.get("content") for t in added if isinstance(t, dict)}
    return "deepseek_r1" if set(THINK_TOKENS) <= contents else None


def _required(config: dict, key: str, source: str) -> int:
    value = config.get(key)
    if not isinstance(value, int) or value <= 0:
        raise UnsupportedModelError(
            f"{source} has {key}={value!r}; a positive integer is required",
            hint="check that the checkpoint's config.json is complete",
        )
    return value


def _dtype(config: dict) -> str:
    dtype = config.get("torch_dtype") or config.get("dtype") or "bfloat16"
    return dtype if dtype in _DTYPE_BYTES else "bfloat16"
