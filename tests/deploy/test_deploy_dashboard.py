"""The Grafana dashboard shipped with the chart (deploy/dashboards/toolkit.json): a dashboard Grafana
loads, whose every query reads metrics that exist, by the names and labels their exporters give them:
the API's own registry, the TensorRT-LLM backend's record (tests/data/upstream/triton_backend.json,
exported by every target's engine), and the endpoint picker's record (tests/data/k8s/...v1.5.0.json).
"""

from __future__ import annotations

import json
import re

from prometheus_client.metrics import MetricWrapperBase

from toolkit.api.metrics import ApiMetrics

from chart import DATA, NAMESPACE, RELEASE, deploy, find, render
from k8s_checks import GIE, TARGET_LABELS
from promql import promql_selectors

DASHBOARD = json.loads((DATA.parent.parent / "deploy" / "dashboards" / "toolkit.json").read_text())
BACKEND = json.loads((DATA / "upstream" / "triton_backend.json").read_text())["revisions"][
    "c2e65b8"
]["metrics"]
PANEL_TYPES = {"timeseries", "stat", "gauge", "table", "bargauge"}
# What the issue asks the dashboard to show, each by a word its panels' titles must carry.
TOPICS = ("queue", "KV", "first token", "Inter-token", "tokens/s", "in flight", "429", "picker")


def _api_series() -> dict[str, set[str]]:
    """Every series name the API exports (counters as _total, histograms' _bucket/_sum/_count) -> labels.
    A labelled family with no child yet has no samples, so its label names come from the metric."""
    names: dict[str, set[str]] = {}
    for metric in vars(ApiMetrics()).values():
        if not isinstance(metric, MetricWrapperBase):
            continue
        family = next(iter(metric.describe()))
        labels = set(metric._labelnames)  # prometheus_client keeps them only here
        suffixes = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count")}.get(
            family.type, ("",)
        )
        for suffix in suffixes:
            names[family.name + suffix] = labels | ({"le"} if suffix == "_bucket" else set())
    return names


def _backend_series() -> dict[str, set[str]]:
    out = {}
    for name, family in BACKEND["families"].items():
        out[name] = {family["category"], *BACKEND["labels_on_every_metric"]}
    return out


def _epp_series() -> dict[str, set[str]]:
    out = {}
    for name, family in GIE["epp_metrics"]["families"].items():
        suffixes = ("_bucket", "_sum", "_count") if family["kind"] == "histogram" else ("",)
        for suffix in suffixes:
            out[name + suffix] = set(family["labels"]) | ({"le"} if suffix == "_bucket" else set())
    return out


KNOWN = {**_api_series(), **_backend_series(), **_epp_series()}


def _queries(dashboard: dict) -> list[tuple[str, str]]:
    return [(p["title"], t["expr"]) for p in dashboard["panels"] for t in p["targets"]]


def test_the_dashboard_is_one_grafana_loads():
    assert DASHBOARD["uid"] and DASHBOARD["title"] and DASHBOARD["schemaVersion"] >= 36
    variables = {v["name"]: v for v in DASHBOARD["templating"]["list"]}
    assert (
        variables["datasource"]["type"] == "datasource"
        and variables["datasource"]["query"] == "prometheus"
    )
    assert {"namespace", "release"} <= set(variables)
    ids = [p["id"] for p in DASHBOARD["panels"]]
    assert len(ids) == len(set(ids))
    for panel in DASHBOARD["panels"]:
        assert panel["type"] in PANEL_TYPES, panel["title"]
        grid = panel["gridPos"]
        assert grid["x"] >= 0 and grid["x"] + grid["w"] <= 24 and grid["h"] > 0, panel["title"]
        assert panel["datasource"]["uid"] == "${datasource}"
        refs = [t["refId"] for t in panel["targets"]]
        assert refs and len(refs) == len(set(refs)), panel["title"]
    # no two panels on one spot of the grid
    cells = set()
    for panel in DASHBOARD["panels"]:
        g = panel["gridPos"]
        mine = {
            (x, y) for x in range(g["x"], g["x"] + g["w"]) for y in range(g["y"], g["y"] + g["h"])
        }
        assert not cells & mine, panel["title"]
        cells |= mine


def test_it_shows_what_an_operator_asks_of_a_fleet():
    titles = " ".join(p["title"] for p in DASHBOARD["panels"])
    for topic in TOPICS:
        assert topic.lower() in titles.lower(), topic


