"""Performance estimates of a planned TensorRT-LLM engine: time to first token, time per output token
and output tokens/s of the whole engine, at a concurrency and request shape.

The memory plan's bounds (weights / datasheet bandwidth, peak TFLOPS) say how fast an engine can never
be; these say how fast it will be, to within the tolerance tests/test_estimate.py holds them to against
NVIDIA's own performance model (AIConfigurator, measured H100 kernel tables). The model, per GPU of the
busiest pipeline stage:

- one engine step runs M tokens through every layer: D decoding sequences (one token each) and the
  prompt tokens of the requests that start in it. Its time is the sum of
    linear layers   per layer max(weight bytes / achievable bandwidth,
                                  2 x parameters x M / (achievable share x tensor peak))
                    + a fixed cost per GEMM (small GEMMs never reach the bandwidth)
    LM head         the same, for the sequences that produce a token (bf16 under every precision)
    attention       a fixed cost per layer and phase + the KV cache the decoding sequences read
                    at an achievable bandwidth + the prompts' attention FLOPs
    other kernels   norms, activation and residual adds: a fixed cost each + their bytes
    all-reduce      TP > 1: two per layer and one after the embedding, each the faster of a one-shot
                    (every rank reads every other rank's buffer) and a two-shot (reduce-scatter +
                    all-gather) exchange over the GPUs' interconnect
- in-flight batching at concurrency B, closed loop (a request starts when one ends): each request runs
  its prefill in one step and decodes output_len - 1 more, so B prompts enter every output_len steps.
  While B <= output_len, B steps of a cycle carry one prompt each and the rest only decode; beyond it
  every step carries B / output_len prompts, and when they do not fit in max_num_tokens the cycle
  stretches (prefill bound) and requests queue for their first token.
- time per output token is the mean step; output tokens/s counts every token of every request over a
  cycle, prefill steps included; time to first token is the step in flight when the request arrives,
  then its own (mixed) step, then any queue.

Pipeline parallelism: each of the pp stages runs a micro-batch of B / pp requests; a token passes all of
them (no reference data: unvalidated). The constants (KernelCosts) were fitted on H100 SXM; other GPUs
take their datasheet bandwidth, TFLOPS and interconnect with the same efficiencies.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

from toolkit.model.facts import ModelFacts
from toolkit.plan.gpus import GpuProfile
from toolkit.plan.memory import MemoryPlan, kv_heads_per_gpu, stage_layers
from toolkit.plan.precisions import KV_PRECISIONS, UNQUANTIZED_BYTES, WEIGHT_PRECISIONS

US = 1e-6
# GEMMs of a layer with the fused gate/up MLP the toolkit builds: qkv, attention output, gate+up, down.
GEMMS_PER_LAYER = 4
# Kernels besides GEMMs and attention per layer: two fused residual-add + RMS norms and the SwiGLU.
ELEMENTWISE_KERNELS_PER_LAYER = 3


@dataclass(frozen=True)
class KernelCosts:
    """What a step costs beyond the roofline. Fitted to AIConfigurator 0.12.0's H100 SXM kernel tables for
    TensorRT-LLM 1.3.0rc20 (tests/data/reference/aiconfigurator_h100_sxm.json, its per-kernel times) by
    perf/reference/fit_estimate_constants.py, which prints each fit beside the data it came from."""

    # Linear layers at decode batch sizes stream their weights at this share of the datasheet bandwidth
    # (70B GEMM times at TP 1, 2, 4, 8 against their bytes per GPU; the slope of the fit).
    weight_bandwidth: float = 0.84
    # The fixed part of each GEMM call, by tensor-core kind (the intercept of the same fit): FP8 GEMMs at
    # a handful of rows are latency bound (activation quantization, small tiles), bf16 ones much less.
    gemm_fixed_us: dict[str, float] = field(default_factory=lambda: {"bf16": 3.6, "fp8": 13.0})
    # Achievable share of the tensor-core peak of large GEMMs (prefill of >= 1k tokens).
    gemm_compute: dict[str, float] = field(default_factory=lambda: {"bf16": 0.76, "fp8": 0.56})
    # Decode attention: the KV cache streams at this share of the bandwidth (per sequence slope of the
    # decode step between batch 1 and 64), plus a fixed cost per layer by KV element bytes.
    kv_bandwidth: float = 0.89
    decode_attention_fixed_us: dict[int, float] = field(default_factory=lambda: {2: 15.0, 1: 9.0})
    # Prompt attention (FMHA): a fixed cost per layer, and its FLOPs (2 x layers x heads x head_dim x
    # prompt^2, causal) at this share of the bf16 tensor peak.
    prefill_attention_fixed_us: float = 35.0
    prefill_attention_compute: float = 0.40
    # Norms, activation, residual: a fixed cost per kernel, bytes at this share of the bandwidth
    # (AIConfigurator's own empirical formula for these kernels: 3 us + bytes / (0.8 x bandwidth)).
    elementwise_fixed_us: float = 3.0
    elementwise_bandwidth: float = 0.8
    # All-reduce: one-shot = fixed + (n - 1) x bytes / (share x link); two-shot = fixed + 2 (n - 1) / n x
    # bytes / (share x link); the faster one runs (TensorRT-LLM's custom all-reduce picks by size).
    one_shot_fixed_us: float = 2.7
    one_shot_fixed_us_per_doubling: float = 0.21
    one_shot_link: float = 0.72
    two_shot_fixed_us: float = 37.0
    two_shot_link: float = 0.80


HOPPER_TRTLLM = KernelCosts()


@dataclass(frozen=True)
class Workload:
    """What runs: `concurrency` requests in flight, each `input_len` prompt and `output_len` output tokens."""

    concurrency: int
    input_len: int
    output_len: int


@dataclass(frozen=True)
class EngineShape:
    """The per-GPU arithmetic of one step, for the busiest pipeline stage (TP-sharded linear layers)."""

    layers: int  # of the busiest stage
    linear_params: float  # per layer, per GPU (TP shard)
    linear_bytes_per_param: float
    tensor_cores: str  # "bf16" or "fp8": which peak the linear layers run at
    lm_head_params: float  # per GPU (TP shard), bf16
    hidden: int
    intermediate: float  # per GPU
    q_heads: int  # per GPU
    head_dim: int
    kv_bytes_per_token: float  # one layer, per GPU
    kv_element_bytes: int
    tp: int
    pp: int
    max_num_tokens: int
    # MoE: the experts' share of linear_params, and the share of experts a token is routed to (k / E).
    expert_params: float = 0.0
    routed_share: float = 1.0

    def linear_params_read(self, tokens: float) -> float:
        """Per layer, the parameters a step of `tokens` reads: every dense one, and the experts its tokens
        are routed to (uniform routing: E * (1 - (1 - k/E)^tokens) of E)."""
        touched = 1.0 - (1.0 - self.routed_share) ** max(1.0, tokens)
        return self.linear_params - self.expert_params * (1.0 - touched)

    @property
    def linear_params_per_token(self) -> float:
        """Per layer, the parameters one token's GEMMs multiply (MoE: its routed experts only)."""
        return self.linear_params - self.expert_params * (1.0 - self.routed_share)


