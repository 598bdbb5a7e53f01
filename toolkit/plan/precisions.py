"""The precisions a GPU engine's weights and KV cache can have: each declared once, with what it changes.

The planner (bytes per weight), the engine build (quantizer format, plugins), the build settings
(choices, help) and the checks read these records; a new precision is one more record here.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class WeightPrecision:
    name: str  # the --dtype value
    # Bytes per weight of a quantized linear layer (embeddings, LM head and norms stay bf16).
    linear_bytes: float
    # ModelOpt's quantize.py --qformat; None: no quantizer, the family's converter in bf16.
    qformat: str | None
    # trtllm-build --gemm_plugin: it helps bf16 and weight-only int4; TensorRT's own FP8 GEMMs are
    # faster than the plugin for fp8 (perf-best-practices), so fp8 leaves it off.
    gemm_plugin: str
    # --use_fused_mlp enable: trtllm-build turns it off itself for weight-only int4.
    fused_mlp: bool
    needs_fp8_hardware: bool  # FP8 tensor cores: SM 8.9 or newer
    # trtllm-build keeps paged context FMHA under an fp8 KV cache only when the checkpoint's quant_algo
    # is FP8, W4A8_AWQ or NVFP4 (tensorrt_llm/builder.py, build()); bf16 and W4A16_AWQ are not.
    fp8_kv_cache: bool
    description: str
    # The tensor cores its GEMMs run on ("bf16" or "fp8"): which peak the performance estimate takes
    # (weight-only int4 dequantizes to bf16 in the GEMM).
    tensor_cores: str = "bf16"
    # Only ever read from a pre-quantized checkpoint (no --dtype quantizes to it).
    stored_only: bool = False
    needs_fp4_hardware: bool = False  # FP4 tensor cores: Blackwell, SM 10.0 or newer


@dataclass(frozen=True)
class KvPrecision:
    name: str  # the --kv-dtype value
    bytes: int  # per element of K or V
    needs_fp8_hardware: bool
    description: str


WEIGHT_PRECISIONS: dict[str, WeightPrecision] = {
    p.name: p
    for p in (
        WeightPrecision("bf16", 2.0, None, "auto", True, False, False, "bfloat16, no quantization"),
        # One byte per weight plus per-tensor scales.
        WeightPrecision(
            "fp8",
            1.0,
            "fp8",
            "disable",
            True,
            True,
            True,
            "FP8 weights and activations",
            tensor_cores="fp8",
        ),
        # 4 bits plus one bf16 scale per group of 128 weights (ModelOpt's default awq_block_size).
        WeightPrecision(
            "int4-awq",
            0.5 + 2 / 128,
            "int4_awq",
            "auto",
            False,
            False,
            False,
            "INT4 AWQ weight-only",
        ),
        # Pre-quantized checkpoints only. GPTQ: 4 bits plus an fp16 scale and a 4-bit zero point per group
        # of 128; NVFP4: 4 bits plus one FP8 scale per 16 weights (ModelOpt's NVFP4 block).
        WeightPrecision(
            "int4-gptq",
            0.5 + (2 + 0.5) / 128,
            None,
            "auto",
            False,
            False,
            False,
            "INT4 GPTQ weight-only (pre-quantized)",
            stored_only=True,
        ),
        WeightPrecision(
            "nvfp4",
            0.5 + 1 / 16,
            None,
            "disable",
            True,
            True,
            True,
            "NVFP4 weights and activations (pre-quantized)",
            stored_only=True,
            needs_fp4_hardware=True,
        ),
    )
}
KV_PRECISIONS: dict[str, KvPrecision] = {
    p.name: p
    for p in (
        KvPrecision("bf16", 2, False, "bfloat16 KV cache"),
        KvPrecision("fp8", 1, True, "FP8 KV cache"),
    )
}
# What --dtype takes: the precisions a build can quantize to (the rest come with their checkpoint).
WEIGHT_DTYPES = tuple(name for name, p in WEIGHT_PRECISIONS.items() if not p.stored_only)
KV_DTYPES = tuple(KV_PRECISIONS)
DEFAULT_DTYPE = "bf16"
DEFAULT_KV_DTYPE = "bf16"
# Embeddings, the LM head and norms stay bf16 under every precision here.
UNQUANTIZED_BYTES = 2