def test_every_query_reads_metrics_and_labels_that_exist():
    for title, expr in _queries(DASHBOARD):
        assert expr.count("(") == expr.count(")"), (title, expr)
        selectors = promql_selectors(expr)
        # every metric is written with a selector (a bare name would escape this check)
        bare = set(re.findall(r"\b(toolkit_api_\w+|nv_\w+|inference_\w+)\b(?!\{)", expr))
        assert not bare, (title, bare)
        assert selectors, (title, expr)
        for metric, labels in selectors:
            assert metric in KNOWN, (title, metric)
            exported = set(labels) - set(TARGET_LABELS)
            assert exported <= KNOWN[metric], (title, metric, exported - KNOWN[metric])
            # each release's series, as the chart's PodMonitors label them
            assert labels.get("job") in ("$namespace/$release", "$namespace/$release-epp"), (
                title,
                metric,
            )
            picker = metric.startswith("inference_")
            assert labels["job"].endswith("-epp") == picker, (title, metric)
        for grouped in re.findall(r"by \(([^)]*)\)", expr):
            for label in (g.strip() for g in grouped.split(",")):
                owners = [m for m, _ in selectors]
                assert any(label in KNOWN[m] | set(TARGET_LABELS) for m in owners), (title, label)


def test_the_release_variable_lists_the_releases_the_api_metrics_come_from():
    """The panels select `job="$namespace/$release"` (the chart's PodMonitor); the variable offers every
    release whose API is scraped in the namespace, by that job's name after the namespace."""
    release = {v["name"]: v for v in DASHBOARD["templating"]["list"]}["release"]
    assert release["type"] == "query" and release["datasource"]["uid"] == "${datasource}"
    query = release["query"]["query"]
    assert query.startswith("label_values(") and query.endswith(", job)")
    [(metric, labels)] = promql_selectors(query)
    assert metric in _api_series() and labels == {"namespace": "$namespace"}
    pattern = re.compile(
        release["regex"].strip("/").replace("\\/", "/")
    )  # Grafana's /.../ JS regex
    assert pattern.fullmatch(f"{NAMESPACE}/{RELEASE}").group(1) == RELEASE
    assert pattern.fullmatch(f"{NAMESPACE}/tiny-model").group(1) == "tiny-model"


def _shipped(docs: list[dict], release: str) -> dict:
    configmap = find(docs, "ConfigMap", f"{release}-dashboard")
    assert configmap["metadata"]["labels"]["grafana_dashboard"] == "1"
    return json.loads(configmap["data"]["toolkit.json"])


def test_the_chart_ships_it_as_a_configmap_grafanas_sidecar_loads(helm, cpu_repo, tmp_path):
    deploy(cpu_repo, tmp_path / "d")
    on = ("--set", "monitoring.grafanaDashboard.enabled=true")
    board = _shipped(render(helm, tmp_path / "d", extra=on), RELEASE)
    # the file as it is, but for what makes it this release's (the next test)
    for key in ("uid", "title"):
        board[key] = DASHBOARD[key]
    for variable in board["templating"]["list"]:
        variable.pop("current", None)
    assert board == DASHBOARD
    assert not [
        d for d in render(helm, tmp_path / "d") if d["metadata"]["name"].endswith("-dashboard")
    ]


def test_each_release_ships_a_dashboard_of_its_own_that_opens_on_it(helm, cpu_repo, tmp_path):
    """The dashboard's release was a constant, `llm` (these tests' release name): under any other name
    every panel was empty, and every release's dashboard had one uid, of which Grafana keeps one."""
    deploy(cpu_repo, tmp_path / "d")
    on = ("--set", "monitoring.grafanaDashboard.enabled=true")
    uids = set()
    for release, namespace in ((RELEASE, NAMESPACE), ("tiny-model", NAMESPACE), (RELEASE, "other")):
        docs = render(helm, tmp_path / "d", extra=on, release=release, namespace=namespace)
        board = _shipped(docs, release)
        chosen = {v["name"]: v.get("current", {}).get("value") for v in board["templating"]["list"]}
        assert (chosen["namespace"], chosen["release"]) == (namespace, release)
        assert board["title"] == f"{DASHBOARD['title']} ({namespace}/{release})"
        assert re.fullmatch(r"[A-Za-z0-9_-]{1,40}", board["uid"]), board["uid"]  # Grafana's uid
        uids.add(board["uid"])
    assert len(uids) == 3