@dataclass(frozen=True)
class Step:
    """One engine step: `decode` sequences generating a token, `prompts` requests prefilling
    `prompt_tokens` tokens in all, each decoding sequence reading `context` cached tokens."""

    decode: float
    prompts: float = 0.0
    prompt_tokens: float = 0.0
    context: float = 0.0

    @property
    def tokens(self) -> float:
        return self.decode + self.prompt_tokens


@dataclass(frozen=True)
class StepTime:
    """Seconds of one step by term (per GPU; every GPU of a stage runs the same)."""

    linear: float
    lm_head: float
    attention: float
    elementwise: float
    all_reduce: float
    compute_bound: bool  # the linear layers are limited by tensor throughput, not by bandwidth

    @property
    def total(self) -> float:
        return self.linear + self.lm_head + self.attention + self.elementwise + self.all_reduce

    def to_ms(self) -> dict:
        terms = ("linear", "lm_head", "attention", "elementwise", "all_reduce")
        return {name: getattr(self, name) * 1e3 for name in terms}


@dataclass(frozen=True)
class PerformanceEstimate:
    concurrency: int
    input_len: int
    output_len: int
    ttft_ms: float
    tpot_ms: float
    output_tokens_per_s: float  # the whole engine, all its GPUs
    output_tokens_per_s_per_gpu: float
    request_latency_ms: float
    decode_step_ms: float  # a step of `concurrency` decoding sequences, no prompt
    prefill_step_ms: float  # the step that carries one request's prompt (and the others' decode)
    limited_by: str  # what bounds the decode step: "weights", "kv cache", "compute" or "prefill"
    decode_step_terms_ms: dict
    model: str = "toolkit.plan.estimate (constants fitted on AIConfigurator 0.12.0, H100 SXM)"

    def to_dict(self) -> dict:
        return asdict(self)


