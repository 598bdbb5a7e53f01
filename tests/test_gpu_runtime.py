"""What the tensorrtllm backend is told about the KV pool and the batch, against the backend's own
sources (tests/data/upstream/triton_backend.json, revision c2e65b8: the pinned release's backend)."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from toolkit.build import BuildRequest, plan_build
from toolkit.repository.configs import parse_pbtxt, to_pbtxt
from toolkit.repository.limits import RepositoryLimits
from toolkit.targets.gpu import TrtllmEngine

UPSTREAM = json.loads(
    (Path(__file__).parent / "data" / "upstream" / "triton_backend.json").read_text()
)["revisions"]["c2e65b8"]["executor_config"]
RECIPE_70B_FP8 = "llama-3.1-70b-instruct-h100-sxm-fp8"  # no TP: the smallest that fits, 1


def _planned(**settings):
    return plan_build(BuildRequest.make(recipe=RECIPE_70B_FP8, **settings)).planned


def _engine_parameters(planned) -> dict[str, str]:
    runtime = planned.engine_build.runtime.to_dict()
    engine = TrtllmEngine(
        "h100-sxm", "/engines/x", "0.20.0", planned.memory.max_batch_size, 1, runtime
    )
    plan = SimpleNamespace(
        limits=RepositoryLimits.from_memory_plan(planned.memory),
        decoupled=True,
        output=Path("/repository"),  # where the guided-decoding tokenizer info is written
        adapters=(),  # no LoRA
    )
    parsed = parse_pbtxt(to_pbtxt(engine.config(plan)))
    return {key: value.string_value for key, value in parsed.parameters.items()}


def test_the_kv_token_cap_is_left_to_the_runtime_which_sizes_the_pool_from_its_free_memory():
    """The backend takes the smaller of max_tokens_in_paged_kv_cache and its free-memory share: a cap
    from the planner (which already held memory back) capped the pool twice. The parameter is optional
    upstream (absent: no cap)."""
    assert UPSTREAM["max_tokens_in_paged_kv_cache"]["optional"] is True
    planned = _planned()
    params = _engine_parameters(planned)
    assert "max_tokens_in_paged_kv_cache" not in params
    assert planned.engine_build.runtime.max_tokens_in_paged_kv_cache is None
    assert params["kv_cache_free_gpu_mem_fraction"] == "0.9"


def test_the_plan_states_the_planned_pool_and_what_the_runtime_will_take():
    """70B FP8 on one H100: 72.7 GB of weights on 85.5 GB. The planner's pool holds 10 % of the card
    back (26,304 tokens); the runtime takes its fraction of what the engine leaves free, ~45k tokens."""
    memory = _planned().memory
    assert memory.tp_size == 1 and memory.kv_cache_tokens == 26_304
    free = memory.gpu_memory_bytes - memory.weights_bytes_per_gpu - memory.runtime_reserve_bytes
    expected = int(0.9 * free) // memory.kv_bytes_per_token_per_gpu // 64 * 64
    assert memory.runtime_kv_cache_tokens == expected
    assert 40_000 <= memory.runtime_kv_cache_tokens <= 50_000
    # the runtime's own memory: CUDA context and workspaces, activations for max_num_tokens, logits
    assert 3.5 * 2**30 < memory.runtime_reserve_bytes < memory.activation_reserve_bytes


def test_a_recipe_free_memory_fraction_changes_the_pool_the_runtime_takes():
    low, high = _planned().memory, _planned(kv_cache_free_gpu_mem_fraction=0.95).memory
    assert high.runtime_kv_cache_tokens > low.runtime_kv_cache_tokens
    assert high.runtime_kv_cache_tokens / low.runtime_kv_cache_tokens == pytest.approx(
        0.95 / 0.9, rel=0.01
    )
    assert (
        _engine_parameters(_planned(kv_cache_free_gpu_mem_fraction=0.95))[
            "kv_cache_free_gpu_mem_fraction"
        ]
        == "0.95"
    )


@pytest.mark.parametrize(
    ("model", "dtype", "tp", "lengths"),
    [
        ("llama-3.1-8b-instruct", "fp8", 1, (1024, 512)),
        ("llama-3.1-8b-instruct", "bf16", 1, (128, 128)),
        ("llama-3.1-70b-instruct", "fp8", 1, (1024, 512)),
        ("llama-3.1-70b-instruct", "fp8", 4, (2048, 2048)),
        ("qwen2.5-7b-instruct", "bf16", 2, (1024, 512)),
    ],
)
def test_the_batch_is_what_the_runtime_pool_holds_since_the_backend_has_no_batch_tuner(
    model, dtype, tp, lengths
):
    """trtllm-bench rounds its batch up past what the KV pool holds (768 for ~674 requests of 1024 + 512
    tokens, 8B FP8) because its runtime tunes the batch; the pinned backend builds its scheduler from
    the policy alone and runs the engine's max_batch_size. So the plan's batch is what the runtime's
    pool holds at the target lengths."""
    assert UPSTREAM["scheduler_config"]["constructed_with"] == ["capacity_scheduler_policy"]
    assert "std::nullopt" in UPSTREAM["runtime_batch_limits"]["note"]
    isl, osl = lengths
    request = BuildRequest.make(
        model=model, target="h100-sxm", dtype=dtype, kv_dtype=dtype, tp=tp,
        target_input_len=isl, target_output_len=osl, calib_gpus=max(tp, 2),
    )  # fmt: skip
    memory = plan_build(request).planned.memory
    held = memory.runtime_kv_cache_tokens // (isl + osl)
    assert memory.max_batch_size <= held
    assert memory.max_batch_size >= min(held, 4096) - 8  # no more room left unused than a step of 8
    assert "runtime" in memory.batch_limits_from
