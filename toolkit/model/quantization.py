"""A checkpoint's stored quantization: `quantization_config` in config.json, or ModelOpt's
hf_quant_config.json beside it.

Formats (as their producers write them):
- ModelOpt unified HF export: config.json `quantization_config` {"quant_method": "modelopt",
  "quant_algo": "FP8" | "NVFP4", "kv_cache_quant_algo": "FP8", ...}, or the older hf_quant_config.json
  {"producer": {"name": "modelopt"}, "quantization": {"quant_algo": ..., "kv_cache_quant_algo": ...}}.
- AutoAWQ: {"quant_method": "awq", "bits": 4, "group_size": 128, ...}.
- AutoGPTQ / GPTQModel: {"quant_method": "gptq", "bits": 4, "group_size": 128, ...}.
Anything else (compressed-tensors, bitsandbytes, fbgemm_fp8, mxfp4, ...) is read as its method name,
so a target can refuse it by name.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from toolkit.errors import UnsupportedModelError

MODELOPT_FILE = "hf_quant_config.json"
# ModelOpt quant_algo -> the toolkit's weight precision (toolkit.plan.precisions).
_MODELOPT_PRECISIONS = {"FP8": "fp8", "NVFP4": "nvfp4"}
# Weight-only int4 formats of AutoAWQ / AutoGPTQ, by quant_method.
_INT4_PRECISIONS = {"awq": "int4-awq", "gptq": "int4-gptq"}


@dataclass(frozen=True)
class StoredQuantization:
    """How a checkpoint's weights are stored, when they are not plain bf16/fp16/fp32."""

    method: str  # quant_method: modelopt, awq, gptq, compressed-tensors, bitsandbytes, ...
    algo: str | None = None  # ModelOpt's quant_algo (FP8, NVFP4, ...), or e.g. "4-bit" for AWQ/GPTQ
    precision: str | None = (
        None  # the toolkit's weight precision when known: fp8, nvfp4, int4-awq, ...
    )
    group_size: int | None = None  # weights per scale of a group-quantized format
    kv_cache: str | None = None  # fp8: the checkpoint carries FP8 KV-cache scales

    @property
    def description(self) -> str:
        """How messages name the format: "ModelOpt FP8", "AWQ int4 (group 128)", "compressed-tensors"."""
        names = {"modelopt": "ModelOpt", "awq": "AWQ", "gptq": "GPTQ"}
        name = names.get(self.method, self.method)
        detail = f" {self.algo}" if self.algo else ""
        group = f" (group {self.group_size})" if self.group_size else ""
        return f"{name}{detail}{group}"

    @classmethod
    def from_dict(cls, data: dict | None) -> StoredQuantization | None:
        return None if not data else cls(**data)


def read_quantization(config: dict, folder: Path | None = None) -> StoredQuantization | None:
    """The stored quantization of a checkpoint (None: unquantized). `folder`: where hf_quant_config.json
    may sit beside config.json (planning from a catalog copy has none)."""
    section = config.get("quantization_config")
    if isinstance(section, dict) and section:
        return _from_section(section)
    modelopt = _modelopt_file(folder)
    if modelopt is not None:
        return _modelopt(modelopt.get("quantization") or {})
    return None


def _from_section(section: dict) -> StoredQuantization:
    method = str(section.get("quant_method") or "unknown").lower()
    if method == "modelopt":
        return _modelopt(section)
    if method in _INT4_PRECISIONS:
        bits = section.get("bits", section.get("w_bit"))
        group = section.get("group_size", section.get("q_group_size"))
        precision = _INT4_PRECISIONS[method] if bits == 4 else None
        return StoredQuantization(method, f"{bits}-bit", precision, _int_or_none(group))
    return StoredQuantization(method)


def _modelopt(section: dict) -> StoredQuantization:
    algo = section.get("quant_algo")
    algo = str(algo).upper() if algo else None
    kv = section.get("kv_cache_quant_algo")
    if kv is None and isinstance(section.get("kv_cache_scheme"), dict):
        # The unified export's compressed-tensors-style key: {"num_bits": 8, "type": "float"} is FP8.
        scheme = section["kv_cache_scheme"]
        kv = "FP8" if scheme.get("type") == "float" and scheme.get("num_bits") == 8 else None
    return StoredQuantization(
        "modelopt",
        algo,
        _MODELOPT_PRECISIONS.get(algo or ""),
        _int_or_none(section.get("group_size")),
        "fp8" if str(kv).upper() == "FP8" else None,
    )


def _modelopt_file(folder: Path | None) -> dict | None:
    path = None if folder is None else folder / MODELOPT_FILE
    if path is None or not path.is_file():
        return None
    try:
        data = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise UnsupportedModelError(
            f"{path} is not valid JSON: {exc}", hint="re-download the checkpoint", value=str(path)
        ) from exc
    return data if isinstance(data, dict) else None


def _int_or_none(value) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None