def engine_shape(facts: ModelFacts, plan: MemoryPlan) -> EngineShape:
    """The per-GPU arithmetic of `plan`'s engine (its dtype, KV dtype, TP, PP and max_num_tokens)."""
    split = facts.family.split(facts)
    tp, pp = plan.tp_size, plan.pp_size
    precision = WEIGHT_PRECISIONS[plan.dtype]
    kv = KV_PRECISIONS[plan.kv_dtype]
    return EngineShape(
        layers=stage_layers(facts.num_layers, pp)[0],
        linear_params=split.linear / facts.num_layers / tp,
        linear_bytes_per_param=precision.linear_bytes,
        tensor_cores=precision.tensor_cores,
        lm_head_params=split.lm_head / tp,
        hidden=facts.hidden_size,
        intermediate=facts.intermediate_size / tp,
        q_heads=facts.num_attention_heads // tp,
        head_dim=facts.head_dim,
        kv_bytes_per_token=facts.family.kv_bytes_per_token(
            facts, kv.bytes, layers=1, kv_heads=kv_heads_per_gpu(facts, tp)
        ),
        kv_element_bytes=kv.bytes,
        tp=tp,
        pp=pp,
        max_num_tokens=plan.max_num_tokens,
        **_experts(facts, split, tp),
    )


def _experts(facts: ModelFacts, split, tp: int) -> dict:
    """A MoE model's expert parameters per layer and GPU, and the share a token is routed to."""
    experts, routed = facts.num_experts, facts.experts_per_token
    if not experts or routed >= experts:
        return {}
    # linear - routed_linear = layers x (E - k) experts: all experts are that x E / (E - k).
    all_experts = (split.linear - split.routed_linear) * experts / (experts - routed)
    return {"expert_params": all_experts / facts.num_layers / tp, "routed_share": routed / experts}


# --- one step --------------------------------------------------------------------------------------


def step_time(
    shape: EngineShape, gpu: GpuProfile, step: Step, costs: KernelCosts = HOPPER_TRTLLM
) -> StepTime:
    """Seconds of `step` on one GPU of the busiest stage."""
    linear, compute_bound = _linear_seconds(shape, gpu, step.tokens, costs)
    return StepTime(
        linear=linear,
        lm_head=_lm_head_seconds(shape, gpu, step.decode + step.prompts, costs),
        attention=_attention_seconds(shape, gpu, step, costs),
        elementwise=_elementwise_seconds(shape, gpu, step.tokens, costs),
        all_reduce=_all_reduce_seconds(shape, gpu, step.tokens, costs),
        compute_bound=compute_bound,
    )


def _peak_flops(gpu: GpuProfile, tensor_cores: str) -> float:
    tflops = gpu.fp8_tflops if tensor_cores == "fp8" and gpu.fp8_tflops else gpu.bf16_tflops
    return tflops * 1e12


def _linear_seconds(
    shape: EngineShape, gpu: GpuProfile, tokens: float, costs: KernelCosts
) -> tuple[float, bool]:
    """The layers' GEMMs: each streams its weights once per step, or is compute bound at many tokens."""
    memory = (
        shape.linear_params_read(tokens)
        * shape.linear_bytes_per_param
        / (costs.weight_bandwidth * gpu.bandwidth_bytes_per_s)
    )
    compute = (
        2
        * shape.linear_params_per_token
        * tokens
        / (costs.gemm_compute[shape.tensor_cores] * _peak_flops(gpu, shape.tensor_cores))
    )
    fixed = GEMMS_PER_LAYER * costs.gemm_fixed_us[shape.tensor_cores] * US
    return shape.layers * (max(memory, compute) + fixed), compute > memory


def _lm_head_seconds(
    shape: EngineShape, gpu: GpuProfile, sequences: float, costs: KernelCosts
) -> float:
    """Logits for the sequences that produce a token this step (only the last prompt token does)."""
    memory = (
        shape.lm_head_params
        * UNQUANTIZED_BYTES
        / (costs.weight_bandwidth * gpu.bandwidth_bytes_per_s)
    )
    compute = (
        2 * shape.lm_head_params * sequences / (costs.gemm_compute["bf16"] * gpu.bf16_tflops * 1e12)
    )
    return max(memory, compute) + costs.gemm_fixed_us["bf16"] * US


