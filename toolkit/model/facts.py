"""Model facts read from a checkpoint's config.json: shapes, sizes and the parameter count."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields
from pathlib import Path

from toolkit.errors import UnsupportedModelError
from toolkit.model.architectures import ModelFamily, family_for, family_named

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

    @property
    def family(self) -> ModelFamily:
        return family_named(self.architecture)

    @property
    def parameter_count(self) -> int:
        return self.family.parameter_count(self)

    def to_dict(self) -> dict:
        data = asdict(self)
        data["eos_token_ids"] = list(self.eos_token_ids)
        data["parameter_count"] = self.parameter_count
        return data

    @classmethod
    def from_dict(cls, data: dict) -> ModelFacts:
        """The facts a manifest recorded (to_dict's derived `parameter_count` is left out)."""
        known = {f.name for f in fields(cls)}
        values = {k: v for k, v in data.items() if k in known}
        values["eos_token_ids"] = tuple(values.get("eos_token_ids", ()))
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
    return facts_from_config(config, source=str(path))


def facts_from_config(config: dict, source: str = "config.json") -> ModelFacts:
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
        tie_word_embeddings=bool(config.get("tie_word_embeddings", False)),
        attention_bias=bool(config.get("attention_bias", family.default_attention_bias)),
        bos_token_id=config.get("bos_token_id"),
        eos_token_ids=eos_ids,
    )


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
