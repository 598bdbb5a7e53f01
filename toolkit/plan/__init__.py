"""GPU profiles and the memory / roofline planner.

Public:
    get_gpu(name) -> GpuProfile; GPU_PROFILES
    plan_memory(facts, gpu, *, model, dtype, kv_dtype, tp, pp, max_seq_len, max_input_len,
                max_batch_size, max_num_tokens, target_input_len, target_output_len) -> MemoryPlan
        (tp=None: the smallest that fits; PlanError if nothing fits)
    compute_plan(...) -> MemoryPlan   (same numbers, never refuses; .fits says)
    load_model_for_plan(spec) -> PlannedModel   (config.json only, no weights)
Precisions are declared in toolkit.plan.precisions; model arithmetic in toolkit.model.architectures.
"""

from toolkit.plan.gpus import GPU_PROFILES, GpuProfile, get_gpu
from toolkit.plan.memory import MemoryPlan, compute_plan, plan_memory
from toolkit.plan.source import PlannedModel, load_model_for_plan

__all__ = [
    "GPU_PROFILES",
    "GpuProfile",
    "MemoryPlan",
    "PlannedModel",
    "compute_plan",
    "get_gpu",
    "load_model_for_plan",
    "plan_memory",
]
