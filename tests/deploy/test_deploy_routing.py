"""Routing and autoscaling: the endpoint picker and the KEDA triggers read metrics the engines
export under the TensorRT-LLM backend's own names, and their queries count the queue.
"""

from __future__ import annotations

import json
import sys

from toolkit.api.metrics import ApiMetrics
from toolkit.repository.reader import open_repository

from chart import (
    DATA,
    NAMESPACE,
    RELEASE,
    deploy,
    engine_specs,
    epp_config,
    find,
    render,
    server_deployment,
)
from k8s_checks import GIE, TARGET_LABELS, rule_selectors
from promql import promql_selectors, promql_value


# --- the metrics the rules read -------------------------------------------------------------------
def test_the_endpoint_picker_reads_the_backend_metric_names_it_knows_for_triton(gpu_render):
    repo, _, docs, _ = gpu_render
    config = epp_config(docs)
    builtin = GIE["builtin_engine_configs"]["triton-tensorrt-llm"]
    assert engine_specs(config) == {k: v for k, v in builtin.items() if k.endswith("Spec")}
    prefix = next(p for p in config["plugins"] if p["type"] == "prefix-cache-scorer")["parameters"]
    # the KV pool the prefix index mirrors, in blocks of tokens
    limits = open_repository(repo).limits
    assert (prefix["blockSizeTokens"], prefix["lruCapacityPerServer"]) == (
        limits.kv_block_size,
        limits.kv_cache_blocks,
    )
    pods = server_deployment(docs)["spec"]["template"]["metadata"]["labels"]
    assert pods[GIE["engine_label_key"]] == "triton-tensorrt-llm"


def test_rule_metrics_are_the_tensorrt_llm_backends_own_names(gpu_render):
    """Against the independent record of the backend at the pinned revision (tests/data/upstream)."""
    record = json.loads((DATA / "upstream" / "triton_backend.json").read_text())["revisions"][
        "c2e65b8"
    ]["metrics"]
    selectors = rule_selectors(gpu_render[2])
    assert {m for _, m, _ in selectors} == {
        "nv_trt_llm_request_metrics",
        "nv_trt_llm_kv_cache_block_metrics",
        "toolkit_api_requests_in_flight",
    }
    api = {
        sample.name: (family.type, set(family.samples[0].labels) if family.samples else set())
        for family in ApiMetrics().registry.collect()
        for sample in family.samples
    }
    for where, metric, labels in selectors:
        exporter = {k: v for k, v in labels.items() if k not in TARGET_LABELS}
        # the API's own gauge, scraped through the `http` endpoint
        if metric.startswith("toolkit_api_"):
            assert metric in api and api[metric][0] == "gauge", where
            assert set(exporter) <= api[metric][1], where
            continue
        family = record["families"][metric]
        assert family["kind"] == "gauge", where
        assert exporter.pop(family["category"]) in record["vectors"][family["labels"]], where
        assert set(exporter) <= set(record["labels_on_every_metric"]), where


class _FakeFamily:
    """pb_utils.MetricFamily, enough to read what the engines' metrics set."""

    GAUGE, COUNTER, HISTOGRAM = "gauge", "counter", "histogram"

    def __init__(self, name: str, description: str, kind: str):
        self.name = name

    def Metric(self, labels: dict, buckets=None):  # noqa: N802 - pb_utils' name
        return _FakeMetric()


class _FakeMetric:
    value = None

    def set(self, value) -> None:
        self.value = value

    def observe(self, value) -> None:
        pass


