"""The LoRA side of a GPU engine: TensorRT-LLM's module names for the adapters' layers, and the size of the
runtime's LoRA cache (PEFT cache) in the memory plan.

Facts (tests/data/upstream/trtllm_tools.json `hf_lora_convert.py` and `peft_cache`, with sources):
- examples/hf_lora_convert.py maps Hugging Face module names to TensorRT-LLM's: q_proj attn_q, k_proj
  attn_k, v_proj attn_v, o_proj attn_dense, gate_proj mlp_h_to_4h, up_proj mlp_gate, down_proj mlp_4h_to_h
  (gate_proj -> mlp_h_to_4h and up_proj -> mlp_gate: TensorRT-LLM's GatedMLP names, not the reverse);
- trtllm-build adds the missing ones of attn_q / attn_k / attn_v when any of them is targeted;
- the runtime's cache (cpp/tensorrt_llm/batch_manager/peftCacheManager.cpp, getPageManagerConfig) stores
  each module of each layer as `rank` slots of `ceil((in + out) / page width)` pages' width, the page
  width being the smallest module's in + out (per GPU: TP shards), in the engine's dtype; with
  lora_cache_optimal_adapter_size = lora_cache_max_adapter_size = the maximum rank, one page holds
  exactly one adapter of the maximum rank over every module and layer, so the cache holds as many
  such adapters as it has pages. Both caches must hold one, or the engine fails to load ("Not enough
  space allocated to host/device LoRA cache to hold 1 max sized LoRA").
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from toolkit.model.facts import ModelFacts

HF_TO_TRTLLM = {
    "q_proj": "attn_q",
    "k_proj": "attn_k",
    "v_proj": "attn_v",
    "o_proj": "attn_dense",
    "gate_proj": "mlp_h_to_4h",
    "up_proj": "mlp_gate",
    "down_proj": "mlp_4h_to_h",
}
_QKV = ("attn_q", "attn_k", "attn_v")
# The LoRA plugin's and the adapters' dtype: the engine's activations (the converters run --dtype bfloat16;
# hf_lora_convert.py's --storage-type must equal it).
LORA_DTYPE = "bfloat16"
LORA_DTYPE_BYTES = 2
LORA_TENSOR_TYPE = "BF16"  # the same, as Triton names it (the lora_weights input's data type)
# Host cache room beyond the built adapters: one more adapter of the maximum rank, sent at run time.
RUNTIME_ADAPTERS = 1
# The device cache is a fraction of the GPU memory free when the runtime creates it (after weights and
# its buffers, before the KV pool); ask for this much more than the plan's bytes, as the runtime's free
# memory is not exactly the plan's.
DEVICE_MARGIN = 1.1


@dataclass(frozen=True)
class LoraEngine:
    """What the engine is built for and what its LoRA cache holds."""

    target_modules: tuple[str, ...]  # TensorRT-LLM names (--lora_target_modules), in their order
    max_rank: int  # --max_lora_rank: the largest rank a request may use
    cache_adapters: int  # adapters of max_rank the GPU cache holds at once

    def to_dict(self) -> dict:
        return {**asdict(self), "target_modules": list(self.target_modules)}


def trtllm_modules(hf_modules: set[str] | tuple[str, ...]) -> tuple[str, ...]:
    """TensorRT-LLM's names for these Hugging Face modules, q/k/v completed as trtllm-build completes them,
    in HF_TO_TRTLLM's order."""
    names = {HF_TO_TRTLLM[m] for m in hf_modules}
    if names & set(_QKV):
        names |= set(_QKV)
    return tuple(n for n in HF_TO_TRTLLM.values() if n in names)


def module_widths(facts: ModelFacts, tp: int) -> dict[str, int]:
    """Per TensorRT-LLM module: in + out features on one GPU (column-parallel layers split their output
    over the TP ranks, row-parallel ones their input; KV heads fewer than the ranks are replicated)."""
    hidden, inner = facts.hidden_size, facts.intermediate_size
    q = facts.num_attention_heads * facts.head_dim // tp
    kv = max(1, facts.num_kv_heads // tp) * facts.head_dim
    return {
        "attn_q": hidden + q,
        "attn_k": hidden + kv,
        "attn_v": hidden + kv,
        "attn_dense": q + hidden,
        "mlp_h_to_4h": hidden + inner // tp,
        "mlp_gate": hidden + inner // tp,
        "mlp_4h_to_h": inner // tp + hidden,
    }


def adapter_page_bytes(facts: ModelFacts, lora: LoraEngine, tp: int, pp: int) -> int:
    """Bytes per GPU of one cache page: one adapter of the maximum rank over every module of the busiest
    pipeline stage's layers."""
    widths = [module_widths(facts, tp)[m] for m in lora.target_modules]
    page_width = min(widths)
    layers = math.ceil(facts.num_layers / pp)
    slots = sum(lora.max_rank * math.ceil(w / page_width) for w in widths) * layers
    return slots * page_width * LORA_DTYPE_BYTES


@dataclass(frozen=True)
class LoraCachePlan:
    """The runtime's LoRA cache, per GPU (the tensorrt_llm config's lora_cache_* parameters)."""

    adapter_bytes: int  # one adapter of the maximum rank (a cache page)
    device_bytes: int  # the GPU cache: cache_adapters pages
    host_bytes: int  # the host cache: the GPU cache's adapters plus RUNTIME_ADAPTERS
    max_rank: int

    @property
    def host_adapters(self) -> int:
        return self.host_bytes // self.adapter_bytes

    def gpu_memory_fraction(self, free_bytes: int) -> float:
        """lora_cache_gpu_memory_fraction: the device cache's share of the memory free when it is made."""
        if free_bytes <= 0:
            return 1.0
        return min(1.0, math.ceil(self.device_bytes * DEVICE_MARGIN / free_bytes * 1e4) / 1e4)


def plan_lora_cache(facts: ModelFacts, lora: LoraEngine, tp: int, pp: int) -> LoraCachePlan:
    page = adapter_page_bytes(facts, lora, tp, pp)
    return LoraCachePlan(
        adapter_bytes=page,
        device_bytes=page * lora.cache_adapters,
        host_bytes=page * (lora.cache_adapters + RUNTIME_ADAPTERS),
        max_rank=lora.max_rank,
    )