def _attention_seconds(
    shape: EngineShape, gpu: GpuProfile, step: Step, costs: KernelCosts
) -> float:
    per_layer = 0.0
    if step.decode:
        kv_read = step.decode * step.context * shape.kv_bytes_per_token
        per_layer += costs.decode_attention_fixed_us[shape.kv_element_bytes] * US + kv_read / (
            costs.kv_bandwidth * gpu.bandwidth_bytes_per_s
        )
    if step.prompts:
        prompt = step.prompt_tokens / step.prompts
        flops = 2 * shape.q_heads * shape.head_dim * prompt**2 * step.prompts
        per_layer += costs.prefill_attention_fixed_us * US + flops / (
            costs.prefill_attention_compute * gpu.bf16_tflops * 1e12
        )
    return shape.layers * per_layer


def _elementwise_seconds(
    shape: EngineShape, gpu: GpuProfile, tokens: float, costs: KernelCosts
) -> float:
    """Two residual-add + norms (read two hidden vectors, write two) and the SwiGLU (read two halves of
    the gate/up output, write one), in bf16."""
    norm_bytes = 2 * 4 * shape.hidden * UNQUANTIZED_BYTES * tokens
    swiglu_bytes = 3 * shape.intermediate * UNQUANTIZED_BYTES * tokens
    streamed = (norm_bytes + swiglu_bytes) / (
        costs.elementwise_bandwidth * gpu.bandwidth_bytes_per_s
    )
    return shape.layers * (
        ELEMENTWISE_KERNELS_PER_LAYER * costs.elementwise_fixed_us * US + streamed
    )


def _all_reduce_seconds(
    shape: EngineShape, gpu: GpuProfile, tokens: float, costs: KernelCosts
) -> float:
    if shape.tp == 1:
        return 0.0
    calls = 2 * shape.layers + 1
    return calls * all_reduce_seconds(
        tokens * shape.hidden * UNQUANTIZED_BYTES, shape.tp, gpu, costs
    )


def all_reduce_seconds(
    message_bytes: float, ranks: int, gpu: GpuProfile, costs: KernelCosts = HOPPER_TRTLLM
) -> float:
    """One all-reduce of `message_bytes` (bf16 activations) over `ranks` GPUs."""
    link = gpu.interconnect_bytes_per_s
    one_shot = (
        costs.one_shot_fixed_us + costs.one_shot_fixed_us_per_doubling * math.log2(ranks)
    ) * US + (ranks - 1) * message_bytes / (costs.one_shot_link * link)
    two_shot = costs.two_shot_fixed_us * US + 2 * (ranks - 1) / ranks * message_bytes / (
        costs.two_shot_link * link
    )
    return min(one_shot, two_shot)


# --- the steady state ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Cycle:
    """The steps in which every one of the B requests in flight runs once from prompt to last token."""

    steps: float
    mixed_steps: float  # steps that carry prompt tokens
    mixed: Step
    decode_only: Step
    seconds: float  # the whole cycle, every pipeline stage included
    prefill_bound: bool  # prompts need more steps than a request has tokens: requests queue


def steady_state(
    shape: EngineShape, gpu: GpuProfile, workload: Workload, costs: KernelCosts = HOPPER_TRTLLM
) -> Cycle:
    """The cycle of in-flight batching at `workload`: prompts spread over the steps (closed loop)."""
    b, isl, osl = _per_stage(workload, shape.pp)
    prompt_tokens = b * isl
    per_step = _prompt_budget(shape, b)
    steps = max(osl, prompt_tokens / per_step)
    # Each prompt enters in a step of its own while they are few; chunks of max_num_tokens otherwise.
    mixed_steps = min(steps, max(b, prompt_tokens / per_step))
    decoding = b * (osl - 1) / steps  # sequences that decode in a step
    context = isl + osl / 2  # mean cached tokens of a decoding sequence
    mixed = Step(decoding, b / mixed_steps, prompt_tokens / mixed_steps, context)
    decode_only = Step(decoding, 0.0, 0.0, context)
    seconds = (
        mixed_steps * step_time(shape, gpu, mixed, costs).total
        + (steps - mixed_steps) * step_time(shape, gpu, decode_only, costs).total
    )
    return Cycle(steps, mixed_steps, mixed, decode_only, seconds * shape.pp, steps > osl)


