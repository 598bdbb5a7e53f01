"""Memory and roofline planner: weights, KV cache pool, batch limits and speed-of-light bounds.

All byte counts are per the whole model unless the name says `_per_gpu`. A GPU holds its pipeline
stage's layers (their linear layers as a tensor-parallel shard); the first stage also holds a full copy
of the embedding table, the last the final norm and a tensor-parallel shard of the LM head (TensorRT-LLM
builds them only on those stages). Per-GPU numbers are those of the busiest stage.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from toolkit.errors import PlanError
from toolkit.model.architectures import ParameterSplit
from toolkit.model.facts import ModelFacts
from toolkit.plan.families import plan_notes, unread_expert_bytes
from toolkit.plan.gpus import GB, MIB, GpuProfile
from toolkit.plan.lora import DEVICE_MARGIN, LoraCachePlan, LoraEngine, plan_lora_cache
from toolkit.plan.precisions import (
    KV_DTYPES,
    KV_PRECISIONS,
    UNQUANTIZED_BYTES,
    WEIGHT_DTYPES,
    WEIGHT_PRECISIONS,
)

TP_CHOICES = (1, 2, 4, 8)

# What the runtime needs besides weights and KV cache: CUDA context, cuBLAS/NCCL workspaces and
# the activation buffers sized by max_num_tokens. A fixed share of the card keeps it simple and safe.
ACTIVATION_RESERVE_FRACTION = 0.10
# The share of the memory left after weights and activations that the runtime gives to the KV
# pool (the tensorrtllm backend's kv_cache_free_gpu_mem_fraction; its own default is 0.9).
KV_CACHE_FREE_GPU_MEM_FRACTION = 0.9
# What the runtime itself holds on each GPU before it sizes its KV pool (the pool is its fraction of what
# is then free): CUDA context, cuBLAS / TensorRT workspaces and runtime buffers, and NCCL's for TP > 1.
# AIConfigurator 0.12.0's H100 SXM system spec (misc.other_mem, misc.nccl_mem by TP; recorded in
# tests/data/reference/aiconfigurator_h100_sxm.json, source.system_spec).
RUNTIME_OTHER_BYTES = 3584 * MIB
RUNTIME_NCCL_BYTES = {1: 0, 2: 358_612_992, 4: 411_041_792, 8: 411_041_792}
# Logits of the last token of every sequence in a step, fp32 (the engine's logits_dtype default).
LOGITS_BYTES = 4
# The runtime's generation-logits buffer with --gather_generation_logits (TensorRT-LLM runtimeBuffers.cpp):
# a cache of [GENERATION_LOGITS_CACHE_STEPS, max_batch_size x beam, vocab_padded] plus one of
# [beam, GENERATION_LOGITS_CACHE_STEPS, vocab_padded], in the logits dtype.
GENERATION_LOGITS_CACHE_STEPS = 8
TOKENS_PER_BLOCK = 64  # paged KV block size passed to trtllm-build (--tokens_per_block)
DEFAULT_MAX_SEQ_LEN = 8192
# Reasoning models (a <think> part before the answer): DeepSeek-R1's model card sets "the maximum generation
# length" of its evaluations to 32,768 tokens; plus room for a 4096-token prompt.
REASONING_MAX_SEQ_LEN = 32768 + 4096
# The typical request the batch limits are sized for, as trtllm-bench's --target_input_len /
# --target_output_len: the KV pool is shared by requests of this size, not of max_seq_len.
DEFAULT_TARGET_INPUT_LEN = 1024
DEFAULT_TARGET_OUTPUT_LEN = 512
# trtllm-bench's engine-build heuristic (tensorrt_llm/bench/build/tuning.py, finetune_setting):
# requests the pool holds, capped at 4096 per pipeline stage; step tokens capped at 32768.
BATCH_CAP = 4096
NUM_TOKENS_CAP = 32768
BENCH_RULE = "trtllm-bench (tensorrt_llm/bench/build/tuning.py finetune_setting)"
# trtllm-bench rounds its batch up past what the pool holds, for its runtime's batch tuner to trim; the
# pinned backend has none (it builds its scheduler from the policy alone and runs the engine's
# max_batch_size: tests/data/upstream/triton_backend.json, executor_config), so the batch is what the
# runtime's pool holds.
BATCH_RULE = "requests the runtime's KV pool holds"


@dataclass(frozen=True)
class MemoryPlan:
    model: str
    gpu: str
    dtype: str
    kv_dtype: str
    tp_size: int
    pp_size: int
    world_size: int
    parameter_count: int
    weights_bytes: int
    weights_bytes_per_gpu: int
    kv_bytes_per_token: int
    kv_bytes_per_token_per_gpu: int
    gpu_memory_bytes: int
    activation_reserve_bytes: int
    kv_pool_bytes: int  # per GPU; negative when the weights alone do not fit
    kv_cache_tokens: int
    tokens_per_block: int
    max_seq_len: int
    max_input_len: int
    max_sequences_at_max_seq_len: int
    target_input_len: int  # the typical request the batch limits are sized for
    target_output_len: int
    max_batch_size: int
    max_num_tokens: int
    batch_limits_from: str  # where max_batch_size / max_num_tokens come from
    kv_tokens_per_request_at_max_batch: int  # what each of max_batch_size running requests can hold
    kv_cache_free_gpu_mem_fraction: float
    decode_step_ms_lower_bound: float  # batch 1: the weights read once per step
    decode_tokens_per_s_per_stream_ceiling: float
    decode_step_ms_at_max_batch: (
        float  # weights + every running request's KV (at its mean context) per step
    )
    decode_tokens_per_s_ceiling: (
        float  # all streams together, at max_batch_size (or as many as the pool holds)
    )
    prefill_tokens_per_s_upper_bound: float
    prefill_ms_lower_bound: float  # one max_num_tokens chunk
    fits: bool
    min_tp_that_fits: int | None = None
    architecture: str = ""  # config.json's, e.g. Qwen2ForCausalLM: picks the checkpoint converter
    # What the runtime will take: kv_cache_free_gpu_mem_fraction of the memory the engine leaves free
    # (weights and the runtime's own reserve out), per GPU. The engine is built with no token cap, so
    # this is the pool it serves with; kv_cache_tokens above is the planner's own, more cautious one.
    runtime_reserve_bytes: int = 0
    runtime_kv_cache_tokens: int = 0
    active_parameter_count: int = 0  # read per token: MoE's routed experts only (dense: all)
    num_experts: int = 0  # MoE: experts per layer, all resident in memory
    experts_per_token: int = 0  # MoE: experts routed per token
    # Per layer, the tokens it attends to (the tensorrtllm backend's max_attention_window_size); (): all.
    max_attention_window_size: tuple[int, ...] = ()
    # A pre-quantized checkpoint's format ("ModelOpt FP8") and its weights per scale (GPTQ / AWQ groups).
    stored_quantization: str | None = None
    stored_group_size: int | None = None
    notes: tuple[str, ...] = ()  # what the numbers assume, in words
    # Per GPU: the runtime's buffer of gathered generation logits (--gather_generation_logits), 0 without it.
    generation_logits_bytes: int = 0
    # LoRA (toolkit.plan.lora), 0 without adapters: the GPU cache per GPU (out of the KV pool), the host
    # cache, one adapter of the maximum rank, how many the GPU cache holds, that rank, and the GPU cache's
    # share of the free memory (the backend's lora_cache_gpu_memory_fraction).
    lora_cache_bytes: int = 0
    lora_host_cache_bytes: int = 0
    lora_adapter_bytes: int = 0
    lora_cache_adapters: int = 0
    lora_max_rank: int = 0
    lora_cache_gpu_memory_fraction: float = 0.0

    def to_dict(self) -> dict:
        return asdict(self)


def _split(facts: ModelFacts) -> ParameterSplit:
    return facts.family.split(facts)


def weights_bytes(facts: ModelFacts, dtype: str) -> int:
    """Bytes of all weights of the model in `dtype` (the LM head counted once when tied)."""
    s = _split(facts)
    lm_head = 0 if facts.tie_word_embeddings else s.lm_head
    other = s.layer_norms + s.embedding + lm_head + s.final_norm
    return int(s.linear * WEIGHT_PRECISIONS[dtype].linear_bytes + other * UNQUANTIZED_BYTES)


def weights_read_per_step(facts: ModelFacts, dtype: str, tp: int, pp: int, batch: int) -> int:
    """Weight bytes one decode step of `batch` tokens reads on the busiest GPU: all of them for a dense
    model; for MoE, only the experts its tokens are routed to besides everything else."""
    layers = stage_layers(facts.num_layers, pp)[0]
    unread = unread_expert_bytes(facts, WEIGHT_PRECISIONS[dtype].linear_bytes, tp, layers, batch)
    return int(weights_bytes_per_gpu(facts, dtype, tp, pp) - unread)


def stage_layers(num_layers: int, pp: int) -> list[int]:
    """Layers per pipeline stage, first stage first: the first `num_layers % pp` stages take one more
    (TensorRT-LLM's Mapping.pp_layers splits the layer list as torch.tensor_split does)."""
    base, extra = divmod(num_layers, pp)
    return [base + (1 if stage < extra else 0) for stage in range(pp)]


def weights_bytes_per_gpu(facts: ModelFacts, dtype: str, tp: int, pp: int) -> int:
    """Bytes on the busiest GPU: its stage's layers (linear layers TP-sharded, norms whole), plus the whole
    embedding on the first stage and the final norm and an LM-head shard on the last."""
    s = _split(facts)
    linear_per_layer = s.linear // facts.num_layers  # parameters; every layer has the same shapes
    norms_per_layer = s.layer_norms // facts.num_layers
    stages = [
        layers * linear_per_layer * WEIGHT_PRECISIONS[dtype].linear_bytes / tp
        + layers * norms_per_layer * UNQUANTIZED_BYTES
        for layers in stage_layers(facts.num_layers, pp)
    ]
    stages[0] += s.embedding * UNQUANTIZED_BYTES
    stages[-1] += (s.lm_head / tp + s.final_norm) * UNQUANTIZED_BYTES
    return int(max(stages))


def kv_bytes_per_token(facts: ModelFacts, kv_dtype: str) -> int:
    """K and V of every layer for one token (the model family's arithmetic)."""
    return facts.family.kv_bytes_per_token(facts, KV_PRECISIONS[kv_dtype].bytes)


def kv_heads_per_gpu(facts: ModelFacts, tp: int) -> int:
    if facts.num_kv_heads % tp == 0:
        return facts.num_kv_heads // tp
    return (
        1  # tp is a multiple of the KV heads (checked in _check_parallelism): heads are replicated
    )


def kv_bytes_per_token_per_gpu(facts: ModelFacts, kv_dtype: str, tp: int, pp: int) -> int:
    layers = stage_layers(facts.num_layers, pp)[0]  # the first stage has the most
    return facts.family.kv_bytes_per_token(
        facts, KV_PRECISIONS[kv_dtype].bytes, layers=layers, kv_heads=kv_heads_per_gpu(facts, tp)
    )


def compute_plan(
    facts: ModelFacts,
    gpu: GpuProfile,
    *,
    model: str = "model",
    dtype: str = "bf16",
    kv_dtype: str = "bf16",
    tp: int = 1,
    pp: int = 1,
    max_seq_len: int | None = None,
    max_input_len: int | None = None,
    max_batch_size: int | None = None,
    max_num_tokens: int | None = None,
    target_input_len: int | None = None,
    target_output_len: int | None = None,
    kv_cache_free_gpu_mem_fraction: float | None = None,
    gather_generation_logits: bool = False,
    lora: LoraEngine | None = None,
) -> MemoryPlan:
    """Every number of the plan, whether it fits or not (see plan_memory for the checked version)."""
    _check_choices(gpu, dtype, kv_dtype)
    _check_parallelism(facts, tp, pp)
    seq = _max_seq_len(facts, max_seq_len)
    isl = min(target_input_len or DEFAULT_TARGET_INPUT_LEN, seq - 1)
    osl = min(target_output_len or DEFAULT_TARGET_OUTPUT_LEN, seq - isl)
    w_gpu = weights_bytes_per_gpu(facts, dtype, tp, pp)
    reserve = int(gpu.memory_bytes * ACTIVATION_RESERVE_FRACTION)
    pool = gpu.memory_bytes - w_gpu - reserve
    kv_gpu = kv_bytes_per_token_per_gpu(facts, kv_dtype, tp, pp)
    tokens = max(0, pool) // kv_gpu // TOKENS_PER_BLOCK * TOKENS_PER_BLOCK
    # trtllm-bench's rule on the planned pool bounds the batch and step from above: it sizes the
    # runtime's reserve (activations, logits), then the batch is what the runtime's pool holds.
    bench_batch, bench_tokens = batch_limits(tokens, isl, osl, pp)
    # The generation-logits buffer, sized for the batch that bounds the final one (never smaller), comes
    # out of both pools.
    gathered = (
        generation_logits_bytes(facts, max_batch_size or bench_batch, tp)
        if gather_generation_logits
        else 0
    )
    # The LoRA cache on the GPU (toolkit.plan.lora) comes out of both pools too, made before the KV pool.
    cache = plan_lora_cache(facts, lora, tp, pp) if lora is not None else None
    lora_device = int(cache.device_bytes * DEVICE_MARGIN) if cache else 0
    if gathered or lora_device:
        pool -= gathered + lora_device
        tokens = max(0, pool) // kv_gpu // TOKENS_PER_BLOCK * TOKENS_PER_BLOCK
    sequences = tokens // seq
    fraction = kv_cache_free_gpu_mem_fraction or KV_CACHE_FREE_GPU_MEM_FRACTION
    runtime_reserve = gathered + runtime_reserve_bytes(
        facts, tp, max_num_tokens or bench_tokens, max_batch_size or bench_batch
    )
    free_for_caches = gpu.memory_bytes - w_gpu - runtime_reserve
    runtime_tokens = runtime_kv_cache_tokens(free_for_caches - lora_device, fraction, kv_gpu)
    batch = max_batch_size or held_batch(runtime_tokens, isl, osl, pp)
    num_tokens = max_num_tokens or step_tokens(batch, isl, osl)
    given = [
        name
        for name, value in (("max_batch_size", max_batch_size), ("max_num_tokens", max_num_tokens))
        if value
    ]
    rule = f"{BATCH_RULE} at {isl} in / {osl} out tokens; max_num_tokens: its prefill share ({BENCH_RULE})"
    source = (
        rule
        if not given
        else f"{' and '.join(given)} given; " + ("the rest: " + rule if len(given) < 2 else "")
    )
    step_ms = weights_read_per_step(facts, dtype, tp, pp, 1) / gpu.bandwidth_bytes_per_s * 1e3
    running = max(1, min(batch, runtime_tokens // (isl + osl))) if runtime_tokens else 1
    batch_weights = weights_read_per_step(facts, dtype, tp, pp, running)
    batch_step_ms = (
        (batch_weights + running * (isl + osl // 2) * kv_gpu) / gpu.bandwidth_bytes_per_s * 1e3
    )
    prefill_tps = _prefill_tokens_per_s(facts, gpu, dtype, tp)
    return MemoryPlan(
        model=model,
        gpu=gpu.name,
        dtype=dtype,
        kv_dtype=kv_dtype,
        tp_size=tp,
        pp_size=pp,
        world_size=tp * pp,
        parameter_count=facts.parameter_count,
        weights_bytes=weights_bytes(facts, dtype),
        weights_bytes_per_gpu=w_gpu,
        kv_bytes_per_token=kv_bytes_per_token(facts, kv_dtype),
        kv_bytes_per_token_per_gpu=kv_gpu,
        gpu_memory_bytes=gpu.memory_bytes,
        activation_reserve_bytes=reserve,
        kv_pool_bytes=pool,
        kv_cache_tokens=tokens,
        tokens_per_block=TOKENS_PER_BLOCK,
        max_seq_len=seq,
        max_input_len=max_input_len or seq - 1,
        max_sequences_at_max_seq_len=sequences,
        target_input_len=isl,
        target_output_len=osl,
        max_batch_size=batch,
        max_num_tokens=num_tokens,
        batch_limits_from=source.rstrip("; "),
        kv_tokens_per_request_at_max_batch=runtime_tokens // batch,
        kv_cache_free_gpu_mem_fraction=fraction,
        decode_step_ms_lower_bound=step_ms,
        decode_tokens_per_s_per_stream_ceiling=1e3 / step_ms,
        decode_step_ms_at_max_batch=batch_step_ms,
        decode_tokens_per_s_ceiling=running * 1e3 / batch_step_ms,
        prefill_tokens_per_s_upper_bound=prefill_tps,
        prefill_ms_lower_bound=num_tokens / prefill_tps * 1e3,
        fits=sequences >= 1,
        architecture=facts.architecture,
        runtime_reserve_bytes=runtime_reserve,
        runtime_kv_cache_tokens=runtime_tokens,
        active_parameter_count=facts.active_parameter_count,
        num_experts=facts.num_experts,
        experts_per_token=facts.experts_per_token,
        max_attention_window_size=facts.family.attention_windows(facts, seq),
        stored_quantization=facts.quantization.description if facts.quantization else None,
        stored_group_size=facts.quantization.group_size if facts.quantization else None,
        notes=plan_notes(facts, seq, running),
        generation_logits_bytes=generation_logits_bytes(facts, batch, tp) if gathered else 0,
        **_lora_fields(cache, lora, free_for_caches),
    )


def _lora_fields(cache: LoraCachePlan | None, lora: LoraEngine | None, free: int) -> dict:
    if cache is None or lora is None:
        return {}
    return {
        "lora_cache_bytes": cache.device_bytes,
        "lora_host_cache_bytes": cache.host_bytes,
        "lora_adapter_bytes": cache.adapter_bytes,
        "lora_cache_adapters": lora.cache_adapters,
        "lora_max_rank": lora.max_rank,
        "lora_cache_gpu_memory_fraction": cache.gpu_memory_fraction(free),
    }


def generation_logits_bytes(facts: ModelFacts, max_batch_size: int, tp: int) -> int:
    """Bytes per GPU of the runtime's generation-logits buffer for `max_batch_size` requests (beam 1), the
    vocabulary padded to a multiple of the TP size as TensorRT-LLM pads it."""
    vocab_padded = math.ceil(facts.vocab_size / tp) * tp
    rows = GENERATION_LOGITS_CACHE_STEPS * (max_batch_size + 1)
    return rows * vocab_padded * LOGITS_BYTES


def runtime_reserve_bytes(
    facts: ModelFacts, tp: int, max_num_tokens: int, max_batch_size: int
) -> int:
    """What the runtime holds on a GPU besides weights and KV cache: its fixed share (RUNTIME_OTHER_BYTES,
    NCCL's), the activations TensorRT sizes at build time for max_num_tokens (per token: the hidden
    states in and out of a layer and the gate/up output, bf16; TensorRT-LLM docs, reference/memory.md),
    and the fp32 logits of max_batch_size sequences (a TP shard of the vocabulary)."""
    per_token = UNQUANTIZED_BYTES * (2 * facts.hidden_size + 2 * facts.intermediate_size / tp)
    logits = max_batch_size * facts.vocab_size / tp * LOGITS_BYTES
    nccl = RUNTIME_NCCL_BYTES.get(tp, RUNTIME_NCCL_BYTES[8])
    return int(RUNTIME_OTHER_BYTES + nccl + max_num_tokens * per_token + logits)


def runtime_kv_cache_tokens(free_bytes: int, fraction: float, kv_bytes_per_token: int) -> int:
    """Tokens of the pool the runtime allocates: its fraction of the free memory, in whole blocks."""
    pool = max(0, int(fraction * free_bytes))
    return pool // kv_bytes_per_token // TOKENS_PER_BLOCK * TOKENS_PER_BLOCK


def held_batch(runtime_tokens: int, isl: int, osl: int, pp: int = 1) -> int:
    """Requests of `isl` + `osl` tokens the runtime's pool holds, per pipeline stage (capped as
    trtllm-bench caps them), never rounded up: no runtime tuner trims it to what fits."""
    return max(1, int(min(runtime_tokens / (isl + osl), BATCH_CAP) / pp))


def step_tokens(batch: int, isl: int, osl: int) -> int:
    """max_num_tokens for `batch` requests: their prefill share per step, rounded up as trtllm-bench
    rounds it (at least 2048)."""
    return _round_tokens(min(batch * (1 + isl / osl), NUM_TOKENS_CAP))


def _round_tokens(raw_tokens: float) -> int:
    if raw_tokens < 4096:
        return max(2048, 256 * math.ceil(raw_tokens / 256))
    if raw_tokens < 8192:
        return 512 * math.ceil(raw_tokens / 512)
    return 1024 * math.ceil(raw_tokens / 1024)


def batch_limits(kv_tokens: int, isl: int, osl: int, pp: int = 1) -> tuple[int, int]:
    """max_batch_size and max_num_tokens as trtllm-bench sizes an engine for `isl` in / `osl` out tokens:
    as many requests as the KV pool holds (capped), rounded up to its steps; step tokens for their prefill.
    Its runtime then tunes the batch down to what fits; the plan uses this rule only as the upper bound
    that sizes the runtime's reserve (held_batch is the batch it builds)."""
    raw_batch = min(kv_tokens / (isl + osl), BATCH_CAP) / pp
    raw_tokens = min(raw_batch * (1 + isl / osl), NUM_TOKENS_CAP)
    if raw_batch < 256:
        batch = max(64, 32 * math.ceil(raw_batch / 32))
    elif raw_batch < 1024:
        batch = 128 * math.ceil(raw_batch / 128)
    else:
        batch = 256 * math.ceil(raw_batch / 256)
    return batch, _round_tokens(raw_tokens)


def plan_memory(facts: ModelFacts, gpu: GpuProfile, **options) -> MemoryPlan:
    """The plan for these options; `tp=None` (or absent) takes the smallest TP that fits. PlanError if it cannot fit."""
    options = {k: v for k, v in options.items() if v is not None or k != "tp"}
    smallest = _smallest_tp(facts, gpu, options)
    options.setdefault("tp", smallest or 1)
    plan = compute_plan(facts, gpu, **options)
    plan = MemoryPlan(**{**plan.to_dict(), "min_tp_that_fits": smallest})
    if not plan.fits:
        raise PlanError(_refusal(plan), hint=_options_hint(facts, gpu, options))
    return plan


def fitting_options(facts: ModelFacts, gpu: GpuProfile, options: dict) -> list[MemoryPlan]:
    """For each weight dtype this GPU runs, the plan with the smallest TP that fits."""
    found = []
    for dtype, precision in WEIGHT_PRECISIONS.items():
        if precision.stored_only or (precision.needs_fp8_hardware and not gpu.supports_fp8):
            continue
        tp = _smallest_tp(facts, gpu, {**options, "dtype": dtype})
        if tp is not None:
            found.append(compute_plan(facts, gpu, **{**options, "dtype": dtype, "tp": tp}))
    return found


def _smallest_tp(facts: ModelFacts, gpu: GpuProfile, options: dict) -> int | None:
    for tp in TP_CHOICES:
        try:
            if compute_plan(facts, gpu, **{**options, "tp": tp}).fits:
                return tp
        except PlanError:
            continue  # this TP does not divide the heads
    return None


def _prefill_tokens_per_s(facts: ModelFacts, gpu: GpuProfile, dtype: str, tp: int) -> float:
    """Compute bound: 2 FLOPs per matmul weight per token (attention score FLOPs left out)."""
    s = _split(facts)
    flops_per_token = 2 * (s.routed_linear + s.lm_head)  # MoE: a token runs its routed experts only
    tflops = gpu.fp8_tflops if dtype == "fp8" and gpu.fp8_tflops else gpu.bf16_tflops
    return tflops * 1e12 * tp / flops_per_token


def _max_seq_len(facts: ModelFacts, requested: int | None) -> int:
    """The default fits the model: 8192, a reasoning model's long answers, never more than it or its engine
    flow takes (Gemma 2: 4096)."""
    family_cap = facts.family.max_seq_len or facts.max_position_embeddings
    limit = min(facts.max_position_embeddings, family_cap)
    if requested is None:
        default = REASONING_MAX_SEQ_LEN if facts.reasoning_parser else DEFAULT_MAX_SEQ_LEN
        return min(limit, default)
    if requested < 2 or requested > limit:
        why = (
            facts.family.max_seq_len_source
            if limit < facts.max_position_embeddings
            else "the model's max_position_embeddings"
        )
        raise PlanError(
            f"--max-seq-len {requested} is outside 2..{limit} ({why})",
            hint=f"pass --max-seq-len between 2 and {limit}",
            value=requested,
        )
    return requested


def _check_choices(gpu: GpuProfile, dtype: str, kv_dtype: str) -> None:
    if dtype not in WEIGHT_PRECISIONS:
        raise PlanError(
            f"unknown --dtype {dtype!r}", hint=f"use one of: {', '.join(WEIGHT_DTYPES)}"
        )
    if WEIGHT_PRECISIONS[dtype].needs_fp4_hardware:
        raise PlanError(
            f"{gpu.name} (SM {gpu.sm}) has no FP4 tensor cores; {dtype} weights need Blackwell (SM 10.0)",
            hint="use the checkpoint's bf16 original with --dtype fp8, or a Blackwell GPU",
            value=dtype,
        )
    if kv_dtype not in KV_DTYPES:
        raise PlanError(
            f"unknown --kv-dtype {kv_dtype!r}", hint=f"use one of: {', '.join(KV_DTYPES)}"
        )
    fp8 = WEIGHT_PRECISIONS[dtype].needs_fp8_hardware or KV_PRECISIONS[kv_dtype].needs_fp8_hardware
    if fp8 and not gpu.supports_fp8:
        raise PlanError(
            f"{gpu.name} (SM {gpu.sm}) has no FP8 tensor cores; fp8 needs SM 8.9 or newer",
            hint="use --dtype bf16 or int4-awq and --kv-dtype bf16, or a Hopper/Ada GPU",
        )


def _check_parallelism(facts: ModelFacts, tp: int, pp: int) -> None:
    if tp < 1 or pp < 1:
        raise PlanError(
            f"--tp {tp} / --pp {pp}: both must be at least 1", hint="use --tp 1, 2, 4 or 8"
        )
    kv = facts.num_kv_heads
    if facts.num_attention_heads % tp or (kv % tp and tp % kv):
        raise PlanError(
            f"--tp {tp} does not divide the model's {facts.num_attention_heads} attention heads / {kv} KV heads",
            hint="pick a TP size that divides the attention heads",
        )
    if pp > facts.num_layers:
        raise PlanError(
            f"--pp {pp} is more than the model's {facts.num_layers} layers",
            hint="use a smaller --pp",
        )


def _refusal(plan: MemoryPlan) -> str:
    need = plan.kv_bytes_per_token_per_gpu * plan.max_seq_len
    return (
        f"{plan.model} in {plan.dtype} does not fit on {plan.gpu} with TP={plan.tp_size}: "
        f"{_gb(plan.weights_bytes_per_gpu)} of weights per GPU + "
        f"{_gb(plan.activation_reserve_bytes)} activation reserve "
        f"of {_gb(plan.gpu_memory_bytes)} leaves {_gb(plan.kv_pool_bytes)} for the KV cache, "
        f"and one {plan.max_seq_len}-token sequence needs {_gb(need)} "
        f"({plan.kv_bytes_per_token_per_gpu} bytes/token per GPU)"
    )


def _options_hint(facts: ModelFacts, gpu: GpuProfile, options: dict) -> str:
    found = fitting_options(facts, gpu, options)
    if not found:
        return (
            f"nothing up to TP={TP_CHOICES[-1]} fits on {gpu.name}: "
            "use a larger GPU (--gpu h200) or a shorter --max-seq-len"
        )
    parts = [
        f"--dtype {p.dtype} --tp {p.tp_size} "
        f"({_gb(p.weights_bytes_per_gpu)} weights/GPU, {p.kv_cache_tokens} KV tokens)"
        for p in found
    ]
    return "options that fit: " + "; ".join(parts)


def _gb(n: int) -> str:
    return f"{n / GB:.2f} GB"
