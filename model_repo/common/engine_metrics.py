"""The tensorrtllm backend's Prometheus metric families, exported by the repository's Python engines.

Same family names, kinds, label keys and label values as the backend's custom metrics reporter
(tests/data/upstream/triton_backend.json, `custom_metrics_reporter.cc`), so routers and autoscalers
that read a GPU server (the Gateway API Inference Extension reads
nv_trt_llm_request_metrics{request_type="waiting"} and
nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type="fraction"}) read a CPU or synthetic one
the same way. Every series carries model and version labels, as the backend's do, and exists
from load on. Gauges are sent only when their value changes: each set is a round trip to Triton.

Requests mean what they mean in the backend (inflight_batcher_llm's stats from TensorRT-LLM's
executor): `active` is what the executor holds in its batch, at most max_batch_size (its max active
requests); requests beyond wait in the executor's queue, which no metric here counts; `scheduled` are
the active ones this step runs, and `waiting` = active - scheduled the active ones it could not
(no KV blocks, token budget). So a queue behind full batch slots reads active = scheduled =
max_batch_size and waiting 0, on every target: autoscalers must count it elsewhere (the API's
toolkit_api_requests_in_flight).
"""

from __future__ import annotations

import os
import time

# family -> (kind, label key, label values), in the backend's order.
GAUGES = {
    "nv_trt_llm_request_metrics": (
        "request_type",
        ("active", "max", "scheduled", "context", "waiting"),
    ),
    "nv_trt_llm_runtime_memory_metrics": ("memory_type", ("cpu", "gpu", "pinned")),
    "nv_trt_llm_kv_cache_block_metrics": (
        "kv_cache_block_type",
        ("max", "free", "used", "tokens_per", "reused", "fraction"),
    ),
    "nv_trt_llm_inflight_batcher_metrics": (
        "inflight_batcher_specific_metric",
        ("total_context_tokens", "generation_requests", "micro_batch_id", "paused_requests"),
    ),
    "nv_trt_llm_general_metrics": ("general_type", ("timestamp", "iteration_counter")),
}
COUNTERS = {
    "nv_trt_llm_disaggregated_serving_metrics": (
        "disaggregated_serving_type",
        ("kv_cache_transfer_ms", "request_count"),
    )
}
HISTOGRAMS = {
    "nv_llm_input_token_len": ("response_metric_type", "total_input_tokens"),
    "nv_llm_output_token_len": ("response_metric_type", "total_output_tokens"),
}
TOKEN_LEN_BUCKETS = [10, 50, 100, 500, 1000]
DESCRIPTIONS = {
    "nv_trt_llm_request_metrics": "TRT LLM request metrics",
    "nv_trt_llm_runtime_memory_metrics": "TRT LLM runtime memory metrics",
    "nv_trt_llm_kv_cache_block_metrics": "TRT LLM KV cache block metrics",
    "nv_trt_llm_inflight_batcher_metrics": "TRT LLM inflight_batcher-specific metrics",
    "nv_trt_llm_general_metrics": "General TRT LLM metrics",
    "nv_trt_llm_disaggregated_serving_metrics": "TRT LLM disaggregated serving metrics",
    "nv_llm_input_token_len": "TRT LLM response metrics",
    "nv_llm_output_token_len": "TRT LLM response metrics",
}


