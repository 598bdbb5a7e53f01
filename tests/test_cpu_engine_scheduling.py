"""The CPU engine's scheduler fix, on transformers' real continuous-batching manager (no server).

A KV cache too small for two long requests makes transformers offload one of them and block new
requests until a running one finishes. If the running one is cancelled instead (what the engine does
for a client that goes away, a stop word, end_id under min_tokens), stock transformers 5.24 never
schedules again. model_repo/tensorrt_llm_cpu/1/scheduling.py clears the block on cancellation too.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

sys.path.insert(
    0, str(Path(__file__).resolve().parents[1] / "model_repo" / "tensorrt_llm_cpu" / "1")
)
from tiny import engine_batching, tiny_llama_config  # noqa: E402


@pytest.fixture()
def manager():
    import torch
    from transformers import GenerationConfig, LlamaForCausalLM

    from scheduling import unblock_after_cancellation

    unblock_after_cancellation()
    torch.manual_seed(0)
    config = tiny_llama_config(
        100,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
    )
    model = LlamaForCausalLM(config).float().eval()
    model.config._attn_implementation = "sdpa"
    # Sampling processors on, as in the engine; every request below overrides them to greedy (top_k=1).
    generation = GenerationConfig(
        do_sample=True, temperature=0.5, top_k=100, top_p=0.5, max_new_tokens=8, eos_token_id=-1
    )
    # 12 blocks of 16 tokens: two requests of 40 + 120 tokens cannot both stay resident.
    cb = engine_batching(model, generation, max_batch_tokens=64, num_blocks=12, page_size=16)
    yield cb
    cb.stop(block=True, timeout=10, hard_stop=True)


def test_cancelling_the_running_requests_after_an_offload_does_not_stall_the_engine(
    manager, monkeypatch
):
    from transformers.generation.continuous_batching import offloading_manager

    offloaded = {}
    original = offloading_manager.OffloadingManager.offload_requests

    def offload_and_cancel_the_rest(self):
        result = original(self)
        if self.scheduler.block_new_requests and not offloaded:
            # The cache ran full: cancel every request still running, as clients that go away would.
            offloaded["running"] = list(self.scheduler.active_requests)
            offloaded["waiting"] = list(self.scheduler.waiting_requests)
            for request_id in offloaded["running"]:
                manager.cancel_request(request_id)
        return result

    monkeypatch.setattr(
        offloading_manager.OffloadingManager, "offload_requests", offload_and_cancel_the_rest
    )
    manager.start()
    greedy = dict(streaming=True, eos_token_id=-1, temperature=1.0, top_k=1, top_p=1.0)
    for name in ("A", "B"):
        manager.add_request(
            [(7 * i + ord(name)) % 97 + 1 for i in range(40)],
            request_id=name,
            max_new_tokens=120,
            **greedy,
        )

    finished, added_c = set(), False
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        result = manager.get_result(timeout=0.05)
        if result is not None and result.is_finished():
            finished.add(result.request_id)
        if offloaded and not added_c:
            manager.add_request([1, 2, 3], request_id="C", max_new_tokens=4, **greedy)
            added_c = True
        if added_c and set(offloaded["waiting"]) | {"C"} <= finished:
            break

    assert offloaded, "the cache never ran full: the test did not reach the offload it checks"
    assert manager.background_thread_status.fatal_error is None
    assert set(offloaded["waiting"]) | {"C"} <= finished, (
        f"stalled: finished {finished}, offloaded {offloaded}"
    )