def test_the_python_engines_report_requests_as_the_tensorrt_llm_backend_does():
    """The backend's `active` is what the executor holds in its batch (at most max_batch_size, its max
    active requests); requests beyond wait in the executor's queue, which Triton does not export, and
    `waiting` = active - scheduled counts only active requests not scheduled (KV blocks, token budget).
    The CPU and synthetic engines report the same, so the live tests see what a GPU replica shows."""
    import types

    from toolkit.repository.sources import model_repo_sources

    sys.path.insert(0, str(model_repo_sources() / "common"))
    from engine_metrics import EngineMetrics

    pb_utils = types.SimpleNamespace(MetricFamily=_FakeFamily)
    metrics = EngineMetrics(
        pb_utils,
        model="tensorrt_llm",
        version="1",
        max_batch_size=2,
        kv_blocks=16,
        tokens_per_block=8,
    )

    def requests() -> dict:
        return {
            label: gauge.value
            for (family, label), gauge in metrics.gauges.items()
            if family == "nv_trt_llm_request_metrics"
        }

    # Six requests held: both slots run, four queue for a slot.
    metrics.update(held=6, scheduled=2, context=0, used_blocks=4, context_tokens=0)
    assert requests() == {"active": 2, "max": 2, "scheduled": 2, "context": 0, "waiting": 0}
    # Both slots taken, one of them not scheduled this step (no KV block for it): the backend's waiting.
    metrics.update(held=3, scheduled=1, context=0, used_blocks=16, context_tokens=0)
    assert requests() == {"active": 2, "max": 2, "scheduled": 1, "context": 0, "waiting": 1}


# --- autoscaling on the queue ---------------------------------------------------------------------
def test_autoscaling_scales_on_the_apis_requests_in_flight_and_on_queueing(
    helm, gpu_render, cpu_repo, tmp_path
):
    """The TensorRT-LLM backend's `active` is capped at max_batch_size (the executor's max active
    requests) and `waiting` = active - scheduled: requests queued beyond the batch slots show in
    neither, so a trigger on scheduled + waiting never exceeds max_batch_size. The load signal is the
    API's own gauge of admitted requests; the saturation signal is those the engine is not running."""
    repo, values, docs, _ = gpu_render
    triggers = {t["name"]: t for t in find(docs, "ScaledObject")["spec"]["triggers"]}
    assert set(triggers) == {"requests-in-flight", "waiting-requests", "kv-cache-use"}
    load = triggers["requests-in-flight"]["metadata"]
    assert [m for m, _ in promql_selectors(load["query"])] == ["toolkit_api_requests_in_flight"]
    batch = open_repository(repo).limits.max_batch_size
    # scale-up starts (+10 % HPA tolerance) before a request queues
    default = max(1, int(batch * 0.8))
    assert load["threshold"] == str(default) == str(values["autoscaling"]["concurrencyPerReplica"])
    queued = triggers["waiting-requests"]["metadata"]["query"]
    assert [(m, labels.get("request_type")) for m, labels in promql_selectors(queued)] == [
        ("toolkit_api_requests_in_flight", None),
        ("nv_trt_llm_request_metrics", "scheduled"),
    ]
    assert 'request_type="waiting"' not in json.dumps(find(docs, "ScaledObject"))
    deploy(cpu_repo, tmp_path / "d", "--max-replicas", "4", "--concurrency-per-replica", "6")
    scaled = find(render(helm, tmp_path / "d"), "ScaledObject")["spec"]["triggers"]
    assert (
        next(t for t in scaled if t["name"] == "requests-in-flight")["metadata"]["threshold"] == "6"
    )


def test_a_target_the_apis_cap_never_lets_the_fleet_reach_is_refused(cpu_repo, tmp_path):
    """Requests in flight per replica stop at the API's cap (429 past it, and the picker sends a full
    replica nothing), and the HPA acts 10 % past its target: a target at or near the cap never adds a
    replica (toolkit deploy wrote such a target and exited 0, the fleet sitting at its floor answering
    429s). Refused, naming both values and the largest target that scales, and nothing is written."""
    from chart import IMAGE, invoke, write_values

    def run(out, *args):
        return invoke("deploy", "--repo", cpu_repo, "-o", tmp_path / out, "--image", IMAGE, *args)

    cap = deploy(cpu_repo, tmp_path / "d", "--max-replicas", "4")["api"]["maxInFlight"]
    highest = max(t for t in range(1, cap) if t * 1.1 < cap)
    for target in (cap + 80, cap, highest + 1):
        result = run(
            f"over{target}", "--max-replicas", "4", "--concurrency-per-replica", str(target)
        )
        assert result.exit_code == 1, (target, result.output)
        assert f"--concurrency-per-replica {target}" in result.output
        assert f"api.maxInFlight={cap}" in result.output
        assert f"pass --concurrency-per-replica {highest} or less" in result.output
        assert not (tmp_path / f"over{target}").exists()
    assert (
        run("ok", "--max-replicas", "4", "--concurrency-per-replica", str(highest)).exit_code == 0
    )
    # a cap a cluster file lowers is held against the default target (0.8 x the slots), and named
    small = write_values(tmp_path / "small.yaml", {"api": {"maxInFlight": 10}})
    result = run("small", "--max-replicas", "4", "-f", small)
    assert result.exit_code == 1 and f"api.maxInFlight=10 in {small}" in result.output
    assert "pass --concurrency-per-replica 9 or less" in result.output
    # without autoscaling there is no target to reach
    assert run("fixed", "-f", small).exit_code == 0