def _per_stage(workload: Workload, pp: int) -> tuple[float, int, int]:
    """Requests per micro-batch: each pipeline stage holds B / pp of them."""
    return max(1.0, workload.concurrency / pp), workload.input_len, max(1, workload.output_len)


def _prompt_budget(shape: EngineShape, decoding: float) -> float:
    """Prompt tokens a step takes beside `decoding` sequences (max_num_tokens bounds the step; chunked
    context splits a longer prompt over steps). At least one block, so a step always makes progress."""
    return max(shape.max_num_tokens - decoding, 64.0)


def first_token_seconds(
    shape: EngineShape,
    gpu: GpuProfile,
    workload: Workload,
    costs: KernelCosts = HOPPER_TRTLLM,
) -> float:
    """The steps that prefill one request's prompt beside the others' decode (chunks of the budget)."""
    b, isl, osl = _per_stage(workload, shape.pp)
    others = b - 1
    chunk = min(float(isl), _prompt_budget(shape, others))
    chunks = math.ceil(isl / chunk)
    step = Step(others, 1 / chunks, chunk, isl + osl / 2)
    return chunks * step_time(shape, gpu, step, costs).total * shape.pp


def estimate_performance(
    facts: ModelFacts,
    gpu: GpuProfile,
    plan: MemoryPlan,
    workload: Workload,
    costs: KernelCosts = HOPPER_TRTLLM,
) -> PerformanceEstimate:
    """TTFT, TPOT and output tokens/s of `plan`'s engine on `gpu` at `workload`."""
    shape = engine_shape(facts, plan)
    cycle = steady_state(shape, gpu, workload, costs)
    b, isl, osl = workload.concurrency, workload.input_len, max(1, workload.output_len)
    tpot = cycle.seconds / cycle.steps
    decode = step_time(shape, gpu, Step(max(1.0, b / shape.pp), context=isl + osl / 2), costs)
    prefill = first_token_seconds(shape, gpu, workload, costs)
    # A request waits for the step in flight, then runs its own; past the prefill bound it queues.
    queue = max(0.0, cycle.steps - osl) * tpot
    ttft = tpot + prefill + queue
    tokens_per_s = b * osl / cycle.seconds
    return PerformanceEstimate(
        concurrency=b,
        input_len=isl,
        output_len=osl,
        ttft_ms=ttft * 1e3,
        tpot_ms=tpot * 1e3,
        output_tokens_per_s=tokens_per_s,
        output_tokens_per_s_per_gpu=tokens_per_s / (shape.tp * shape.pp),
        request_latency_ms=(ttft + (osl - 1) * tpot) * 1e3,
        decode_step_ms=decode.total * shape.pp * 1e3,
        prefill_step_ms=prefill * 1e3,
        limited_by=_limit(decode, cycle),
        decode_step_terms_ms=decode.to_ms(),
    )


def _limit(decode: StepTime, cycle: Cycle) -> str:
    if cycle.prefill_bound:
        return "prefill"
    if decode.compute_bound:
        return "compute"
    return "kv cache" if decode.attention > decode.linear else "weights"


def planned_concurrency(plan: MemoryPlan) -> int:
    """The requests the engine runs at once at its target lengths: max_batch_size, or fewer when the
    runtime's KV pool holds fewer requests of that size."""
    per_request = plan.target_input_len + plan.target_output_len
    pool = plan.runtime_kv_cache_tokens or plan.kv_cache_tokens
    return max(1, min(plan.max_batch_size, pool // per_request))


def estimate_for_plan(
    facts: ModelFacts,
    plan: MemoryPlan,
    concurrency: int | None = None,
    input_len: int | None = None,
    output_len: int | None = None,
) -> PerformanceEstimate:
    """The estimate of a memory plan's engine on its GPU, at `concurrency` requests in flight (default:
    planned_concurrency) of `input_len` + `output_len` tokens (default: the plan's target lengths)."""
    from toolkit.plan.gpus import get_gpu

    requests = concurrency if concurrency is not None else planned_concurrency(plan)
    workload = Workload(
        requests, input_len or plan.target_input_len, output_len or plan.target_output_len
    )
    return estimate_performance(facts, get_gpu(plan.gpu), plan, workload)