class EngineMetrics:
    """The families above, with this engine's model and version labels."""

    @classmethod
    def for_model(cls, pb_utils, params) -> EngineMetrics:
        """An engine model's metrics, sized from its config (params: common/params.py ModelParams): its
        max_batch_size and its KV cache's kv_cache_blocks of kv_block_size tokens."""
        return cls(
            pb_utils,
            model=params.model,
            version="1",
            max_batch_size=params.max_batch_size,
            kv_blocks=params.integer("kv_cache_blocks"),
            tokens_per_block=params.integer("kv_block_size"),
        )

    def __init__(
        self,
        pb_utils,
        *,
        model: str,
        version: str,
        max_batch_size: int,
        kv_blocks: int,
        tokens_per_block: int,
    ):
        family = pb_utils.MetricFamily
        labels = {"model": model, "version": version}
        self._families = []
        self.gauges: dict[tuple[str, str], object] = {}
        self.last: dict[tuple[str, str], float] = {}
        for name, (key, values) in GAUGES.items():
            group = family(name=name, description=DESCRIPTIONS[name], kind=family.GAUGE)
            self._families.append(group)  # a family must outlive its metrics
            for value in values:
                self.gauges[(name, value)] = group.Metric(labels={**labels, key: value})
        for name, (key, values) in COUNTERS.items():
            group = family(name=name, description=DESCRIPTIONS[name], kind=family.COUNTER)
            self._families.append(group)
            for value in values:
                group.Metric(labels={**labels, key: value})
        self.histograms = {}
        for name, (key, value) in HISTOGRAMS.items():
            group = family(name=name, description=DESCRIPTIONS[name], kind=family.HISTOGRAM)
            self._families.append(group)
            self.histograms[name] = group.Metric(
                labels={**labels, key: value}, buckets=TOKEN_LEN_BUCKETS
            )
        self.max_batch_size = max_batch_size
        self.kv_blocks = kv_blocks
        self.iterations = 0
        self._set("nv_trt_llm_kv_cache_block_metrics", "tokens_per", tokens_per_block)
        self.update(held=0, scheduled=0, context=0, used_blocks=0, context_tokens=0)

    def update(
        self,
        *,
        held: int,
        scheduled: int,
        context: int,
        used_blocks: int,
        context_tokens: int,
        iterations: int = 0,
        reused_blocks: int = 0,
    ) -> None:
        """One reading of the engine's state, as the backend reports each iteration's statistics.

        `held`: every request the engine holds (running, or queued for a batch slot); `scheduled`:
        those running this step. Reported as the backend does: active capped at max_batch_size.
        `reused_blocks`: KV blocks taken from the prefix cache since the engine started.
        """
        self.iterations += iterations
        active = min(held, self.max_batch_size)
        scheduled = min(scheduled, active)
        context = min(context, scheduled)
        request = "nv_trt_llm_request_metrics"
        for label, value in (
            ("active", active),
            ("max", self.max_batch_size),
            ("scheduled", scheduled),
            ("context", context),
            ("waiting", active - scheduled),
        ):
            self._set(request, label, value)
        kv = "nv_trt_llm_kv_cache_block_metrics"
        used = min(used_blocks, self.kv_blocks)
        for label, value in (
            ("max", self.kv_blocks),
            ("free", self.kv_blocks - used),
            ("used", used),
            ("reused", reused_blocks),  # cumulative, as TensorRT-LLM's KvCacheStats
            ("fraction", used / self.kv_blocks if self.kv_blocks else 0.0),
        ):
            self._set(kv, label, value)
        ifb = "nv_trt_llm_inflight_batcher_metrics"
        for label, value in (
            ("total_context_tokens", context_tokens),
            ("generation_requests", scheduled - context),
            ("micro_batch_id", 0),
            ("paused_requests", 0),
        ):
            self._set(ifb, label, value)
        self._set("nv_trt_llm_runtime_memory_metrics", "cpu", _resident_bytes())
        self._set("nv_trt_llm_general_metrics", "iteration_counter", self.iterations)
        # microseconds, as the backend
        self._set("nv_trt_llm_general_metrics", "timestamp", time.time_ns() // 1000)

    def request_finished(self, input_tokens: int, output_tokens: int) -> None:
        self.histograms["nv_llm_input_token_len"].observe(input_tokens)
        self.histograms["nv_llm_output_token_len"].observe(output_tokens)

    def _set(self, family: str, label: str, value: float) -> None:
        key = (family, label)
        if self.last.get(key) != value:
            self.last[key] = value
            self.gauges[key].set(value)


def _resident_bytes() -> int:
    """This process's resident memory (the backend reports its runtime's CPU memory), from /proc."""
    try:
        with open(f"/proc/{os.getpid()}/statm") as handle:
            return int(handle.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0