def test_the_triggers_see_requests_queued_beyond_the_batch_slots(gpu_render):
    """The rendered queries over what a GPU replica exports when its batch slots are full and 300
    more requests queue: the backend's gauges say `active` = scheduled = max_batch_size and `waiting`
    0; the API's gauge says max_batch_size + 300. A lightly loaded replica must not hide the queue."""
    repo, _, docs, _ = gpu_render
    batch = open_repository(repo).limits.max_batch_size
    monitor = find(docs, "PodMonitor", RELEASE)
    namespace, job = monitor["metadata"]["namespace"], f"{NAMESPACE}/{monitor['metadata']['name']}"
    series = []
    # b: streams just ended in the API
    for pod, in_flight, scheduled in (
        ("a", batch + 300, batch),
        ("b", 3, 5),
    ):
        target = {"namespace": namespace, "job": job, "pod": pod}
        series.append(("toolkit_api_requests_in_flight", {**target, "container": "api"}, in_flight))
        for kind, value in (("active", scheduled), ("scheduled", scheduled), ("waiting", 0)):
            labels = {**target, "model": "tensorrt_llm", "version": "1", "request_type": kind}
            series.append(("nv_trt_llm_request_metrics", {**labels, "container": "triton"}, value))
    triggers = {t["name"]: t["metadata"] for t in find(docs, "ScaledObject")["spec"]["triggers"]}
    assert promql_value(triggers["requests-in-flight"]["query"], series) == batch + 303
    assert promql_value(triggers["waiting-requests"]["query"], series) == 300
    # no series: fallback
    assert promql_value(triggers["waiting-requests"]["query"], series[:0]) is None


def test_a_pipeline_parallel_replica_is_not_taken_for_a_queued_one(helm, gpu_render, tmp_path):
    """With pp stages the engine runs max_batch_size x pp requests (one micro-batch per stage) and
    reports `scheduled` for the last micro-batch only: a replica running 2 x B requests and queueing
    none must read 0 queued, and the default target must count every stage's slots."""
    repo, values, _, _ = gpu_render
    batch = open_repository(repo).limits.max_batch_size
    out = tmp_path / "d"
    deploy(repo, out, "--min-replicas", "2", "--max-replicas", "8")
    docs = render(helm, out, extra=("--set", "model.pipelineStages=2"))
    monitor = find(docs, "PodMonitor", RELEASE)
    target = {
        "namespace": monitor["metadata"]["namespace"],
        "job": f"{NAMESPACE}/{monitor['metadata']['name']}",
        "pod": "a",
    }
    series = [("toolkit_api_requests_in_flight", {**target, "container": "api"}, 2 * batch)]
    labels = {**target, "model": "tensorrt_llm", "version": "1", "container": "triton"}
    series.append(("nv_trt_llm_request_metrics", {**labels, "request_type": "scheduled"}, batch))
    triggers = {t["name"]: t["metadata"] for t in find(docs, "ScaledObject")["spec"]["triggers"]}
    assert promql_value(triggers["waiting-requests"]["query"], series) == 0
    series[0] = (*series[0][:2], 2 * batch + 7)
    assert promql_value(triggers["waiting-requests"]["query"], series) == 7
    from toolkit.deploy import sizing

    repository = open_repository(repo)
    assert sizing.concurrency_per_replica(repository, 2) == int(2 * batch * sizing.SLOTS_TARGET)
    assert values["model"]["pipelineStages"] == 1  # this engine: TP 2, PP 1
